"""Crash, interrupt, divergence and reruns of real training processes (tiny random BERT on real
SST-2 rows): a SIGKILLed run resumes to exactly the metrics of an uninterrupted one, in the same
MLflow run with no step logged twice; SIGTERM ends KILLED with a checkpoint; a NaN loss ends FAILED
with its message; the same seed gives identical metrics."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import forkserver
from conftest import HANG, cli, isolated, runs_of
from deepen_run.run.lifecycle import reap_orphans
from deepen_run.tracking.store import Tracker

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.subprocess]

# 32 batches an epoch, so 120 steps cross three epoch boundaries (re-shuffles) and the resume
# point (step 20 or later) falls mid-epoch; dropout is on, so RNG state must come back too.
TINY = ["backbone=tiny", "task=sst2", "data.max_train_samples=256", "data.max_eval_samples=64",
        "data.max_seq_length=32", "train.batch_size=8", "train.max_steps=120", "train.save_every=20",
        "train.log_every=10", "train.eval_every=40", "seed=3"]
ENV = {"OMP_NUM_THREADS": "1"}  # a tiny model gains nothing from threads on a shared machine


def args(glue_dir, uri, run_dir, *extra):
    # One store for the module (its tables are made once), one experiment per test.
    return [*TINY, f"data.glue_dir={glue_dir}", f"tracking.uri={uri}", f"hydra.run.dir={run_dir}",
            f"tracking.experiment={run_dir.parent.name}", *extra]


def start(*a) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("deepen-run")
    return forkserver.popen([str(exe), *isolated(a)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **ENV})


def wait_for_checkpoint(proc, run_dir: Path, timeout=HANG) -> Path:
    t0 = time.time()
    while time.time() - t0 < timeout:
        found = sorted((run_dir / "checkpoints").glob("step-*/trainer_state.json"))
        if found:
            return found[0].parent
        assert proc.poll() is None, f"the run ended before its first checkpoint: {proc.stderr.read()[-2000:]}"
        time.sleep(0.02)
    raise AssertionError("no checkpoint appeared")


TIMING = ("train/runtime_s", "train/step_time_s")  # wall-clock: never equal between two processes


def history(client, run) -> dict:
    return {k: [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, k), key=lambda m: m.step)]
            for k in run.data.metrics if k not in TIMING}


def final(run) -> dict:
    return {k: v for k, v in run.data.metrics.items() if k not in TIMING}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('store')}/mlflow.db"


@pytest.fixture(scope="module")
def reference(glue_dir, store, tmp_path_factory):
    """One uninterrupted run: what resumes must reproduce."""
    run_dir = tmp_path_factory.mktemp("ref") / "ref" / "run"
    r = cli(*args(glue_dir, store, run_dir), env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    client, (run,) = runs_of(store, "ref")
    return store, client, run, run_dir


def test_same_seed_same_metrics_and_provenance(reference, glue_dir, tmp_path):
    uri, client, run, ref_dir = reference
    assert run.info.status == "FINISHED"
    # A finished run keeps its best weights (safetensors) but no full-state checkpoints.
    assert not list((ref_dir / "checkpoints").glob("step-*")) and (ref_dir / "checkpoints/best/model.safetensors").is_file()
    r = cli(*args(glue_dir, uri, tmp_path / "again" / "run"), env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    client2, (run2,) = runs_of(uri, "again")
    assert final(run2) == final(run) and "eval/sst2/accuracy" in final(run)
    assert history(client2, run2) == history(client, run)
    tags = run.data.tags
    assert tags["seed"] == "3" and len(tags["git_commit"]) in (7, 40) or tags["git_commit"] == "unknown"
    assert {"version/torch", "version/transformers", "version/datasets", "version/accelerate", "version/mlflow",
            "version/hydra-core"} <= set(tags)
    assert run.data.params["seed"] == "3" and "resume" not in run.data.params


def test_sigkill_then_resume_equals_uninterrupted(reference, glue_dir, tmp_path):
    uri, ref_client, ref_run, _ = reference
    killed = tmp_path / "runs" / "killed"
    proc = start(*args(glue_dir, uri, killed))
    first = wait_for_checkpoint(proc, killed)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=HANG)
    state = json.loads((first / "trainer_state.json").read_text())
    assert state["step"] == 20 and state["consumed"] == {"sst2": 20}
    client, (run,) = runs_of(uri, "runs")
    assert run.info.status == "RUNNING"  # nothing can end a run from inside a SIGKILLed process
    # ...but the next run in the experiment sees its process is gone and ends it KILLED.
    tracker = Tracker(uri, "runs")
    tracker.check()
    assert reap_orphans(tracker) == [run.info.run_id]
    assert client.get_run(run.info.run_id).info.status == "KILLED"

    # resume=true finds the killed run's dir next to this command's run dir (same config).
    r = cli(*args(glue_dir, uri, tmp_path / "runs" / "resume", "resume=true"), env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    client, runs = runs_of(uri, "runs")
    assert len(runs) == 1 and runs[0].info.run_id == run.info.run_id
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert final(run) == final(ref_run)
    got = history(client, run)
    for key, points in got.items():
        steps = [s for s, _ in points]
        assert len(steps) == len(set(steps)), f"{key} logged twice at a step: {steps}"
    assert got == history(ref_client, ref_run)
    # The resuming command's own dir holds only its log and .hydra/; checkpoints stay with the run.
    assert sorted(p.name for p in (tmp_path / "runs" / "resume").iterdir()) == [".hydra", "cli.log"]


def test_a_kill_during_a_checkpointed_evaluation_resumes_to_the_same_history(reference, glue_dir, tmp_path):
    """Step 40 is saved and evaluated, the checkpoint first. Killed as it appears (mostly during that
    evaluation), the run must not lose the evaluation: resume=auto makes it again where the checkpoint
    does not count it, and the metric history equals the uninterrupted run's."""
    uri, ref_client, ref_run, _ = reference
    run_dir = tmp_path / "evalkill" / "run"
    cmd = args(glue_dir, uri, run_dir, "resume=auto")
    proc = start(*cmd)
    state = run_dir / "checkpoints" / "step-40" / "trainer_state.json"
    t0 = time.time()
    while not state.is_file() and proc.poll() is None and time.time() - t0 < HANG:
        time.sleep(0.002)  # the kill should land inside the evaluation, which takes tens of ms here
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=HANG)
    r = cli(*cmd, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "at step 40 of 120" in r.stdout + r.stderr
    client, (run,) = runs_of(uri, "evalkill")
    assert run.info.status == "FINISHED"
    assert final(run) == final(ref_run) and history(client, run) == history(ref_client, ref_run)


def test_sigterm_ends_killed_with_a_checkpoint(glue_dir, store, tmp_path):
    uri, run_dir = store, tmp_path / "sigterm" / "run"
    proc = start(*args(glue_dir, uri, run_dir, "train.max_steps=100000", "train.save_every=20"))
    wait_for_checkpoint(proc, run_dir)
    time.sleep(0.3)  # let it get past the periodic checkpoint: the interrupt saves its own
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=HANG)[1]
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip() and not ln.startswith("train:")]
    assert "Traceback" not in err and "stopped by SIGTERM" in lines[-1]
    client, (run,) = runs_of(uri, "sigterm")
    assert run.info.status == "KILLED" and run.data.tags["interrupted"] == "SIGTERM"
    ckpts = sorted((run_dir / "checkpoints").glob("step-*"), key=lambda p: int(p.name[5:]))
    assert ckpts and not list((run_dir / "checkpoints").glob("*.tmp"))
    last = ckpts[-1]
    assert json.loads((last / "trainer_state.json").read_text())["step"] == int(last.name[5:])
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin"} <= {p.name for p in last.iterdir()}


def test_nan_loss_fails_with_a_message(glue_dir, store, tmp_path):
    uri = store
    r = cli(*args(glue_dir, uri, tmp_path / "nan" / "run", "train.learning_rate=1e30", "train.warmup_ratio=0"), env=ENV)
    assert r.returncode == 1, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.replace("\r", "\n").splitlines() if ln.strip() and not ln.startswith("train:")]
    assert "Traceback" not in r.stderr and lines[-1].startswith("deepen-run: error: training loss is")
    client, (run,) = runs_of(uri, "nan")
    assert run.info.status == "FAILED"
    assert run.data.tags["error"].startswith("NonFiniteLoss: training loss is")
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert all(m.value == m.value for m in losses)  # no NaN was ever logged


def _status(uri, experiment):
    client, runs = runs_of(uri, experiment)
    return client, runs


def wait_for(cond, what, timeout=HANG):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_requeued_command_resumes_in_its_own_dir_and_survives_a_neighbour(reference, glue_dir, tmp_path):
    """What a cluster does after pre-emption: the same command, same run dir, resume=auto."""
    uri, ref_client, ref_run, _ = reference
    run_dir = tmp_path / "requeue" / "run"
    cmd = args(glue_dir, uri, run_dir, "resume=auto")
    proc = start(*cmd)
    wait_for_checkpoint(proc, run_dir)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=HANG)
    saved = (run_dir / "run_config.yaml").read_text()
    client, (run,) = runs_of(uri, "requeue")
    again = start(*cmd)  # the requeue: Hydra rewrites .hydra/config.yaml, run_config.yaml stays
    wait_for(lambda: client.get_run(run.info.run_id).data.tags.get("pid") == str(again.pid), "the resumed pid tag")
    # A neighbour starting in the same experiment reaps dead runs: the resumed one is alive.
    r = cli(*args(glue_dir, uri, tmp_path / "requeue" / "other", "dry_run=true"), env=ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    err = again.communicate(timeout=HANG)[1]
    assert again.returncode == 0, err[-3000:]
    client, runs = runs_of(uri, "requeue")
    (got,) = [x for x in runs if x.info.run_id == run.info.run_id]
    assert len(runs) == 2 and got.info.status == "FINISHED"
    assert "error" not in got.data.tags and "interrupted" not in got.data.tags
    assert final(got) == final(ref_run) and history(client, got) == history(ref_client, ref_run)
    assert (run_dir / "run_config.yaml").read_text() == saved


def test_sigusr1_checkpoints_and_a_damaged_checkpoint_falls_back(reference, glue_dir, tmp_path):
    uri, ref_client, ref_run, _ = reference
    run_dir = tmp_path / "usr1" / "run"
    proc = start(*args(glue_dir, uri, run_dir))
    ckpts = lambda: sorted(int(p.parent.name[5:]) for p in (run_dir / "checkpoints").glob("step-*/trainer_state.json"))  # noqa: E731
    wait_for(lambda: ckpts() and ckpts()[-1] >= 40 or proc.poll() is not None, "a checkpoint at step 40")
    proc.send_signal(signal.SIGUSR1)
    err = proc.communicate(timeout=HANG)[1]
    assert proc.returncode == 128 + signal.SIGUSR1, err[-3000:]
    client, (run,) = runs_of(uri, "usr1")
    assert run.info.status == "KILLED" and run.data.tags["interrupted"] == "SIGUSR1"
    steps = ckpts()
    assert len(steps) == 2 and steps[1] >= 40, steps  # the signal's own save (or step 40's), and one before
    last, prev = (run_dir / "checkpoints" / f"step-{s}" for s in (steps[1], steps[0]))
    weights = last / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated
    (prev / "model.safetensors").rename(tmp_path / "aside")  # missing
    again = args(glue_dir, uri, run_dir, f"resume={run_dir}")
    r = cli(*again, env=ENV)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "truncated" in r.stderr and "model.safetensors is missing" in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("deepen-run: error: resume=")
    assert client.get_run(run.info.run_id).info.status == "KILLED"  # a failed attempt changes nothing
    (tmp_path / "aside").rename(prev / "model.safetensors")
    r = cli(*again, env=ENV)  # resume=D hydra.run.dir=D: from step 40, the intact one
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"checkpoint {last} is damaged" in r.stderr
    client, (run,) = runs_of(uri, "usr1")
    assert run.info.status == "FINISHED" and final(run) == final(ref_run)


def test_two_processes_on_one_run_dir(glue_dir, store, tmp_path):
    uri, run_dir = store, tmp_path / "twice" / "run"
    proc = start(*args(glue_dir, uri, run_dir, "train.max_steps=100000"))
    wait_for_checkpoint(proc, run_dir)
    r = cli(*args(glue_dir, uri, run_dir, "train.max_steps=100000"), env=ENV)
    assert proc.poll() is None, "the first run ended before the second tried its dir"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=HANG)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "in use by another run" in lines[0], r.stderr[-2000:]
    client, (run,) = runs_of(uri, "twice")  # the second made no run and left the first's files alone
    assert run.info.status == "KILLED" and (run_dir / "run.json").is_file() and (run_dir / "run_config.yaml").is_file()
