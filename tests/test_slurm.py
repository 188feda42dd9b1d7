"""A sweep on a real SLURM cluster (tests/slurm_cluster.py: slurmctld + slurmd on this machine) through
`hydra/launcher=submitit_slurm`, pre-empted: the job saves at a step's end, SLURM runs it again, and it
continues as the same MLflow run from its checkpoint. Checked by behaviour only (exit codes, MLflow
statuses, step histories): one parent FINISHED, every child FINISHED, no step logged twice, and the
pre-empted job's metrics equal to its twin's, which ran whole.

Twins: the two jobs of each sweep differ only in tracking.run_name (a key that cannot change a result),
so the one that ran whole is the uninterrupted run the other is compared with. docs/scale-out.md shows
these settings.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import existing_store, runs_of
from slurm_cluster import Cluster, install

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.subprocess]
LIMIT = 900  # seconds a sweep may take here (a hung one fails instead of holding the suite for an hour)

TWINS = ["tracking.run_name=preempted,whole", "task=rte", "backbone=tiny", "train.max_steps=60",
         "train.save_every=10", "train.log_every=5", "train.batch_size=32", "train.learning_rate=1e-3",
         "data.max_train_samples=512", "data.max_eval_samples=32", "data.max_seq_length=128", "resume=auto"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = install()
    if why:
        pytest.skip(why)
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        left = c.stop()  # every daemon, even when a test failed
        assert not left, f"SLURM daemons still running: {left}"


def launch(cluster, tmp_path, glue_dir, *extra: str) -> tuple[subprocess.Popen, Path, str]:
    uri, sweep = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "sweep"
    existing_store(uri)
    replaced = {e.partition("=")[0] for e in extra}  # an extra override of a twins' key takes its place
    twins = [o for o in TWINS if o.partition("=")[0] not in replaced]
    args = ["-m", "hydra/launcher=submitit_slurm", *twins, *extra, f"data.glue_dir={glue_dir}",
            f"tracking.uri={uri}", f"hydra.sweep.dir={sweep}", f"data.cache_dir={tmp_path}/cache"]
    env = {**cluster.env(), "OMP_NUM_THREADS": "1"}
    # Its output to files: submitit's warnings about sacct (no accounting here) would fill a pipe.
    with open(tmp_path / "launcher.out", "w") as out, open(tmp_path / "launcher.err", "w") as err:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("deepen-run")), *args], stdout=out, stderr=err,
                                text=True, env=env, close_fds=True)
    proc.err = tmp_path / "launcher.err"
    return proc, sweep, uri


def tail(proc) -> str:
    return proc.err.read_text(errors="replace")[-3000:]


def slurm_id(cluster, task: int | None) -> str:
    """The SLURM id of array task `task` (job number `task` of the sweep) while it runs; task None: the
    one job of a sweep of one (submitit submits it as a plain job, not an array)."""
    ids = cluster.run("squeue", "-h", "-t", "RUNNING", "-o", "%i").stdout.split()
    if task is None:
        return ids[0] if len(ids) == 1 else ""
    return next((j for j in ids if j.endswith(f"_{task}")), "")


def wait(proc: subprocess.Popen, until, what: str) -> None:
    t0 = time.time()
    while not until():
        assert proc.poll() is None, f"the sweep ended before {what}: {tail(proc)}"
        assert time.time() - t0 < LIMIT, what
        time.sleep(0.2)


def release(cluster, *settings: str) -> None:
    """SLURM holds a requeued job back for two minutes (Reason=BeginTime); the tests let it start now,
    with `settings` (scontrol update's KEY=VALUE) changed first."""
    r = cluster.run("squeue", "-h", "-t", "PENDING", "-o", "%i %r")
    for job, reason in (ln.split(None, 1) for ln in r.stdout.splitlines() if ln.strip()):
        if reason.strip() == "BeginTime":
            if settings:
                r = cluster.run("scontrol", "update", f"JobId={job}", *settings)
                assert r.returncode == 0, r.stderr
            cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now")


def field(cluster, job: str, key: str) -> str:
    """One KEY=VALUE of `scontrol show job`."""
    text = cluster.run("scontrol", "show", "job", job).stdout
    return next(w for w in text.split() if w.startswith(f"{key}=")).split("=", 1)[1]


def restarts(cluster, job: str) -> int:
    return int(field(cluster, job, "Restarts"))


def run_time_s(cluster, job: str) -> int:
    """How long the job has run (RunTime=[D-]HH:MM:SS)."""
    days, _, hms = field(cluster, job, "RunTime").rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return ((int(days or 0) * 24 + h) * 60 + m) * 60 + s


def job_log(sweep: Path, task: int | None) -> str:
    """What submitit and the job printed, every attempt (one file, opened for appending); task None:
    the one job of a sweep of one."""
    pattern = "*/*_log.out" if task is None else f"*_{task}/*_log.out"
    return "\n".join(f.read_text(errors="replace") for f in sorted((sweep / ".submitit").glob(pattern)))


def history(client, run, key="train/loss"):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


def diagnosis(cluster, sweep: Path) -> str:
    """What SLURM and submitit say about the sweep's jobs (its logs end with why a job stopped)."""
    logs = "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}"
                     for f in sorted((sweep / ".submitit").glob("**/*_log.err")))
    return cluster.run("scontrol", "show", "job").stdout[-4000:] + logs


def check_twins(cluster, proc, uri: str, sweep: Path, *held: str, twins: bool = True) -> None:
    """held: what a requeued job gets changed before it is let start (scontrol update's KEY=VALUE);
    twins=False: a sweep of the pre-empted job alone, checked for one run and no step logged twice."""
    t0, idle = time.time(), None
    while proc.poll() is None:
        assert time.time() - t0 < LIMIT, "the sweep did not end: " + diagnosis(cluster, sweep)
        release(cluster, *held)
        # No job pending or running while the launcher still waits: one ended without a result file
        # (killed outside submitit's handler), and without accounting (sacct) submitit waits forever.
        if cluster.run("squeue", "-h", "-o", "%i").stdout.strip():
            idle = None
        elif idle is None:
            idle = time.time()
        assert idle is None or time.time() - idle < 60, "the launcher waits on no job: " + diagnosis(cluster, sweep)
        time.sleep(1)
    assert proc.returncode == 0, tail(proc)
    client, runs = runs_of(uri)
    parents = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    children = {r.info.run_name: r for r in runs if r.data.tags.get("sweep_role") == "child"}
    assert [p.info.status for p in parents] == ["FINISHED"]
    # One run each: the requeued job continued its own.
    assert sorted(children) == (["preempted", "whole"] if twins else ["preempted"])
    assert {c.info.status for c in children.values()} == {"FINISHED"}
    pre, whole = children["preempted"], children.get("whole")
    for key in ("train/loss", "eval/score"):
        steps = [s for s, _ in history(client, pre, key)]
        assert steps and steps == sorted(set(steps)), (key, steps)  # no step logged twice
        if whole is None:
            continue
        assert [s for s, _ in history(client, whole, key)] == steps
        assert [v for _, v in history(client, pre, key)] == pytest.approx([v for _, v in history(client, whole, key)],
                                                                        rel=1e-5)


def test_a_requeued_job_continues_as_the_same_run(cluster, tmp_path, glue_dir):
    proc, sweep, uri = launch(cluster, tmp_path, glue_dir, "hydra.launcher.max_num_timeout=3")
    try:
        # Pre-empted mid-training: once job 0 has a checkpoint, SLURM requeues it (SIGTERM, then runs it again).
        wait(proc, lambda: list((sweep / "0").glob("checkpoints/step-*")), "job 0 saved a checkpoint")
        job = slurm_id(cluster, 0)
        assert job, cluster.run("squeue").stdout
        r = cluster.run("scontrol", "requeue", job)
        assert r.returncode == 0, r.stderr
        check_twins(cluster, proc, uri, sweep)
        assert restarts(cluster, job) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_job_at_its_time_limit_saves_and_is_requeued(cluster, tmp_path, glue_dir):
    # SLURM sends --signal's SIGUSR2 up to 60 s before signal_delay_s (sbatch(1); its time-limit checks
    # come every 30 s: a 1-min limit with USR2@30 signalled attempts 13-26 s after they started; one
    # before submitit has installed its handler ends the process unrequeued). So the job starts
    # far from its limit; once it trains, saved once, its limit is brought 60-120 s away: within
    # signal_delay_s, so SIGUSR2 comes at SLURM's next check (at most 30 s on; 500 steps leave it training
    # then: 200 ran whole in 36 s on a Zen 5 EPYC, before the signal) and the limit at least 30 s later.
    # The job finishes its step, saves, ends KILLED, and submitit requeues it; its next attempt gets the
    # long limit back and runs to the end. The job alone, without a twin: that a requeued job's metrics
    # equal an uninterrupted run's is the test above (a whole twin here cost 500 more steps of CPU).
    proc, sweep, uri = launch(cluster, tmp_path, glue_dir, "tracking.run_name=preempted", "train.max_steps=500",
                              "hydra.launcher.timeout_min=10", "hydra.launcher.signal_delay_s=120",
                              "hydra.launcher.max_num_timeout=3")
    try:
        wait(proc, lambda: list((sweep / "0").glob("checkpoints/step-*")), "job 0 saved a checkpoint")
        job = slurm_id(cluster, None)
        assert job, cluster.run("squeue").stdout
        r = cluster.run("scontrol", "update", f"JobId={job}", f"TimeLimit={run_time_s(cluster, job) // 60 + 2}")
        assert r.returncode == 0, r.stderr
        check_twins(cluster, proc, uri, sweep, "TimeLimit=10", twins=False)
        assert restarts(cluster, job) == 1, job_log(sweep, None)[-3000:]  # 0: it ran whole before its limit came
        log = job_log(sweep, None)
        assert "Caught signal SIGUSR2" in log and "this job is timed-out" in log, log[-3000:]
        step = re.search(r"resuming run preempted \(\w+\) at step (\d+) of 500", log)
        assert step and int(step.group(1)) >= 10, log[-3000:]  # continued from the checkpoint saved at the signal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
