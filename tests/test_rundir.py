"""deepen-run deletes only files it created (deepen_run/run/rundir.py), tried with the real CLI."""
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

import forkserver
from conftest import HANG, cli, existing_store, isolated
from test_bad_input import snapshot, user_folder




@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.fresh_store
def test_a_folder_of_the_users_is_refused_and_untouched(tmp_path):
    """The issue's report: `hydra.run.dir=. seed=-1` from ~/thesis emptied it. Now: one line naming the
    folder, exit 2, every file in place; the same for a sweep dir."""
    work = tmp_path / "thesis"
    before = user_folder(work)
    r = subprocess.run([str(Path(sys.executable).with_name("deepen-run")), "hydra.run.dir=.", "seed=-1",
                        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"], cwd=work, capture_output=True, text=True,
                       timeout=HANG)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and f"hydra.run.dir={work}" in r.stderr and "paper.tex" in r.stderr
    assert snapshot(work) == before
    r = cli("-m", "seed=1,2", f"hydra.sweep.dir={work}", "backbone=tiny")
    assert r.returncode == 2 and "hydra.sweep.dir" in r.stderr, r.stderr
    assert snapshot(work) == before
    assert not (tmp_path / "mlflow.db").exists()  # refused before the sweep's parent run


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_failed_attempt_in_a_run_dir_of_ours_removes_only_what_it_made(tmp_path, glue_dir):
    """A dir deepen-run made (run.json) with a note the user added: a pre-flight error keeps both, and
    everything else that was there; an empty folder the user made keeps only the attempt's log."""
    run = tmp_path / "old-run"
    (run / ".hydra").mkdir(parents=True)
    (run / "run.json").write_text('{"status": "FINISHED"}')
    (run / "notes.txt").write_text("looked good\n")
    before = snapshot(run)
    r = cli("backbone=tiny", f"hydra.run.dir={run}", "train.learning_rate=0")
    # The dir's FINISHED run is named before Hydra writes anything: its .hydra/ is that run's record.
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "holds the FINISHED run" in r.stderr, r.stderr
    assert snapshot(run) == before
    (run / "run.json").unlink()
    (run / "run_config.yaml").write_text("seed: 1\n")  # a run of ours that never reached MLflow
    before = snapshot(run)
    r = cli("backbone=tiny", f"hydra.run.dir={run}", "train.learning_rate=0")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "learning_rate" in r.stderr, r.stderr
    after = snapshot(run)
    assert {k: v for k, v in after.items() if not k.startswith(".hydra") and not k.endswith(".log")} == \
        {k: v for k, v in before.items() if not k.startswith(".hydra")}
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli("backbone=tiny", f"hydra.run.dir={empty}", "seed=-1")
    assert r.returncode == 2
    assert sorted(p.name for p in empty.iterdir()) == ["cli.log"]
    assert "seed=-1" in (empty / "cli.log").read_text()


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_run_dir_keeps_the_runs_log_and_no_lock_file(tmp_path, glue_dir):
    run = tmp_path / "run"
    r = cli("backbone=tiny", "task=rte", "train.max_steps=3", f"hydra.run.dir={run}", "data.max_eval_samples=16")
    assert r.returncode == 0, r.stderr[-2000:]
    log = (run / "cli.log").read_text()
    assert "FINISHED" in log and "params:" in log and "\r" not in log
    assert not (run / ".lock").exists()


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_second_process_refused_by_the_lock_writes_nothing(tmp_path, glue_dir):
    """While a live run holds its dir (paused with SIGSTOP so it writes nothing itself), a second command
    in that dir exits 2, and the first run's .hydra/ and log are byte-identical afterwards."""
    run = tmp_path / "run"
    args = isolated(["backbone=tiny", "task=rte", "train.max_steps=100000", f"hydra.run.dir={run}"])
    first = forkserver.popen([str(Path(sys.executable).with_name("deepen-run")), *args],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + HANG
        while not (run / "run.json").exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.5)
        assert first.poll() is None, "the first run ended early"
        os.kill(first.pid, signal.SIGSTOP)
        before = {k: v for k, v in snapshot(run).items() if k.startswith(".hydra") or k.endswith(".log")}
        r = cli("backbone=tiny", "task=rte", f"hydra.run.dir={run}", "seed=7")
        assert r.returncode == 2 and "in use by another run" in r.stderr, r.stderr
        assert {k: v for k, v in snapshot(run).items() if k.startswith(".hydra") or k.endswith(".log")} == before
    finally:  # cleanup only (how a run ends on a signal is tested in test_resume and test_faults)
        first.kill()
        os.kill(first.pid, signal.SIGCONT)
        first.wait(timeout=HANG)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_resume_refused_for_its_dir_leaves_every_record_as_it_was(tmp_path, glue_dir):
    """resume=auto in a FINISHED run's dir, or in an unfinished run's dir with another config: refused
    before Hydra rewrites that run's .hydra/ and log. resume=<a live run's dir>: the dir the command
    made goes, and the line names the fix that applies. In a run dir, a numbered folder is the user's."""
    import fcntl

    from test_faults import signalled_at

    a = ["backbone=tiny", "task=rte", "train.max_steps=2", "data.max_train_samples=16", "data.max_eval_samples=16",
         "train.save_best=true", f"data.glue_dir={glue_dir}"]
    done = tmp_path / "done"
    assert cli(*a, f"hydra.run.dir={done}").returncode == 0
    before = snapshot(done)
    r = cli(*a, f"hydra.run.dir={done}", "resume=auto", "seed=7")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "holds the FINISHED run" in r.stderr, r.stderr
    assert snapshot(done) == before

    killed = tmp_path / "killed"  # KILLED with its last step's checkpoint
    assert signalled_at("deepen_run.serve.publish:publish", *a, f"hydra.run.dir={killed}").returncode == 143
    before = snapshot(killed)
    r = cli(*a, f"hydra.run.dir={killed}", "resume=auto", "seed=7")
    assert r.returncode == 2 and "of another config: seed was 42, now 7" in r.stderr, r.stderr
    assert snapshot(killed) == before
    r = cli(*a, f"hydra.run.dir={killed}")  # a new run (no resume) there
    assert r.returncode == 2 and "holds the unfinished run" in r.stderr and "with checkpoints" in r.stderr, r.stderr
    assert snapshot(killed) == before
    r = cli(*a, f"hydra.run.dir={tmp_path / 'elsewhere'}", f"resume={killed}", "seed=7")  # resume=<dir>, changed
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and f"resume: seed was 42 in {killed} but is 7" in r.stderr, r.stderr
    assert snapshot(killed) == before and not (tmp_path / "elsewhere").exists()
    with open(killed / ".lock", "a+") as held:  # as a live run holds its dir
        fcntl.flock(held, fcntl.LOCK_EX)
        r = cli(*a, f"hydra.run.dir={tmp_path / 'made' / 'new'}", f"resume={killed}")
    assert r.returncode == 2 and "is in use by another run" in r.stderr, r.stderr
    assert r.stderr.strip().endswith("one run dir holds one run: wait for that run to end"), r.stderr
    assert not (tmp_path / "made").exists()

    mine = tmp_path / "mine"
    (mine / "2024").mkdir(parents=True)
    (mine / "2024" / "notes.txt").write_text("mine\n")
    r = cli(*a, f"hydra.run.dir={mine}")
    assert r.returncode == 2 and "already holds files deepen-run did not make (2024)" in r.stderr, r.stderr
    assert [str(p.relative_to(mine)) for p in sorted(mine.rglob("*"))] == ["2024", "2024/notes.txt"]


@pytest.mark.parametrize("store", [False, True])
def test_make_clean_removes_only_what_deepen_run_wrote(tmp_path, store):
    from deepen_run.run.clean import clean

    out = tmp_path / "outputs"
    files = {"runs/d/t1/.hydra/config.yaml": "a", "runs/d/t1/cli.log": "", "runs/d/t1/run.json": "{}",
             "runs/d/t1/checkpoints/best/model.safetensors": "w",
             "runs/d/t3-probe/.hydra/config.yaml": "", "runs/d/t3-probe/probe_cli.log": "",  # deepen-probe's
             "multiruns/d/s/multirun.yaml": "", "multiruns/d/s/deepen_sweep.json": "{}",
             "multiruns/d/s/0/.hydra/config.yaml": "", "multiruns/d/s/0/cli.log": "",
             "runs/d/mine/paper.tex": "x", "runs/d/t2/run.json": "{}", "runs/d/t2/notes.txt": "mine",
             "cache/sst2-train-abc.arrow": "", "cache/notes.txt": "mine", "mlflow.db": "", "mlartifacts/1/x": "",
             "my-results.csv": "mine"}
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    clean(out, store=store)
    left = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert left == {"runs/d/mine/paper.tex", "runs/d/t2/run.json", "runs/d/t2/notes.txt", "cache/notes.txt",
                    "my-results.csv"} | (set() if store else {"mlflow.db", "mlartifacts/1/x"})


def test_make_clean_needs_no_virtualenv(tmp_path):
    """`make clean` on a clone without .venv: the cleaner is the standard library alone (python -S -I:
    no site-packages, so neither hydra nor torch can be imported)."""
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "outputs"
    (out / "runs/d/t1/.hydra").mkdir(parents=True)
    (out / "runs/d/t1/run.json").write_text("{}")
    (out / "runs/d/t2").mkdir(parents=True)
    (out / "runs/d/t2/thesis.tex").write_text("x")
    code = f"import sys; sys.path.insert(0, {str(root)!r}); import runpy; sys.argv = ['clean', {str(out)!r}]; " \
           "runpy.run_module('deepen_run.run.clean', run_name='__main__')"
    r = subprocess.run([sys.executable, "-S", "-I", "-c", code], capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 0, r.stderr
    assert not (out / "runs/d/t1").exists() and (out / "runs/d/t2/thesis.tex").is_file()
    assert "kept" in r.stdout and "t2" in r.stdout


@contextmanager
def unremovable(f: Path):
    """While inside, `f` cannot be removed: root ignores permissions, so as root the file is made
    immutable (chattr +i, ext4/xfs/btrfs); otherwise its folder is made read-only. Undone on the way out."""
    import shutil

    if os.geteuid() != 0:
        mode = f.parent.stat().st_mode
        f.parent.chmod(0o555)
        undo = lambda: f.parent.chmod(mode)  # noqa: E731
    else:
        made = subprocess.run(["chattr", "+i", str(f)], capture_output=True, text=True) if shutil.which("chattr") \
            else None
        if made is None or made.returncode != 0:
            pytest.skip("root removes anything and chattr +i does not work here: "
                        f"{made.stderr.strip() if made else 'no chattr'}")
        undo = lambda: subprocess.run(["chattr", "-i", str(f)], check=True)  # noqa: E731
    try:
        yield
    finally:
        undo()


def test_an_entry_a_cleanup_cannot_remove_is_one_line_and_the_rest_goes_on(tmp_path, capsys):
    """docs/reliability.md, Cleanups: an entry that cannot be removed is one line naming it, and the
    rest goes on, with no OSError traceback: `make clean` (its very command, in a process of its own)
    and a failed attempt's removal in a run dir that existed."""
    from deepen_run.run.rundir import Listing

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "outputs"
    stuck = out / "runs/d/t1/checkpoints/best/model.safetensors"
    for name in ("runs/d/t1/run.json", "runs/d/t2/run.json", "runs/d/t2/.hydra/config.yaml",
                 "cache/rte-train-abc.arrow", stuck.relative_to(out)):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("{}")
    with unremovable(stuck):
        r = subprocess.run([sys.executable, "-m", "deepen_run.run.clean", str(out)], capture_output=True, text=True,
                           timeout=HANG, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, r.stderr[-2000:]
    said = [ln for ln in r.stdout.splitlines() if str(stuck) in ln]
    assert len(said) == 1 and said[0].startswith(f"kept could not remove {stuck}:"), r.stdout
    assert stuck.is_file() and not (out / "runs/d/t1/run.json").exists()  # the rest of its dir went
    assert not (out / "runs/d/t2").exists() and not (out / "cache/rte-train-abc.arrow").exists()

    run = tmp_path / "run"  # a failed attempt in a dir that existed: its new entries go, but the stuck one
    run.mkdir()
    (run / "old.txt").write_text("before")
    listing = Listing(run)
    (run / "checkpoints/step-1").mkdir(parents=True)
    (run / "checkpoints/step-1/model.safetensors").write_text("w")
    (run / "run.json").write_text("{}")
    capsys.readouterr()
    with unremovable(run / "checkpoints/step-1/model.safetensors"):
        listing.remove_created()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"deepen-run: kept could not remove {run}/checkpoints/step-1/"), err
    assert not (run / "run.json").exists() and (run / "old.txt").read_text() == "before"


@pytest.mark.subprocess
def test_default_run_dirs_of_two_runs_started_at_once_never_collide(tmp_path, glue_dir):
    """docs/reliability.md, One run per run dir: two runs started at the same moment without a
    hydra.run.dir each get a dir of their own (the default's time has microseconds), and neither is
    refused as in use. The default is rooted in this test's tmp folder instead of the checkout."""
    import json
    import re

    from omegaconf import OmegaConf

    from deepen_run.config.schema import ROOT

    default = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "config.yaml"))["hydra"]["run"]["dir"]
    assert default.startswith("${root:}/outputs/runs/"), default
    # Each process loads what it needs, waits for the other, then both go on at the same whole second.
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    code = forkserver.CODE + "\n".join([  # two forks of the tests' server: two processes all the same
        "import os, sys, time",
        "from pathlib import Path",
        "from deepen_run.cli.run import main",
        f"barrier = Path({str(barrier)!r})",
        "(barrier / str(os.getpid())).touch()",
        "while len(list(barrier.iterdir())) < 2:",
        "    time.sleep(0.01)",
        "time.sleep(1 - time.time() % 1)",
        "sys.argv[0] = 'deepen-run'",
        "main()"])
    args = [sys.executable, "-c", code, "backbone=tiny", "task=rte", "dry_run=true", f"data.glue_dir={glue_dir}",
            f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"data.cache_dir={tmp_path}/cache",
            f"hydra.run.dir={default.replace('${root:}', str(tmp_path))}"]
    existing_store(f"sqlite:///{tmp_path}/mlflow.db")
    procs = [forkserver.popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    ends = [p.communicate(timeout=HANG) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in ends]
    dirs = sorted((tmp_path / "outputs" / "runs").glob("*/*"))
    assert len(dirs) == 2 and all(re.fullmatch(r"\d\d-\d\d-\d\d-\d{6}", d.name) for d in dirs), dirs
    assert len({json.loads((d / "run.json").read_text())["run_id"] for d in dirs}) == 2
