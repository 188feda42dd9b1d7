"""Console lines: a sweep job's progress carries its job label, a multi-task loss line each task's
own mean, joblib's recycled-worker warning is filtered, the finished run has a rounded score tag."""
import warnings

import pytest
import torch

from conftest import cli, runs_of
from deepen_run.run.progress import TaskLosses, quiet_warnings


def test_task_losses_are_per_task_means():
    t = TaskLosses()
    for task, loss in [("mrpc", 0.5), ("stsb", 4.0), ("mrpc", 0.7), ("stsb", 2.0)]:
        t.add(task, torch.tensor(loss))
    # a step of two micro-batches (losses 0.2, 0.2): each adds loss / 2 at half the weight, as fit() does
    t.add("mrpc", torch.tensor(0.2) / 2, 0.5)
    t.add("mrpc", torch.tensor(0.2) / 2, 0.5)
    assert t.line() == "mrpc 0.4667  stsb 3.0000"
    assert t.line() == ""  # reset after showing


def test_joblibs_recycled_worker_warning_is_filtered():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_warnings()
        warnings.warn_explicit("A worker stopped while some jobs were given to the executor. This can be caused by "
                               "a too short worker timeout or by a memory leak.", UserWarning,
                               "process_executor.py", 787, module="joblib.externals.loky.process_executor")
        warnings.warn_explicit("something else", UserWarning, "x.py", 1, module="joblib.x")
    assert [str(w.message) for w in seen] == ["something else"]


@pytest.mark.subprocess
def test_sweep_jobs_progress_lines_carry_their_label(glue_dir, mlflow_uri):
    r = cli("-m", "backbone=tiny", "task.names=[rte,mrpc]", "seed=1,2", "data.max_train_samples=16", "data.max_eval_samples=8",
            "data.max_seq_length=32", "train.max_steps=4", "train.batch_size=4", "train.log_every=2",
            f"data.glue_dir={glue_dir}", f"tracking.uri={mlflow_uri}", env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [ln for ln in r.stderr.splitlines() if " train step " in ln or ln.startswith("train step")]
    assert steps and all(ln.startswith(("[job 1] train step", "[job 2] train step")) for ln in steps), steps
    assert any(ln.startswith("[job 2] train step 4/4") for ln in steps)
    out = r.stdout.splitlines()
    starts = [i for i, ln in enumerate(out) if ln.startswith(("[job 1/2] started: ", "[job 2/2] started: "))]
    params = [i for i, ln in enumerate(out) if ln.startswith("params: ")]
    # the basic launcher runs each job in its own process: the job says it started before its first line
    assert len(starts) == len(params) == 2 and starts[0] < params[0] < starts[1] < params[1], out
    # the multi-task loss shows each task's own mean, not one mixed number with the step's task
    assert any(" loss rte " in ln and " mrpc " in ln for ln in steps) or any(" loss mrpc " in ln for ln in steps), "\n".join(steps)
    assert not any(" task " in ln for ln in steps)
    client, runs = runs_of(mlflow_uri)
    for run in (x for x in runs if x.data.tags.get("sweep_role") == "child"):
        assert run.data.tags["score"] == f"{run.data.metrics['eval/score']:.4f}"
