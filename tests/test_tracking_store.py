"""The local MLflow store: set up once, batches of any size, the shared small helpers."""
from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from conftest import runs_of

from deepen_run.tracking import connect
from deepen_run.tracking.connect import create_schema_once, schema_version
from deepen_run.tracking.store import Tracker
from deepen_run.util import first_line, one_line, sqlite_path


def test_existing_store_is_not_probed_again(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert schema_version(sqlite_path(uri)) is None
    Tracker(uri, "exp")  # a fresh store: created under the lock
    assert schema_version(sqlite_path(uri)) is not None

    def no_mlflow(*a, **k):
        raise AssertionError("MLflow opened the store to set it up again")

    monkeypatch.setattr(connect, "MlflowClient", no_mlflow)  # the module that sets the store up
    create_schema_once(uri)  # the second start takes the cheap path


def test_a_file_that_is_not_a_store_is_left_to_mlflow(tmp_path):
    (tmp_path / "junk.db").write_text("not sqlite")
    assert schema_version(tmp_path / "junk.db") is None
    assert sqlite_path("http://127.0.0.1:5000") is None


def test_more_params_and_metrics_than_one_mlflow_batch(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri, "exp")
    run_id = tracker.start("r", {})
    tracker.log_params({f"p{i}": i for i in range(250)})  # MLflow's limit: 100 params a batch
    tracker.log_metrics({f"m{i}": float(i) for i in range(2500)}, step=3)  # and 1000 metrics
    data = MlflowClient(uri).get_run(run_id).data
    assert len(data.params) == 250 and data.params["p249"] == "249"
    assert len(data.metrics) == 2500 and data.metrics["m2499"] == 2499.0


def test_error_lines():
    assert one_line("a\n  b\n\nc ") == "a b c"
    assert first_line(ValueError("first\nsecond")) == "ValueError: first"
    assert first_line(KeyError()) == "KeyError: "
    assert len(first_line(RuntimeError("x" * 999), 50)) == 50


def _open_store(uri, experiment):
    t = Tracker(uri, experiment)
    t.start("r", {})
    t.end()


@pytest.mark.subprocess
def test_processes_opening_a_fresh_sqlite_store_at_once_do_not_race(tmp_path):
    # Without the schema lock, concurrent alembic migrations fail ("duplicate column name").
    import multiprocessing as mp

    uri = f"sqlite:///{tmp_path}/fresh.db"
    procs = [mp.get_context("fork").Process(target=_open_store, args=(uri, "race")) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    _, runs = runs_of(uri, "race")
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)


def test_metric_histories_dump_keeps_runs_of_one_name_apart(tmp_path):
    """scripts/metric_histories.py, the check that a refactor left results alone: two runs of one
    name (a command run twice in a store) are both dumped, in start order, neither overwriting."""
    import importlib.util

    from mlflow import MlflowClient

    from deepen_run.config.schema import ROOT

    spec = importlib.util.spec_from_file_location("metric_histories", ROOT / "scripts" / "metric_histories.py")
    histories = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(histories)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e")
    for value in (1.0, 2.0):
        run = client.create_run(exp, run_name="same").info.run_id
        client.log_metric(run, "eval/score", value, step=3)
    dumped = histories.dump(uri)
    assert dumped["e/same"]["eval/score"] == [[3, 1.0]] and dumped["e/same#2"]["eval/score"] == [[3, 2.0]]
    # A mistyped store is refused, not made empty (two empty dumps compared "bit-identical"), and two
    # dumps without a run are no check at all.
    import subprocess
    import sys

    script = [sys.executable, str(ROOT / "scripts" / "metric_histories.py")]
    r = subprocess.run([*script, "dump", f"sqlite:///{tmp_path}/typo.db"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "no such database" in r.stderr and not (tmp_path / "typo.db").exists()
    (tmp_path / "empty.json").write_text("{}")
    r = subprocess.run([*script, "compare", *[str(tmp_path / "empty.json")] * 2], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 2 and "nothing was compared" in r.stderr and "bit-identical" not in r.stdout
