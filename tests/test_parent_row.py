"""A sweep's parent row, collapsed in the runs table, shows the sweep (deepen_run/sweep/summary.py parent_tags):
the best child's score and how many runs it is of in `score`, the children's values in the other
default columns; deepen-report still leaves the parent out. A real MLflow store, read back with its
client."""
from __future__ import annotations

import json

from mlflow.tracking import MlflowClient

from deepen_run.report import main as report
from deepen_run.sweep import summary as sweep_summary
from deepen_run.tracking import ui
from deepen_run.tracking.store import Tracker


def child(uri, parent, seed, gru, acc, job, status="FINISHED"):
    t = Tracker(uri, "deepen-run")
    tags = {"mlflow.parentRunId": parent, "sweep_id": "s9", "sweep_role": "child", "sweep_job": str(job),
            "task": "rte", "method": "hire", "backbone": "tiny", "seed": str(seed), "dry_run": "false",
            "method.gru_layers": str(gru)}
    t.start(f"c{seed}{gru}", tags | ({"score": f"{acc:.4f}"} if status == "FINISHED" else {}))
    t.log_params({"method.name": "hire", "backbone.name": "tiny", "method.gru_layers": gru, "seed": seed})
    if status == "FINISHED":
        t.log_metrics({"eval/rte/accuracy": acc, "eval/score": acc}, 1)
    t.end(status)


def test_the_collapsed_parent_row_shows_the_best_score_and_the_childrens_values(mlflow_uri, tmp_path):
    params = {"method.gru_layers": "1,2", "seed": "1,2,10", "sweep.overrides": "method.gru_layers=1,2 seed=1,2,10"}
    tracker = Tracker(mlflow_uri, "deepen-run")
    parent = tracker.start("tiny hire rte | gru_layers=1,2 × seed=1,2,10", {"sweep_id": "s9", "sweep_role": "parent"})
    info = {"sweep_id": "s9", "parent_run_id": parent, "uri": mlflow_uri, "experiment": "deepen-run",
            "n_jobs": 6, "dir": str(tmp_path), "params": params}
    sweep_summary.start(info, tracker)
    for job, (seed, gru, acc, status) in enumerate([(10, 1, 0.5, "FINISHED"), (2, 1, 0.71234, "FINISHED"),
                                                    (1, 2, 0.6, "FINISHED"), (2, 2, 0.0, "FAILED")]):
        child(mlflow_uri, parent, seed, gru, acc, job, status)
    tracker.end("FINISHED")  # as a sweep whose failed job was run again: the parent matches the filter below
    sweep_summary.finish(info, tracker, "FINISHED", show_table=False)

    client = MlflowClient(mlflow_uri)
    tags = client.get_run(parent).data.tags
    assert tags["score"] == "best 0.7123 (3 of 6 runs)"  # a failed child has no score; 6 jobs were planned
    assert (tags["seed"], tags["method.gru_layers"]) == ("1,2,10", "1,2")  # numbers in numeric order
    assert (tags["method"], tags["task"], tags["backbone"], tags["dry_run"]) == ("hire", "rte", "tiny", "false")
    assert "variant" not in tags and "duplicate_layers" not in tags  # no child has them: the cell stays "-"
    # every one of them is a column the runs table opens with
    exp = client.get_experiment_by_name("deepen-run")
    shown = json.loads(exp.tags[ui.VIEW_TAG])["selectedColumns"]
    assert {f"tags.`{k}`" for k in ("score", "seed", "method.gru_layers", "method", "task", "backbone")} <= set(shown)
    # deepen-report's rows are the children's alone: the parent's tags do not make it a run of the table
    rows = report.build(report.load_runs(mlflow_uri, "deepen-run", {"task": "rte", "method": "hire"}))["rows"]
    assert sorted(r["n"] for r in rows) == [1, 2]  # gru_layers=2: one finished seed; =1: two
