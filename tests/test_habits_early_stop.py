"""train.early_stopping_patience on real short tiny-model runs: a score that stops improving ends
the run at the documented evaluation, the stopped step is recorded (tag, metric, console), with
model_selection=final and best, and a SIGKILLed run resumes to the same stop."""
import json
import re
import signal

import pytest

from conftest import HANG, cli, runs_of

pytestmark = [pytest.mark.e2e, pytest.mark.subprocess]

# learning rate ~0: the tiny model's predictions, and so its dev accuracy, never change, so every
# evaluation after the first is "no improvement"
TINY = ["backbone=tiny", "task=rte", "data.max_train_samples=64", "data.max_eval_samples=32",
        "data.max_seq_length=32", "train.batch_size=4", "train.learning_rate=1e-12", "train.max_steps=100",
        "train.eval_every=10", "train.log_every=5", "seed=1"]
ENV = {"OMP_NUM_THREADS": "1"}


def steps_of(client, run, key="eval/score"):
    return sorted({m.step for m in client.get_metric_history(run.info.run_id, key)})


@pytest.mark.parametrize("selection", ["final", "best"])
def test_patience_2_stops_at_the_third_flat_evaluation(selection, glue_dir, mlflow_uri):
    r = cli(*TINY, "train.early_stopping_patience=2", f"train.model_selection={selection}",
            f"data.glue_dir={glue_dir}", f"tracking.uri={mlflow_uri}", env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "deepen-run: early stopping at step 30 of 100" in r.stderr
    client, (run,) = runs_of(mlflow_uri)
    assert run.info.status == "FINISHED"
    assert run.data.tags["early_stopped_step"] == "30"
    assert run.data.metrics["train/early_stopped_step"] == 30
    assert steps_of(client, run) == [10, 20, 30]  # no evaluation after the stop, the final one at 30
    assert max(steps_of(client, run, "train/loss")) == 30
    if selection == "best":
        assert run.data.tags["selected_step"] == "10"


def test_patience_needs_evaluations_during_training(mlflow_uri):
    r = cli("backbone=tiny", "task=rte", "train.early_stopping_patience=2", f"tracking.uri={mlflow_uri}")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("deepen-run: error: train.early_stopping_patience=2")


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_stop(glue_dir, mlflow_uri, tmp_path):
    from test_resume import start, wait_for_checkpoint

    run_dir = tmp_path / "run"
    a = [*TINY, "train.early_stopping_patience=3", "train.save_every=15", f"data.glue_dir={glue_dir}",
         f"tracking.uri={mlflow_uri}"]
    proc = start(*a, f"hydra.run.dir={run_dir}")
    ckpt = wait_for_checkpoint(proc, run_dir)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=HANG)
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["extra"]["early_stop"]["best_step"] == 10  # the counter is in the checkpoint
    r = cli(*a, f"hydra.run.dir={run_dir}", "resume=auto", env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    client, (run,) = runs_of(mlflow_uri)
    # resume announces itself in one line
    said = re.search(rf"^resuming run tiny-baseline-rte-s1 \({run.info.run_id}\) at step (\d+) of 100$", r.stdout, re.M)
    assert said and int(said.group(1)) in (15, 30), r.stdout[-2000:]
    assert run.info.status == "FINISHED" and run.data.tags["early_stopped_step"] == "40"
    assert steps_of(client, run) == [10, 20, 30, 40]
