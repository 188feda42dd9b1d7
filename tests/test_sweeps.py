"""Multiruns: one MLflow parent per sweep, a child per job, parallel jobs on SQLite, a failing job,
the results report. Tiny random BERT on real GLUE RTE files: the mechanics, not learning."""
import csv
import re
import statistics

import pytest

import forkserver
from conftest import HANG, cli, runs_of
from deepen_run.report import main as report

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
@pytest.mark.subprocess
def test_parallel_sweep_is_one_parent_with_a_finished_child_per_job(joblib_sweep):
    uri, r, _ = joblib_sweep
    client, runs = runs_of(uri)
    (parent,), children = split(runs)
    assert len(runs) == 4 and len(children) == 3
    assert parent.info.status == "FINISHED"
    assert "interrupted" not in parent.data.tags  # closed by the sweep's end, not by the exit handler
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
    # The closing hint reaches this store as printed (it once named neither store nor experiment)
    again = next(ln for ln in r.stdout.splitlines() if "the table again" in ln).split("the table again", 1)[1]
    assert again.split() == ["deepen-report", "--sweep-id", sweep_id, "--uri", uri]
    from deepen_run.run.summary import DEFAULT_STORE, store_args

    assert store_args(DEFAULT_STORE, "deepen-run") == "" and store_args(uri, "exp2") == f" --uri {uri} --experiment exp2"
    assert "database is locked" not in r.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_report_cell_is_mean_and_std_of_the_children(joblib_sweep, capsys):
    uri, _, tmp = joblib_sweep
    client, runs = runs_of(uri)
    (parent,), children = split(runs)
    accs = [100 * c.data.metrics["eval/rte/accuracy"] for c in children]
    report.main(["--uri", uri, "--sweep-id", parent.data.tags["sweep_id"], "--out", str(tmp / "rep"),
                 "--log-to-parent"])
    md = capsys.readouterr().out
    head = [c.strip() for c in md.splitlines()[0].strip("|").split("|")]
    row = next(ln for ln in md.splitlines() if ln.startswith("| 1 | tiny | baseline | single-task |"))
    cells = dict(zip(head, [c.strip() for c in row.strip("|").split("|")]))
    assert cells["RTE"] == f"{statistics.fmean(accs):.1f} ± {statistics.stdev(accs):.1f}"
    assert cells["n"] == "3" and float(cells["step (s)"]) > 0
    (rec,) = list(csv.DictReader(open(tmp / "rep" / "results.csv")))
    assert float(rec["rte"]) == pytest.approx(statistics.fmean(accs))
    assert float(rec["rte_std"]) == pytest.approx(statistics.stdev(accs))
    assert (tmp / "rep" / "results.png").stat().st_size > 0
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/results.md", "report/results.csv", "report/results.png"} <= logged


def test_child_run_names_carry_the_swept_values():
    from deepen_run.sweep.summary import child_name

    info = {"params": {"method.gru_layers": "1,2,3", "method.layers": "[2,3]", "seed": "1,2",
                       "train.learning_rate": "interval(1e-5, 1e-4)", "dry_run": "true"}}
    overrides = ["method.gru_layers=2", "method.layers=[2,3]", "seed=1", "train.learning_rate=3e-05", "dry_run=True"]
    # The swept values lead, the seed moves there from the name's end; a plain list value is not a sweep.
    assert child_name("tiny-hire-rte-s1", 1, info, overrides) == "gru_layers=2 seed=1 learning_rate=3e-05 · tiny-hire-rte"


def test_a_job_that_started_as_the_sweep_stopped_stops_itself(tmp_path):
    """The launcher writes the stop file when a signal stops it; a job reads it at each check (a job
    that started as the stop landed, a job on another machine, an idle loky worker that ignored the
    Ctrl-C itself): it stops there, as on the signal itself, instead of training to the end."""
    import signal

    import pytest

    from deepen_run.run.stop import Stopped, StopFlag, check
    from deepen_run.run.clean import JOBS_DIR
    from deepen_run.sweep.jobs import STOP_FILE

    (tmp_path / JOBS_DIR).mkdir()
    flag = StopFlag(tmp_path / JOBS_DIR / STOP_FILE).install()
    try:
        check()  # no stop: the job goes on
        (tmp_path / JOBS_DIR / STOP_FILE).write_text("SIGTERM\n")
        with pytest.raises(Stopped) as e:
            check()
    finally:
        flag.uninstall()
    assert e.value.signum == signal.SIGTERM


@pytest.mark.fresh_store
def test_one_bad_value_launches_nothing(tmp_path, glue_dir):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    rest = [a for a in TINY if not a.startswith("train.batch_size")]
    r = cli("-m", "train.batch_size=8,16,abc,32", *rest, f"data.glue_dir={glue_dir}",
            f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path}/sweep", timeout=HANG)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0] == "deepen-run: error: sweep job 3 of 4 (train.batch_size=abc): train.batch_size=abc: Value " \
                       "'abc' of type 'str' could not be converted to Integer; nothing was launched", lines[0]
    assert "Traceback" not in r.stderr and not (tmp_path / "sweep").exists()
    assert not (tmp_path / "mlflow.db").exists()  # no parent, no child: nothing was recorded


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.fresh_store
def test_a_slurm_time_limit_too_short_for_its_signal_launches_nothing(tmp_path, glue_dir):
    """SLURM may send SIGUSR2 up to 60 s before signal_delay_s: with a 1-min limit and USR2@30 it comes
    while the job starts, which then ends unrequeued. Refused before sbatch (none needed here)."""
    r = cli("-m", "hydra/launcher=submitit_slurm", "hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=30",
            "seed=1,2", *TINY, f"data.glue_dir={glue_dir}", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
            f"hydra.sweep.dir={tmp_path}/sweep", timeout=HANG)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("deepen-run: error: hydra.launcher.signal_delay_s=30 with hydra.launcher.timeout_min=1:"
                               ) and "(timeout_min=3 or more); nothing was launched" in lines[0], lines[0]
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.subprocess
def test_a_bad_value_hydra_finds_after_the_parent_exists_leaves_no_record(tmp_path, glue_dir):
    """glob() keeps the jobs from being enumerated before launch; Hydra's sweeper then refuses
    `train.batch_size=abc` while composing them. One error line naming the value, exit 2, no parent
    run left behind, and the same command, fixed, runs in that sweep dir."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    a = ["-m", "task=glob(rt*)", *[x for x in TINY[1:] if not x.startswith("train.batch_size")],
         f"data.glue_dir={glue_dir}", f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path}/sweep"]
    r = cli(*a, "train.batch_size=8,abc")
    assert r.returncode == 2 and "train.batch_size=abc" in r.stderr and "resume=auto" not in r.stderr, r.stderr[-3000:]
    assert runs_of(uri)[1] == []
    started = re.search(r"parent run (\w+) in", r.stdout)  # the start line named it: the end says it is gone
    assert started and f"no job started; parent run {started.group(1)} deleted" in r.stdout, r.stdout[-2000:]
    assert sorted(x.name for x in (tmp_path / "sweep").iterdir()) == ["multirun.yaml"]  # Hydra's own record
    r = cli(*a, "train.batch_size=8,16")
    assert r.returncode == 0, r.stderr[-3000:]
    (parent,), children = (lambda rs: ([x for x in rs if x.data.tags.get("sweep_role") == "parent"],
                                       [x for x in rs if x.data.tags.get("sweep_role") == "child"]))(runs_of(uri)[1])
    assert parent.info.status == "FINISHED" and len(children) == 2


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_second_ctrl_c_stops_the_launcher_at_once_and_the_next_run_ends_its_parent(tmp_path, glue_dir):
    """docs/reliability.md, A stopped sweep: a second signal of the same kind to a sweep's launcher
    stops it at once, by the signal, leaving its parent RUNNING; the next run in the experiment finds
    the launcher's process gone and ends the parent KILLED. The jobs' processes are held (SIGSTOP)
    while the launcher is signalled, so its first stop cannot complete before the second comes."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil

    from conftest import existing_store

    uri, sweep = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "sweep"
    existing_store(uri)
    exe = Path(sys.executable).with_name("deepen-run")
    long = [a for a in TINY if not a.startswith("train.max_steps")] + ["train.max_steps=100000", "train.save_every=5"]
    proc = forkserver.popen([str(exe), "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seed=1,2", *long,
                             f"data.glue_dir={glue_dir}", f"tracking.uri={uri}", f"hydra.sweep.dir={sweep}",
                             f"data.cache_dir={tmp_path}/cache"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    t0 = time.time()
    while not list(sweep.glob("*/checkpoints/step-*")):  # a job is training
        assert proc.poll() is None and time.time() - t0 < HANG, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    workers = psutil.Process(proc.pid).children(recursive=True)
    for w in workers:
        w.suspend()
    try:
        os.kill(proc.pid, signal.SIGINT)  # the launcher alone: it writes STOP and waits for its jobs
        while not (sweep / "deepen_jobs" / "STOP").is_file():
            assert proc.poll() is None and time.time() - t0 < HANG, proc.communicate()[1][-3000:]
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=HANG)  # not communicate(): the held workers keep its stderr open until they go
    finally:
        for w in workers:
            if w.is_running():
                w.resume()
    err = proc.stderr.read()  # the end of the file comes once the resumed workers have exited
    assert proc.returncode == -signal.SIGINT, err[-3000:]
    assert "sweep stopped by" not in err, err[-3000:]
    client, runs = runs_of(uri)
    (parent,), _ = split(runs)
    assert parent.info.status == "RUNNING"
    t0 = time.time()  # the workers, their launcher gone, stop their jobs (checkpoint, KILLED) and exit
    while subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True).returncode == 0:
        assert time.time() - t0 < HANG
        time.sleep(0.5)
    r = cli("backbone=tiny", "task=rte", "dry_run=true", f"data.glue_dir={glue_dir}", f"tracking.uri={uri}")
    assert r.returncode == 0, r.stderr[-3000:]
    client, runs = runs_of(uri)
    (parent,), children = split(runs)
    assert parent.info.status == "KILLED", parent.data.tags
    assert parent.data.tags["error"].startswith(f"process {proc.pid} exited without ending the run")
    assert children and not [r for r in runs if r.info.status == "RUNNING"], [(r.info.run_name, r.info.status)
                                                                                for r in runs]


def test_a_ctrl_c_while_a_sweep_starts_is_one_line_and_exit_130(tmp_path, glue_dir):
    """A Ctrl-C 0.3 s after the command, while the sweep is most likely still composed (Python's
    KeyboardInterrupt, caught) or checked (recorded by the launcher, acted on before the parent run is
    made), ends it with one line and exit 130, not a traceback; one that comes later stops it as a
    stopped sweep. Its jobs would train for hours: it can only end by the signal. Every way: exit 130."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    exe = Path(sys.executable).with_name("deepen-run")
    args = [a for a in TINY if not a.startswith("train.max_steps")]
    proc = forkserver.popen([str(exe), "-m", "seed=1,2", *args, "train.max_steps=100000", f"data.glue_dir={glue_dir}",
                             f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.sweep.dir={tmp_path}/sweep"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    said = ("stopped by SIGINT while starting", "stopped by SIGINT while the sweep was checked", "sweep stopped by SIGINT")
    assert any(s in err for s in said), err[-3000:]


def test_sigterm_to_a_basic_sweep_ends_its_job_then_goes_on_to_the_launcher_which_stops_the_sweep(tmp_path, glue_dir):
    """The basic launcher runs its jobs in its own process, where the job's handler replaces the
    launcher's: the job saves and ends KILLED, then hands the signal on to the launcher's handler,
    which writes STOP, so the second job never starts; exit 143, the parent KILLED."""
    import json
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    sweep, uri = tmp_path / "sweep", f"sqlite:///{tmp_path}/mlflow.db"
    exe = Path(sys.executable).with_name("deepen-run")
    args = [a for a in TINY if not a.startswith("train.max_steps")]
    proc = forkserver.popen([str(exe), "-m", "seed=1,2", *args, "train.max_steps=100000", "train.save_every=5",
                             f"data.glue_dir={glue_dir}", f"tracking.uri={uri}", f"hydra.sweep.dir={sweep}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    t0 = time.time()
    while not list(sweep.glob("0/checkpoints/step-*")):
        assert proc.poll() is None and time.time() - t0 < HANG, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    jobs = sweep / "deepen_jobs"
    assert (jobs / "STOP").read_text().strip() == "SIGTERM" and not (jobs / "1.start.json").exists()
    assert json.loads((jobs / "0.json").read_text())["status"] == "KILLED"
    client, runs = runs_of(uri)
    (parent,), children = split(runs)
    assert parent.info.status == "KILLED" and [c.info.status for c in children] == ["KILLED"], parent.data.tags
    assert parent.data.tags["interrupted"].startswith("SIGTERM: 0 of 2 jobs finished, 1 killed, 1 not started")


def test_a_ctrl_c_of_a_submitit_local_sweep_ends_it_as_a_stopped_sweep(tmp_path, glue_dir):
    """submitit's launcher raises on the jobs the Ctrl-C interrupted (UncompletedJobError): the sweep was
    stopped, not failed, so exit 130, the stopped sweep's line and its parent KILLED, not a traceback of
    the launcher's and exit 1. (submitit's own controllers also get the Ctrl-C and print theirs.)"""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    sweep, uri = tmp_path / "sweep", f"sqlite:///{tmp_path}/mlflow.db"
    exe = Path(sys.executable).with_name("deepen-run")
    args = [a for a in TINY if not a.startswith("train.max_steps")]
    proc = forkserver.popen([str(exe), "-m", "hydra/launcher=submitit_local", "seed=1", *args, "train.max_steps=100000",
                             "train.save_every=5", f"data.glue_dir={glue_dir}", f"tracking.uri={uri}",
                             f"hydra.sweep.dir={sweep}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    t0 = time.time()
    while len(list(sweep.glob("0/checkpoints/step-*"))) < 2:
        assert proc.poll() is None and time.time() - t0 < HANG, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the launcher, submitit's controllers, the jobs
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 130 and "deepen-run: sweep stopped by SIGINT" in err, err[-3000:]
    assert "UncompletedJobError" not in err, err[-3000:]
    client, runs = runs_of(uri)
    (parent,), _ = split(runs)
    assert parent.info.status == "KILLED" and parent.data.tags["interrupted"].startswith("SIGINT: 0 of 1 jobs finished")
