"""Fault cases a new user meets (issue: sweeps that survive, part 4) and logs off a terminal: each
ends with one clear line, a non-zero exit and truthful statuses, and loses nothing recorded.
Real CLI processes on the tiny random BERT and real RTE rows."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import forkserver
from conftest import HANG, cli, isolated, runs_of

TINY = ["task=rte", "backbone=tiny", "train.batch_size=8", "data.max_train_samples=32", "data.max_eval_samples=32",
        "data.max_seq_length=32"]
LONG = [*TINY, "train.max_steps=100000", "train.save_every=5"]


def start(*a, stdout=subprocess.DEVNULL) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("deepen-run")
    return forkserver.popen([str(exe), *isolated(a)], stdout=stdout, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for(proc, what, timeout=HANG):
    t0 = time.time()
    while not what():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() - t0 < timeout
        time.sleep(0.1)


def lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip()]


@pytest.mark.slow
@pytest.mark.subprocess
def test_log_off_a_terminal_is_plain_lines(tmp_path, glue_dir):
    """stdout and stderr to a file (SLURM, nohup, CI): no carriage-return bars; 150 steps, a short log."""
    log = tmp_path / "run.log"
    exe = Path(sys.executable).with_name("deepen-run")
    with open(log, "w") as f:
        proc = forkserver.popen([str(exe), *isolated([*TINY, "train.max_steps=150", f"data.glue_dir={glue_dir}"])],
                                stdout=f, stderr=subprocess.STDOUT)
        rc = proc.wait(timeout=HANG)
    text = log.read_text()
    assert rc == 0, text[-3000:]
    assert "\r" not in text
    assert len(text.splitlines()) < 60, text
    progress = [ln for ln in text.splitlines() if ln.startswith("train step")]
    assert 5 <= len(progress) <= 25 and progress[-1].startswith("train step 150/150")
    assert "it/s" in progress[-1] and "ETA" in progress[-1] and "loss" in progress[-1]


@pytest.mark.slow
@pytest.mark.subprocess
def test_stop_after_the_last_step_leaves_what_resume_needs(tmp_path, glue_dir):
    """SIGTERM once training is over (final evaluation, record, predictions): KILLED with the last
    step's checkpoint, and resume=auto completes the same run (predictions included)."""
    run = tmp_path / "run"
    # predict=true: the tail predicts the SST-2 test set (1821 rows) one at a time, seconds of work to stop.
    a = ["task=sst2", "backbone=tiny", "train.batch_size=8", "data.max_train_samples=32", "data.max_eval_samples=32",
         "train.eval_batch_size=1", "train.max_steps=10", "predict=true", f"data.glue_dir={glue_dir}",
         f"hydra.run.dir={run}", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
    proc = start(*a)
    seen = []

    def trained():
        seen.append(proc.stderr.readline())
        return seen[-1].startswith("train step 10/10")
    wait_for(proc, trained)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    client, (r,) = runs_of(f"sqlite:///{tmp_path}/mlflow.db")
    assert r.info.status == "KILLED" and json.loads((run / "run.json").read_text())["status"] == "KILLED"
    assert (run / "checkpoints" / "step-10").is_dir()
    assert "checkpoint step-10 kept" in err and "continue with resume=auto" in err

    done = cli(*a, "resume=auto")
    assert done.returncode == 0, done.stderr[-3000:]
    client, runs = runs_of(f"sqlite:///{tmp_path}/mlflow.db")
    assert [x.info.run_id for x in runs] == [r.info.run_id] and runs[0].info.status == "FINISHED"
    assert {"predictions", "submission", "metrics.json"} <= {x.path for x in client.list_artifacts(r.info.run_id)}


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory, glue_dir):
    """A run stopped by SIGTERM after its first checkpoint, on a private copy of the RTE files."""
    tmp = tmp_path_factory.mktemp("killed")
    glue = tmp / "glue"
    shutil.copytree(Path(glue_dir) / "RTE", glue / "RTE")
    a = [*LONG, f"data.glue_dir={glue}", f"hydra.run.dir={tmp / 'run'}", f"tracking.uri=sqlite:///{tmp}/mlflow.db"]
    proc = start(*a)
    wait_for(proc, lambda: list((tmp / "run" / "checkpoints").glob("step-*/trainer_state.json")))
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=HANG)
    assert proc.returncode == 128 + signal.SIGTERM
    return tmp, a


@pytest.mark.slow
@pytest.mark.subprocess
def test_resume_auto_with_a_changed_override_names_the_key(killed_run):
    tmp, a = killed_run
    r = cli(*[x for x in a if not x.startswith("train.batch_size")], "train.batch_size=16", "resume=auto")
    assert r.returncode == 2 and len(lines(r.stderr)) == 1, r.stderr[-3000:]
    assert "train.batch_size was 8, now 16" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_resume_on_changed_training_data_is_refused_naming_the_file(killed_run):
    tmp, a = killed_run
    train = tmp / "glue" / "RTE" / "train.tsv"
    before = train.read_bytes()
    train.write_bytes(before[:len(before) // 2].rsplit(b"\n", 1)[0] + b"\n")  # fewer rows
    try:
        r = cli(*a, "resume=auto")
    finally:
        train.write_bytes(before)
    assert r.returncode == 2 and len(lines(r.stderr)) == 1, r.stderr[-3000:]
    assert f"data file {train.resolve()} changed since the run started" in r.stderr
    client, (run,) = runs_of(f"sqlite:///{tmp}/mlflow.db")
    assert run.info.status == "KILLED"  # nothing was continued


@pytest.mark.slow
@pytest.mark.subprocess
def test_store_deleted_mid_run_is_one_line_and_a_checkpoint(tmp_path, glue_dir):
    db = tmp_path / "db" / "mlflow.db"
    run = tmp_path / "run"
    proc = start(*LONG, "train.log_every=5", f"data.glue_dir={glue_dir}", f"hydra.run.dir={run}",
                 f"tracking.uri=sqlite:///{db}")
    wait_for(proc, lambda: list((run / "checkpoints").glob("step-*/trainer_state.json")))
    while db.parent.exists():  # the run may add SQLite's journal while the folder is being removed
        shutil.rmtree(db.parent, ignore_errors=True)
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 1, err[-3000:]
    # Progress lines and, on a loaded machine, the long-run estimate (the loop's steps are slow then)
    errors = [ln for ln in lines(err) if not ln.startswith(("train step", "deepen-run: this run needs about"))]
    assert len(errors) == 1 and errors[0].startswith(f"deepen-run: error: the MLflow store sqlite:///{db} failed "
                                                     "mid-run"), err[-3000:]
    assert "Traceback" not in err
    assert json.loads((run / "run.json").read_text())["status"] == "FAILED"
    saved = json.loads(max((run / "checkpoints").glob("step-*/trainer_state.json"),
                           key=lambda p: int(p.parent.name[5:])).read_text())["step"]
    assert saved > 5  # the failure saved the step it reached, not only the periodic checkpoint before it


@pytest.mark.subprocess
def test_a_write_that_fails_once_the_run_exists_ends_it_failed(tmp_path, glue_dir):
    """run.json cannot be written (here a folder holds its name; a full disk does the same): the
    MLflow run already exists and must end FAILED with the error, not stay RUNNING."""
    run_dir = tmp_path / "run"
    (run_dir / "run.json").mkdir(parents=True)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    r = cli(*TINY, "train.max_steps=2", f"data.glue_dir={glue_dir}", f"tracking.uri={uri}", f"hydra.run.dir={run_dir}")
    assert r.returncode == 1 and "IsADirectoryError" in r.stderr, r.stderr[-3000:]
    _, (run,) = runs_of(uri)
    assert run.info.status == "FAILED" and run.data.tags["error"].startswith("IsADirectoryError")


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigkilled_launcher_alone_stops_its_workers(tmp_path, glue_dir):
    """SIGKILL of the joblib launcher only: its loky workers stop their jobs (checkpoint, KILLED) and
    exit, and the resource trackers with them; nothing idles on."""
    sweep = tmp_path / "sweep"
    proc = start("-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seed=1,2,3", *LONG,
                 f"data.glue_dir={glue_dir}", f"hydra.sweep.dir={sweep}", f"tracking.uri=sqlite:///{tmp_path}/m.db")
    # Both running jobs past their first checkpoint (a job still loading when its launcher dies ends
    # KILLED with nothing to save, truthfully; under load one job can start training much later).
    wait_for(proc, lambda: len({p.parents[2] for p in sweep.glob("*/checkpoints/step-*/trainer_state.json")}) == 2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=HANG)
    group = proc.pid  # start_new_session: the launcher's pid is its process group
    t0 = time.time()
    while subprocess.run(["pgrep", "-g", str(group)], capture_output=True).returncode == 0:
        assert time.time() - t0 < 300, subprocess.run(["ps", "-o", "pid,cmd", "-g", str(group)],
                                                      capture_output=True, text=True).stdout
        time.sleep(0.5)
    started = [d for d in sweep.glob("[0-9]*") if (d / "run.json").is_file()]
    assert started
    for d in started:
        assert json.loads((d / "run.json").read_text())["status"] == "KILLED"
        assert list(d.glob("checkpoints/step-*"))


def test_unreadable_task_folder_is_named_before_looking_inside(tmp_path, monkeypatch):
    """Root's stand-in (root reads anything): a folder without read/search permission is named in
    one line; looking for the files inside it would raise EACCES (Path.is_file) as a non-root user."""
    from deepen_run.data import tsv
    from deepen_run.errors import UserError
    from deepen_run.data.glue import get_tasks

    folder = tmp_path / "RTE"
    folder.mkdir()
    for stem in ("train", "dev"):
        (folder / f"{stem}.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n")
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != folder and real(p, mode))
    with pytest.raises(UserError, match=f"folder {folder} is not readable"):
        tsv.check_glue_dir(str(tmp_path), get_tasks(["rte"]))


def signalled_at(target: str, *a, sig: str = "SIGTERM", times: int = 1) -> subprocess.CompletedProcess:
    """deepen-run that sends itself `sig` (`times` times, one after the other) as `module:function` is
    first entered: a signal at an exact point of the run, through the run's real handlers (a kill from
    outside cannot aim this well)."""
    module, function = target.split(":")
    code = forkserver.CODE + "\n".join([
        "import importlib, os, signal, sys, time",
        f"m = importlib.import_module({module!r})",
        f"real, fired = getattr(m, {function!r}), []",
        "def at(*args, **kw):",
        f"    while len(fired) < {times}:",
        f"        fired.append(os.kill(os.getpid(), signal.{sig}))",
        "        time.sleep(0.05)  # the handler has seen this one before the next is sent",
        "    return real(*args, **kw)",
        f"setattr(m, {function!r}, at)",
        "sys.argv[0] = 'deepen-run'",
        "from deepen_run.cli.run import main",
        "main()"])
    return forkserver.run([sys.executable, "-c", code, *isolated(a)], timeout=HANG)


@pytest.mark.subprocess
def test_a_signal_during_an_evaluation_keeps_the_step_and_resume_completes_the_run(tmp_path, glue_dir):
    """SIGTERM at the check before a batch of the mid-training evaluation of step 4 (evaluation's own
    `check`, which no other module's code calls): the run stops there, KILLED with step 4's checkpoint;
    resume=auto evaluates step 4 again and completes the same run, each evaluation logged once."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    a = [*TINY, "train.max_steps=8", "train.eval_every=4", "train.save_every=4", "train.eval_batch_size=16",
         f"data.glue_dir={glue_dir}", f"tracking.uri={uri}", f"hydra.run.dir={tmp_path / 'run'}"]
    r = signalled_at("deepen_run.run.evaluation:check", *a)
    assert r.returncode == 128 + signal.SIGTERM and "checkpoint step-4 kept" in r.stderr, r.stderr[-3000:]
    client, (run,) = runs_of(uri)
    assert run.info.status == "KILLED" and not client.get_metric_history(run.info.run_id, "eval/score")
    r = cli(*a, "resume=auto")
    assert r.returncode == 0, r.stderr[-3000:]
    client, (done,) = runs_of(uri)
    assert done.info.run_id == run.info.run_id and done.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/score")] == [4, 8]


@pytest.mark.subprocess
def test_a_signal_while_a_sweep_opens_is_recorded_and_acted_on_before_any_job(tmp_path, glue_dir):
    """The launcher records signals from the moment it opens the sweep (checks, store, parent run):
    SIGTERM while it checks the store ends the command before the parent run exists, in one line; one
    while the parent run is made lets that write finish, then the sweep stops before any job starts:
    the parent KILLED, every job not started, exit 143 either way, and nothing left RUNNING."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    a = ["-m", "seed=1,2", *TINY, "train.max_steps=2", f"data.glue_dir={glue_dir}", f"tracking.uri={uri}"]
    r = signalled_at("deepen_run.run.lifecycle:reap_orphans", *a, f"hydra.sweep.dir={tmp_path}/one")
    assert r.returncode == 128 + signal.SIGTERM, r.stderr[-3000:]
    assert lines(r.stderr) == ["deepen-run: error: stopped by SIGTERM while the sweep was checked; nothing ran; the "
                               "same command starts it again"], r.stderr[-3000:]
    exp = MlflowClient(uri).get_experiment_by_name("deepen-run")
    assert exp is None or not MlflowClient(uri).search_runs([exp.experiment_id])

    r = signalled_at("deepen_run.sweep.summary:parent_name", *a, f"hydra.sweep.dir={tmp_path}/two")
    assert r.returncode == 128 + signal.SIGTERM and "Traceback" not in r.stderr, r.stderr[-3000:]
    client, runs = runs_of(uri)
    (parent,) = runs
    assert parent.info.status == "KILLED" and parent.data.tags["sweep_role"] == "parent", parent.data.tags
    assert parent.data.tags["interrupted"].startswith("SIGTERM: 0 of 2 jobs finished, 0 killed, 2 not started")


@pytest.mark.subprocess
def test_a_signal_while_the_model_is_published_keeps_the_last_step(tmp_path, glue_dir):
    """Every step trained and recorded, then SIGTERM while the model is published: the last step's
    checkpoint is kept (not an earlier one, nor none), and resume=auto publishes the same run."""
    uri, run = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "run"
    a = [*TINY, "train.max_steps=4", "train.save_best=true", f"data.glue_dir={glue_dir}", f"hydra.run.dir={run}",
         f"tracking.uri={uri}"]
    r = signalled_at("deepen_run.serve.publish:publish", *a)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr[-3000:]
    client, (killed,) = runs_of(uri)
    assert killed.info.status == "KILLED" and "stopped_before_first_step" not in killed.data.tags
    assert (run / "checkpoints" / "step-4").is_dir() and "checkpoint step-4 kept" in r.stderr, r.stderr[-2000:]
    # publish has no check inside: the stop is acted on just after it, and what it wrote is whole
    models = client.search_logged_models([killed.info.experiment_id])
    assert [str(m.status) for m in models] == ["READY"], models
    done = cli(*a, "resume=auto")
    assert done.returncode == 0, done.stderr[-3000:]
    client, (again,) = runs_of(uri)
    assert again.info.run_id == killed.info.run_id and again.info.status == "FINISHED"
    assert client.search_logged_models([again.info.experiment_id])


@pytest.mark.subprocess
def test_a_run_stopped_before_its_first_step_resumes_into_a_whole_record(tmp_path, glue_dir):
    """SIGTERM as run.json is written (the run exists, no step yet): KILLED and tagged so; resume=auto
    runs it from step 0 as the same run, which ends FINISHED without that tag and with its GLUE files."""
    uri, run = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "run"
    a = [*TINY, "train.max_steps=4", f"data.glue_dir={glue_dir}", f"hydra.run.dir={run}", f"tracking.uri={uri}"]
    r = signalled_at("deepen_run.run.resume:write_run_file", *a)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr[-3000:]
    client, (killed,) = runs_of(uri)
    assert killed.info.status == "KILLED" and killed.data.tags.get("stopped_before_first_step") == "true"
    done = cli(*a, "resume=auto")
    assert done.returncode == 0, done.stderr[-3000:]
    client, (again,) = runs_of(uri)
    assert again.info.run_id == killed.info.run_id and again.info.status == "FINISHED"
    assert "stopped_before_first_step" not in again.data.tags
    assert {d.dataset.name for d in again.inputs.dataset_inputs} == {"rte/train", "rte/dev"}


@pytest.mark.subprocess
def test_a_signal_between_two_log_lines_resumes_to_the_same_logged_loss(tmp_path, glue_dir):
    """SIGTERM at step 6 of 10 with log_every=4: the checkpoint of step 6 keeps the loss of steps 5-6,
    so the resumed run's train/loss at step 8 (and every metric) equals an uninterrupted run's."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    a = [*TINY, "train.max_steps=10", "train.log_every=4", f"data.glue_dir={glue_dir}", f"tracking.uri={uri}"]
    assert cli(*a, f"hydra.run.dir={tmp_path / 'whole'}", "tracking.experiment=whole").returncode == 0
    b = [*a, f"hydra.run.dir={tmp_path / 'cut'}", "tracking.experiment=cut"]
    r = signalled_at("deepen_run.run.bookkeeping:long_run_warning", *b)  # the check after step 6 (1 + TIMED_STEPS)
    assert r.returncode == 128 + signal.SIGTERM and "checkpoint step-6 kept" in r.stderr, r.stderr[-3000:]
    assert cli(*b, "resume=auto").returncode == 0
    (whole,), (cut,) = runs_of(uri, "whole")[1], runs_of(uri, "cut")[1]
    client = runs_of(uri, "whole")[0]
    keys = [k for k in whole.data.metrics if k.startswith(("train/loss", "train/lr", "eval/"))]
    assert "train/loss" in keys and set(keys) <= set(cut.data.metrics)
    for k in keys:
        history = [[(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)] for run in (whole, cut)]
        assert history[0] == history[1], k


@pytest.mark.subprocess
def test_sigterm_while_the_runner_imports_mlflow_is_exit_143_and_one_line(tmp_path, glue_dir):
    """Issue 63, case 5: SIGTERM while the runner imports mlflow (just after the pre-flight) was raised
    inside CPython's import machinery: exit 1 and a double traceback ("partially initialized module
    'mlflow'"), which a scheduler that requeues on 143 reads as a failure. Recorded only, it stops
    the command at the runner's next check: exit 143, one line."""
    code = "\n".join([
        "import importlib.abc, os, signal, sys",
        "class AtMlflow(importlib.abc.MetaPathFinder):",
        "    def find_spec(self, name, path, target=None):",
        "        if name == 'mlflow':",
        "            sys.meta_path.remove(self)",
        "            os.kill(os.getpid(), signal.SIGTERM)",
        "        return None",
        "sys.meta_path.insert(0, AtMlflow())",
        "sys.argv[0] = 'deepen-run'",
        "from deepen_run.cli.run import main",
        "main()"])
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    a = [*TINY, "train.max_steps=4", f"data.glue_dir={glue_dir}", f"hydra.run.dir={tmp_path / 'run'}",
         f"tracking.uri={uri}"]
    r = subprocess.run([sys.executable, "-c", code, *isolated(a)], capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr[-3000:]
    assert lines(r.stderr) == ["deepen-run: stopped by SIGTERM; no MLflow run had started yet; nothing to continue"]
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("deepen-run")  # and indeed none is in the store
    assert exp is None or not client.search_runs([exp.experiment_id])


@pytest.mark.subprocess
def test_a_ctrl_c_while_a_task_is_tokenized_stops_once_that_task_is_done(tmp_path, glue_dir):
    """docs/reliability.md, Stopping by agreement: a first Ctrl-C as the first task's tokenization starts
    (empty cache, two tasks) lets that task be tokenized whole, then stops before the next: exit 130,
    the run KILLED with no checkpoint, the second task never tokenized. A second Ctrl-C there ends the
    process at once, by SIGINT itself, before anything more is written."""
    import datasets

    uri, cache = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "cache"
    a = ["task.names=[rte,mrpc]", *TINY[1:], "train.max_steps=4", f"data.glue_dir={glue_dir}", f"tracking.uri={uri}",
         f"data.cache_dir={cache}"]
    r = signalled_at("deepen_run.data.loaders:tokenize", *a, f"hydra.run.dir={tmp_path / 'once'}",
                       "tracking.experiment=once", sig="SIGINT")
    assert r.returncode == 128 + signal.SIGINT, r.stderr[-3000:]
    assert "stopped by SIGINT; the run is KILLED with no checkpoint" in r.stderr, r.stderr[-3000:]
    client, (run,) = runs_of(uri, "once")
    assert run.info.status == "KILLED" and run.data.tags.get("stopped_before_first_step") == "true"
    assert json.loads((tmp_path / "once" / "run.json").read_text())["status"] == "KILLED"
    files = sorted(p.name.split("-")[:2] for p in cache.glob("*.arrow"))
    assert files == [["rte", "dev"], ["rte", "train"]], files  # the first task whole, the second never begun
    assert sorted(len(datasets.Dataset.from_file(str(p))) for p in cache.glob("*.arrow")) == [32, 32]

    shutil.rmtree(cache)
    r = signalled_at("deepen_run.data.loaders:tokenize", *a, f"hydra.run.dir={tmp_path / 'twice'}",
                       "tracking.experiment=twice", sig="SIGINT", times=2)
    assert r.returncode == -signal.SIGINT, r.stderr[-3000:]
    assert "stopped by" not in r.stderr and not list(cache.glob("*.arrow")), r.stderr[-3000:]
    client, (run,) = runs_of(uri, "twice")
    assert run.info.status == "RUNNING"  # ended by the next run's orphan reaping, or continued by resume=auto
    assert cli(*TINY, "dry_run=true", f"data.glue_dir={glue_dir}", f"tracking.uri={uri}",
               "tracking.experiment=twice").returncode == 0  # the next run in the experiment reaps it
    run = client.get_run(run.info.run_id)
    assert run.info.status == "KILLED", run.data.tags
    assert run.data.tags["error"].startswith(f"process {run.data.tags['pid']} exited without ending the run")
