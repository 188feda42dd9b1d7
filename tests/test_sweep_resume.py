"""An interrupted sweep continues under its original parent with resume=auto (issue: sweeps that
survive). A real 6-job joblib sweep (2 workers, one a core here, 30 steps a job) is stopped once 2
children FINISHED and a later one has a checkpoint: jobs that finished, jobs mid-training and jobs not
yet started, stopped by Ctrl-C (SIGINT to the group); rerun with the same command plus resume=auto,
SIGKILLed in turn once another job finished; and rerun again to its end. Tiny random BERT on short batches (8 x 32 tokens, as the
other tiny tests): the mechanics only."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import forkserver
from conftest import HANG, cli, existing_store, runs_of
from deepen_run.report import main as report

SWEEP = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seed=1,2,3,4,5,6", "task=rte", "backbone=tiny",
         "train.max_steps=30", "train.save_every=5", "train.log_every=5", "train.batch_size=8",
         "train.learning_rate=1e-3", "data.max_train_samples=256", "data.max_eval_samples=32",
         "data.max_seq_length=32"]


def split(runs):
    parents = [r for r in runs if r.data.tags.get("sweep_role") == "parent"]
    children = sorted((r for r in runs if r.data.tags.get("sweep_role") == "child"),
                      key=lambda r: int(r.data.tags["sweep_job"]))
    return parents, children


def outcomes(sweep: Path) -> dict[int, str]:
    out = {}
    for f in (sweep / "deepen_jobs").glob("*.json"):
        if f.name[:-5].isdigit():
            try:
                out[int(f.name[:-5])] = json.loads(f.read_text())["status"]
            except FileNotFoundError:  # a resume's launcher clears the last attempt's files as it starts
                pass
    return out


def recorded(run) -> str:
    """What a child's run.json says of its end ('-' where it has none)."""
    f = Path(run.data.tags.get("run_dir", "-")) / "run.json"
    return json.loads(f.read_text()).get("status", "-") if f.is_file() else "-"


def history(client, run, key="train/loss"):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


def stop(proc, sweep: Path, sig, ready) -> tuple[str, set[int]]:
    """Send `sig` to the sweep's process group once ready(job numbers FINISHED) holds; returns (the
    stopped process's stderr, job numbers FINISHED before the stop)."""
    t0 = time.time()
    while True:
        assert proc.poll() is None and time.time() - t0 < HANG, proc.communicate()[1][-3000:]
        finished = {k for k, s in outcomes(sweep).items() if s == "FINISHED"}
        if ready(finished):
            break
        time.sleep(0.1)
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=HANG)
    assert len(finished) < 6
    return err, finished


def steps_saved(sweep: Path) -> dict[int, set[str]]:
    """Each job's checkpoint folders (step-N) now."""
    return {int(d.name): {c.name for c in d.glob("checkpoints/step-*")} for d in sweep.glob("[0-9]*")}


def start(args: list[str]) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("deepen-run")
    return forkserver.popen([str(exe), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def resume_and_check(tmp_path, args, finished_before):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client, runs = runs_of(uri)
    (parent_before,), children_before = split(runs)
    # What FINISHED by the time the sweep stopped: the jobs seen FINISHED before the signal, plus any
    # that completed its tail while the signal landed (a race the sweep handles; the test must too).
    done_now = {int(c.data.tags["sweep_job"]) for c in children_before if c.info.status == "FINISHED"}
    assert finished_before <= done_now
    finished_before = done_now
    kept = {int(c.data.tags["sweep_job"]): (c.info.run_id, history(client, c)) for c in children_before
            if int(c.data.tags["sweep_job"]) in finished_before}
    others = {int(c.data.tags["sweep_job"]): c.info.run_id for c in children_before
              if int(c.data.tags["sweep_job"]) not in finished_before}

    r = cli(*args, "resume=auto")
    assert r.returncode == 0, r.stderr[-3000:]
    client, runs = runs_of(uri)
    (parent,), children = split(runs)
    assert parent.info.run_id == parent_before.info.run_id and parent.info.status == "FINISHED"
    assert [int(c.data.tags["sweep_job"]) for c in children] == list(range(6))
    assert all(c.info.status == "FINISHED" for c in children), [(c.info.run_name, c.info.status) for c in children]
    for c in children:
        job = int(c.data.tags["sweep_job"])
        if job in kept:  # trained once: same run, same history
            assert (c.info.run_id, history(client, c)) == kept[job]
        elif job in others:  # the killed one continued as the same run, no step logged twice
            assert c.info.run_id == others[job]
        steps = [s for s, _ in history(client, c)]
        assert steps == sorted(set(steps)) == [5, 10, 15, 20, 25, 30], (job, steps)
    m = parent.data.metrics
    assert (m["sweep/finished"], m["sweep/kept"], m["sweep/failed"], m["sweep/killed"], m["sweep/pending"]) == \
        (6, len(kept), 0, 0, 0)
    assert f"6/6 jobs FINISHED ({len(kept)} kept from before)" in r.stdout
    row = next((ln for ln in r.stdout.splitlines() if ln.startswith("| 1 | tiny | baseline |")), None)
    head = next((ln for ln in r.stdout.splitlines() if ln.startswith("| # |")), None)
    assert row and head, r.stdout[-3000:]
    cells = dict(zip([c.strip() for c in head.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert cells["n"] == "6"  # the table covers every child, kept ones included
    return r


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_sweep_stopped_by_ctrl_c_then_sigkilled_resumes_under_its_parent_each_time(tmp_path, glue_dir, capsys):
    """Attempt 1 is stopped by Ctrl-C (SIGINT to the process group) once 2 jobs FINISHED and another
    has a checkpoint: exit 130 and a truthful record. Attempt 2 (resume=auto) is SIGKILLed once one
    more job FINISHED and an unfinished one saved a new step. Attempt 3 ends the sweep under the same
    parent: every job FINISHED once, no step logged twice, the jobs finished before kept as they were."""
    sweep = tmp_path / "sweep"
    args = [*SWEEP, f"data.glue_dir={glue_dir}", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
            f"hydra.sweep.dir={sweep}", f"data.cache_dir={tmp_path}/cache"]
    existing_store(f"sqlite:///{tmp_path}/mlflow.db")
    proc = start(args)
    err, finished = stop(proc, sweep, signal.SIGINT, lambda done: len(done) >= 2 and any(
        k not in done and steps for k, steps in steps_saved(sweep).items()))
    assert proc.returncode == 130, err[-3000:]
    client, runs = runs_of(f"sqlite:///{tmp_path}/mlflow.db")
    (parent,), children = split(runs)
    running = [(c.data.tags["sweep_job"], c.data.tags.get("pid"), c.data.tags.get("error"), recorded(c))
               for c in children if c.info.status == "RUNNING"]
    assert parent.info.status == "KILLED" and not running, (parent.info.status, running, err[-3000:])
    done = sum(c.info.status == "FINISHED" for c in children)
    assert {c.info.status for c in children} <= {"FINISHED", "KILLED"}, [(c.info.run_name, c.info.status)
                                                                         for c in children]
    assert parent.data.tags["interrupted"].startswith(f"SIGINT: {done} of 6 jobs finished"), parent.data.tags
    assert parent.data.tags["pid"] == str(proc.pid)
    for c in children:
        home = Path(c.data.tags["run_dir"])
        status = json.loads((home / "run.json").read_text())["status"]
        assert status == c.info.status, (c.info.run_name, status, c.info.status)  # run.json tells the truth
        if c.info.status == "KILLED" and c.data.tags.get("stopped_before_first_step") != "true":
            assert list(home.glob("checkpoints/step-*")), c.info.run_name  # the workers saved their step
        elif c.info.status == "KILLED":  # stopped while loading, and says so: no step to save
            assert not list(home.glob("checkpoints/step-*")), c.info.run_name
            assert "exited without ending" not in c.data.tags.get("error", "")
    line = next(ln for ln in err.splitlines() if ln.startswith("deepen-run: sweep stopped by SIGINT"))
    # A job stopped while loading (before its MLflow run began) is killed too, with no checkpoint.
    killed = [k for k, s in outcomes(tmp_path / "sweep").items() if s == "KILLED"]
    saved = sum(bool(list((tmp_path / "sweep" / str(k)).glob("checkpoints/step-*"))) for k in killed)
    assert saved == sum(c.info.status == "KILLED" and c.data.tags.get("stopped_before_first_step") != "true"
                        for c in children)
    assert f"{len(killed)} unfinished job(s) are KILLED ({saved} with a checkpoint)" in line, line

    # The report says which children its row lacks, and why.
    sid = parent.data.tags["sweep_id"]
    report.main(["--uri", f"sqlite:///{tmp_path}/mlflow.db", "--sweep-id", sid])
    out = capsys.readouterr().out
    assert f"sweep {sid}: {done} of 6 children are in the table; missing from their row:" in out, out
    for k in range(6):
        status = next((c.info.status for c in children if c.data.tags["sweep_job"] == str(k)), None)
        if status is None:
            assert f"  job {k + 1}: no run recorded" in out
        elif status == "KILLED":
            assert any(ln.startswith(f"  job {k + 1} ") and ": KILLED" in ln for ln in out.splitlines()), out

    # Attempt 2, SIGKILLed: no handler runs; attempt 3's launcher finds its jobs' runs RUNNING and dead.
    # What FINISHED as attempt 1 ended (MLflow's record: a job may have ended while the signal landed).
    finished = {int(c.data.tags["sweep_job"]) for c in children if c.info.status == "FINISHED"}
    before = steps_saved(sweep)
    proc = start([*args, "resume=auto"])
    err, finished = stop(proc, sweep, signal.SIGKILL, lambda done: len(done) > len(finished) and any(
        k not in done and steps - before.get(k, set()) for k, steps in steps_saved(sweep).items()))
    assert proc.returncode == -signal.SIGKILL, err[-3000:]
    r = resume_and_check(tmp_path, args, finished)
    assert "attempt 3, continuing the interrupted sweep" in r.stdout


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigterm_to_the_launcher_alone_stops_the_jobs_through_the_stop_file(tmp_path, glue_dir):
    """A job on another machine has only the STOP file: here the launcher alone gets SIGTERM (its loky
    workers get nothing), writes STOP, and the two running jobs read it at their next step's end, save
    and end KILLED; the third never starts; the launcher closes the parent KILLED and exits 143."""
    sweep = tmp_path / "sweep"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [a for a in SWEEP if not a.startswith(("seed=", "train.max_steps"))]
    existing_store(uri)
    exe = Path(sys.executable).with_name("deepen-run")
    proc = forkserver.popen([str(exe), *args, "seed=1,2,3", "train.max_steps=100000", f"data.glue_dir={glue_dir}",
                             f"tracking.uri={uri}", f"hydra.sweep.dir={sweep}", f"data.cache_dir={tmp_path}/cache"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    t0 = time.time()
    while len([d for d in sweep.glob("[0-9]*") if list(d.glob("checkpoints/step-*"))]) < 2:
        assert proc.poll() is None and time.time() - t0 < HANG, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert (sweep / "deepen_jobs" / "STOP").read_text().strip() == "SIGTERM"
    assert outcomes(sweep) == {0: "KILLED", 1: "KILLED"} and not (sweep / "deepen_jobs" / "2.start.json").exists()
    client, runs = runs_of(uri)
    (parent,), children = split(runs)
    assert parent.info.status == "KILLED", parent.data.tags
    assert parent.data.tags["interrupted"].startswith("SIGTERM: 0 of 3 jobs finished, 2 killed, 1 not started")
    assert [(c.data.tags["sweep_job"], c.info.status) for c in children] == [("0", "KILLED"), ("1", "KILLED")]
    assert "2 unfinished job(s) are KILLED (2 with a checkpoint), 1 not started" in err, err[-3000:]


def test_a_resume_may_type_the_overrides_in_another_order_but_keeps_each_jobs_number(tmp_path):
    """Job k continues in run dir k: `task=rte seed=1,2` resumes `seed=1,2 task=rte` (every job the same),
    while `lr=a,b seed=1,2` for `seed=1,2 lr=a,b` would hand job 1's dir to another job: refused, saying so."""
    from deepen_run.errors import UserError
    from deepen_run.sweep.resume import check_same

    old = {"sweep_id": "s", "parent_run_id": "p", "params": {"seed": "1,2", "task": "rte"},
           "jobs": [["seed=1", "task=rte"], ["seed=2", "task=rte"]]}
    check_same(old, {"task": "rte", "seed": "1,2"}, [["task=rte", "seed=1"], ["task=rte", "seed=2"]], tmp_path, True)
    grid = [["seed=1", "lr=a"], ["seed=1", "lr=b"], ["seed=2", "lr=a"], ["seed=2", "lr=b"]]
    old = {"sweep_id": "s", "parent_run_id": "p", "params": {"seed": "1,2", "lr": "a,b"}, "jobs": grid}
    with pytest.raises(UserError, match="the same jobs in another order"):
        check_same(old, {"lr": "a,b", "seed": "1,2"}, [[f"lr={x}", f"seed={s}"] for x in "ab" for s in "12"],
                   tmp_path, True)
