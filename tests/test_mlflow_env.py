"""MLflow's own conventions: MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME are the defaults of
tracking.uri and tracking.experiment (and of every tool that reads a store), and a fresh SQLite store
is created whole: two processes creating it at once both succeed, and a client that takes no lock
(`mlflow ui`, a notebook) never opens it halfway through MLflow's migrations."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import HANG, make_cfg

from deepen_run.config.schema import local_store
from deepen_run.errors import UserError
from deepen_run.tracking.connect import schema_version
from deepen_run.tracking.store import Tracker
from deepen_run.util import sqlite_path
import forkserver


def test_the_variables_are_the_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    cfg = make_cfg()
    assert (cfg.tracking.uri, cfg.tracking.experiment) == (local_store(), "deepen-run")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/x.db")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team")
    cfg = make_cfg()
    assert (cfg.tracking.uri, cfg.tracking.experiment) == (f"sqlite:///{tmp_path}/x.db", "team")
    cfg = make_cfg("tracking.uri=sqlite:///elsewhere.db", "tracking.experiment=mine")  # an override still wins
    assert (cfg.tracking.uri, cfg.tracking.experiment) == ("sqlite:///elsewhere.db", "mine")


def tool(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return forkserver.run([str(Path(sys.executable).with_name(args[0])), *args[1:]], timeout=HANG, env=env)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.fresh_store
def test_a_run_goes_where_the_variable_says_and_predict_finds_it(tmp_path, glue_dir):
    uri = f"sqlite:///{tmp_path}/team/x.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "team", "OMP_NUM_THREADS": "1"}
    r = tool(["deepen-run", "backbone=tiny", "task=rte", "train.max_steps=2", "train.batch_size=4",
              "data.max_train_samples=16", "data.max_eval_samples=16", "data.max_seq_length=32",
              "train.save_best=true", f"data.glue_dir={glue_dir}", f"hydra.run.dir={tmp_path}/run",
              f"data.cache_dir={tmp_path}/cache"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"tracking      from MLFLOW_TRACKING_URI ({uri}), MLFLOW_EXPERIMENT_NAME (team)" in r.stdout
    run_id = json.loads((tmp_path / "run" / "run.json").read_text())["run_id"]
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "team"
    assert sqlite_path(local_store()) != tmp_path / "team" / "x.db"
    # deepen-predict with the variable alone (no --tracking-uri) finds the run and its weights
    p = tool(["deepen-predict", "--run", run_id, "a fine film\tit is fine"], env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert len(p.stdout.strip().splitlines()) == 2  # header + one prediction
    # without the variable the default store is looked in: the run is not there
    bare = {k: v for k, v in env.items() if not k.startswith("MLFLOW_")}
    q = tool(["deepen-predict", "--run", run_id, "--tracking-uri", f"sqlite:///{tmp_path}/other.db", "x\ty"], bare)
    assert q.returncode == 2 and "no MLflow database" in q.stderr


RACER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    go = Path(sys.argv[2])
    while not go.exists():
        time.sleep(0.01)
    if sys.argv[3] == "deepen":
        from deepen_run.tracking.store import Tracker
        t = Tracker(sys.argv[1], "exp")
        t.check()
        print(t.experiment_id)
    else:  # a client of another program: plain MLflow, no lock, as soon as the file is there
        from mlflow.tracking import MlflowClient
        db = Path(sys.argv[1].removeprefix("sqlite:///"))
        while not db.exists():
            time.sleep(0.001)
        print(len(MlflowClient(sys.argv[1]).search_experiments()))
""")


@pytest.mark.subprocess
@pytest.mark.fresh_store
@pytest.mark.parametrize("second", ["deepen", "plain"])
def test_two_processes_creating_one_fresh_store_both_succeed(tmp_path, second):
    uri, go = f"sqlite:///{tmp_path}/fresh.db", tmp_path / "go"
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, str(script), uri, str(go), kind], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for kind in ("deepen", second)]
    go.touch()  # both start creating at once (their imports done)
    outs = [p.communicate(timeout=HANG) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    from mlflow.store.db.utils import _get_latest_schema_revision

    assert schema_version(tmp_path / "fresh.db") == _get_latest_schema_revision()
    assert [e.name for e in MlflowClient(uri).search_experiments() if e.name == "exp"] == ["exp"]
    assert not list(tmp_path.glob(".fresh.db.*"))  # no temporary file left beside it


def test_the_driver_is_named_only_when_it_is_missing(tmp_path):
    with pytest.raises(UserError, match="install its database driver"):
        Tracker("postgresql://u@127.0.0.1:1/db", "exp")  # psycopg2 is not installed here
    (tmp_path / "old.db").touch()
    import sqlite3

    con = sqlite3.connect(tmp_path / "old.db")  # a store of an older MLflow: its version table, outdated
    con.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
    con.execute("INSERT INTO alembic_version VALUES ('451aebb31d03')")
    con.commit()
    con.close()
    with pytest.raises(UserError) as e:
        Tracker(f"sqlite:///{tmp_path}/old.db", "exp")
    assert "install its database driver" not in str(e.value) and "cannot open the store" in str(e.value)
