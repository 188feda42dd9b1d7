"""Multiruns: one MLflow parent per sweep, a child per job, parallel jobs on SQLite, a failing job,
the results report. Tiny random BERT on real GLUE RTE files: the mechanics, not learning."""
import csv
import statistics

import pytest

from conftest import HANG, cli, runs_of
from deepen_run import report

TINY = ["task=rte", "backbone=tiny", "train.max_steps=2", "train.batch_size=8", "train.learning_rate=1e-3",
        "data.max_train_samples=32", "data.max_eval_samples=64", "data.max_seq_length=32"]


def split(runs):
    parents = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    children = [r for r in runs if r.data.tags.get("sweep_role") == "child"]
    return parents, sorted(children, key=lambda r: int(r.data.tags["sweep_job"]))


@pytest.fixture(scope="module")
def joblib_sweep(tmp_path_factory, glue_dir):
    tmp = tmp_path_factory.mktemp("joblib")
    uri = f"sqlite:///{tmp}/mlflow.db"  # fresh: the schema is created while two workers start
    r = cli("-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seed=1,2,3", *TINY,
            f"data.glue_dir={glue_dir}", f"tracking.uri={uri}", f"hydra.sweep.dir={tmp}/sweep")
    assert r.returncode == 0, r.stderr[-3000:]
    return uri, r, tmp


@pytest.mark.slow
def test_parallel_sweep_is_one_parent_with_a_finished_child_per_job(joblib_sweep):
    uri, r, _ = joblib_sweep
    client, runs = runs_of(uri)
    (parent,), children = split(runs)
    assert len(runs) == 4 and len(children) == 3
    assert parent.info.status == "FINISHED"
    sweep_id = parent.data.tags["sweep_id"]
    assert parent.data.tags["launcher"] == "JoblibLauncher"
    assert parent.data.params["seed"] == "1,2,3" and parent.data.params["sweep.jobs"] == "3"
    assert parent.data.metrics["sweep/finished"] == 3 and parent.data.metrics["sweep/failed"] == 0
    for k, c in enumerate(children):
        assert c.info.status == "FINISHED"
        assert c.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert c.data.tags["sweep_id"] == sweep_id and c.data.tags["sweep_job"] == str(k)
        assert c.data.tags["seed"] == str(k + 1)
        # Nothing lost to the concurrent writers: metrics, params and artifacts of every job.
        assert "eval/rte/accuracy" in c.data.metrics and "train/loss" in c.data.metrics
        assert c.data.params["train.max_steps"] == "2"
        assert {"config.yaml", "metrics.json", "predictions"} <= {a.path for a in client.list_artifacts(c.info.run_id)}
    assert "[job 1/3] started: seed=1" in r.stdout and "[job 3/3] FINISHED" in r.stdout
    assert "3/3 jobs FINISHED, 0 failed" in r.stdout
    assert "database is locked" not in r.stderr


@pytest.mark.slow
def test_report_cell_is_mean_and_std_of_the_children(joblib_sweep, capsys):
    uri, _, tmp = joblib_sweep
    client, runs = runs_of(uri)
    (parent,), children = split(runs)
    accs = [100 * c.data.metrics["eval/rte/accuracy"] for c in children]
    report.main(["--uri", uri, "--sweep-id", parent.data.tags["sweep_id"], "--out", str(tmp / "rep"),
                 "--log-to-parent"])
    md = capsys.readouterr().out
    row = next(ln for ln in md.splitlines() if ln.startswith("| tiny | baseline |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == f"{statistics.fmean(accs):.1f} ± {statistics.stdev(accs):.1f}"
    assert cells[-1] == "3"
    (rec,) = list(csv.DictReader(open(tmp / "rep" / "results.csv")))
    assert float(rec["rte"]) == pytest.approx(statistics.fmean(accs))
    assert float(rec["rte_std"]) == pytest.approx(statistics.stdev(accs))
    assert (tmp / "rep" / "results.png").stat().st_size > 0
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/results.md", "report/results.csv", "report/results.png"} <= logged


def _run(task, seed, metrics, **tags):
    return {"run_id": f"{task}{seed}", "status": "FINISHED", "params": {"method.pooling": "cls"}, "metrics": metrics,
            "tags": {"backbone": "minilm", "method": "baseline", "schedule": "sqrt", "task": task, "seed": str(seed)} | tags}


def test_report_rows_with_only_some_tasks():
    runs = [_run("rte", 1, {"eval/rte/accuracy": 0.60}), _run("rte", 2, {"eval/rte/accuracy": 0.70}),
            _run("mrpc", 1, {"eval/mrpc/accuracy": 0.80, "eval/mrpc/f1": 0.90}),
            _run("mrpc+stsb", 1, {"eval/mrpc/accuracy": 0.7, "eval/mrpc/f1": 0.8, "eval/stsb/pearson": 0.5,
                                  "eval/stsb/spearmanr": 0.7}),
            _run("rte", 3, {"eval/rte/accuracy": 0.1}) | {"status": "FAILED"},
            _run("rte", 4, {}, sweep_role="parent")]
    table = report.build(runs)
    assert table["tasks"] == ["mrpc", "stsb", "rte"]
    single, multi = table["rows"]  # sorted: schedule "-" first
    assert (single["schedule"], single["options"], single["n"]) == ("-", "-", 2)  # no option varies
    assert single["rte"]["mean"] == pytest.approx(65.0) and single["rte"]["std"] == pytest.approx(7.0711, abs=1e-3)
    assert single["mrpc"] == {"mean": pytest.approx(85.0), "std": None, "n": 1} and single["stsb"] is None
    # Average over the row's tasks; its spread only over seeds that have them all (seed 1 only here).
    assert single["avg"] == {"mean": pytest.approx(75.0), "std": None, "n": 1}
    assert multi["schedule"] == "sqrt" and multi["stsb"]["mean"] == pytest.approx(60.0) and multi["rte"] is None
    md = report.to_markdown(table)
    assert "| minilm | baseline | - | - | 85.0 (n=1) | - | 65.0 ± 7.1 | 75.0 | 2 |" in md


def test_report_names_only_the_options_that_vary():
    def hire(k, seed, acc):
        r = _run("rte", seed, {"eval/rte/accuracy": acc}, method="hire")
        return r | {"params": {"method.gru_layers": str(k), "method.pool": "cls"}}

    runs = [hire(1, 1, 0.6), hire(1, 2, 0.62), hire(3, 1, 0.7), _run("rte", 1, {"eval/rte/accuracy": 0.5})]
    rows = {(r["method"], r["options"]): r for r in report.build(runs)["rows"]}
    assert set(rows) == {("baseline", "-"), ("hire", "gru_layers=1"), ("hire", "gru_layers=3")}
    assert rows["hire", "gru_layers=1"]["n"] == 2 and rows["hire", "gru_layers=3"]["rte"]["mean"] == pytest.approx(70.0)


def _open_store(uri, experiment):
    from deepen_run.tracking import Tracker

    t = Tracker(uri, experiment)
    t.start("r", {})
    t.end()


@pytest.mark.slow
def test_processes_opening_a_fresh_sqlite_store_at_once_do_not_race(tmp_path):
    # Without the schema lock, concurrent alembic migrations fail ("duplicate column name").
    import multiprocessing as mp

    uri = f"sqlite:///{tmp_path}/fresh.db"
    procs = [mp.get_context("fork").Process(target=_open_store, args=(uri, "race")) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(HANG)
    assert [p.exitcode for p in procs] == [0, 0]
    _, runs = runs_of(uri, "race")
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)


def test_child_run_names_carry_the_swept_values():
    from deepen_run.sweep import SweepJob

    info = {"params": {"method.gru_layers": "1,2,3", "method.layers": "[2,3]", "seed": "1,2",
                       "train.learning_rate": "interval(1e-5, 1e-4)", "dry_run": "true"}}
    job = SweepJob(info | {"dir": "/tmp"}, 0, ["method.gru_layers=2", "method.layers=[2,3]", "seed=1",
                                             "train.learning_rate=3e-05", "dry_run=True"])
    # seed is in the default name already; a plain list value is not a sweep.
    assert job.swept() == ["gru_layers=2", "learning_rate=3e-05"]
