"""Reliability III (issue 30): a resumed run's result is the selected weights' score; cleanups never
follow a link or touch a file they did not write; secrets stay secret; bad input is one line."""
from __future__ import annotations

import pytest

from conftest import runs_of
from deepen_run.tracking.store import Tracker


def test_a_resumed_runs_final_record_wins_over_the_killed_attempts_last_step(tmp_path):
    """The killed attempt logged the last step's evaluation (0.46); the resumed attempt's
    model_selection=best re-evaluation at that same step (0.54) is the run's result in MLflow,
    while the loop's own re-logged evaluation of a step it already has is still dropped."""
    uri = f"sqlite:///{tmp_path}/m.db"
    first = Tracker(uri, "resume-best")
    run_id = first.start("r", {})
    first.log_metrics({"eval/score": 0.46, "train/loss": 0.7}, 12)
    first.end("KILLED")

    again = Tracker(uri, "resume-best")
    again.start("r", {}, run_id=run_id)
    again.resume()
    again.log_metrics({"eval/score": 0.46, "train/loss": 0.7}, 12)  # the loop's evaluation: dropped
    again.log_metrics({"eval/score": 0.54}, 12, again=True)  # select_best's record of the best weights
    again.end("FINISHED")
    client, (run,) = runs_of(uri, "resume-best")
    assert run.data.metrics["eval/score"] == 0.54
    assert [m.value for m in client.get_metric_history(run_id, "train/loss")] == [0.7]
    assert sorted(m.value for m in client.get_metric_history(run_id, "eval/score")) == [0.46, 0.54]
