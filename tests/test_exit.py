"""The quick exit after a run (util.QuickExit, the console script's `entry`) loses nothing: other
threads finish, atexit handlers run, buffered output reaches the pipe, the exit code is kept; and
a real run through the entry point leaves its whole log and a FINISHED run. The metric imports
started in the background (metrics.preload) are done by the time the thread joins."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import HANG, isolated

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}

EXITING = textwrap.dedent("""
    import atexit, sys, threading, time
    from deepen_run.util import QuickExit

    exit_now = QuickExit()  # as cli.run.entry does, before anything else registers at exit
    atexit.register(lambda: print("atexit ran"))
    def late():
        time.sleep(0.3)
        print("thread done")
    threading.Thread(target=late).start()
    sys.stdout.write("buffered, never flushed by hand")
    print("to stderr", file=sys.stderr)
    exit_now(3)
    print("not reached")
""")


def test_exit_now_keeps_output_threads_atexit_and_the_code():
    r = subprocess.run([sys.executable, "-c", EXITING], capture_output=True, text=True, env=ENV, timeout=HANG)
    assert r.returncode == 3, r.stderr
    # stdout to a pipe is block-buffered: all of it arrives only because exit_now flushes it
    assert r.stdout == "buffered, never flushed by handthread done\natexit ran\n", r.stdout
    assert r.stderr == "to stderr\n"


def test_preload_imports_the_metric_libraries():
    code = ("import sys\nfrom deepen_run.data import metrics\nt = metrics.preload()\nt.join()\n"
            "print(all(m in sys.modules for m in ('evaluate', 'scipy.stats', 'sklearn.metrics')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=HANG)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_run_through_the_entry_point_ends_whole(tmp_path, glue_dir):
    """`python -m deepen_run.cli.run` is the console script's `entry` (main, then exit_now)."""
    from mlflow.tracking import MlflowClient

    run = tmp_path / "run"
    args = isolated(["backbone=tiny", "task=rte", "train.max_steps=3", f"hydra.run.dir={run}",
                     "data.max_eval_samples=16", "tracking.experiment=exit"])
    r = subprocess.run([sys.executable, "-m", "deepen_run.cli.run", *args], capture_output=True, text=True,
                       env=ENV, timeout=HANG)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "eval/score" in r.stdout  # the summary, printed last, reached the pipe
    log = (run / "cli.log").read_text()
    assert "FINISHED" in log and "eval/score" in log  # the log handler was flushed and closed
    uri = next(a.split("=", 1)[1] for a in args if a.startswith("tracking.uri="))
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("exit").experiment_id])
    assert [x.info.status for x in runs] == ["FINISHED"] and "eval/score" in runs[0].data.metrics


def test_exit_now_stops_a_thread_pool_as_the_interpreter_does():
    """A pool's idle non-daemon workers end through the hook the interpreter runs at exit; joining
    them first would wait forever."""
    code = ("from concurrent.futures import ThreadPoolExecutor\nfrom deepen_run.util import QuickExit\n"
            "exit_now = QuickExit()\npool = ThreadPoolExecutor(2)\nprint(pool.submit(lambda: 'pool ran').result())\nexit_now(0)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode == 0 and r.stdout == "pool ran\n", r.stderr


def test_metric_imports_cut_short_by_the_exit_print_nothing():
    """A run that fails right after its first step exits while the background imports still run;
    the interpreter's shutdown then refuses the atexit hook an import registers. The imports are a
    head start only: nothing reaches stderr (train.fit also joins the thread before it returns)."""
    code = "import sys\nfrom deepen_run.data import metrics\nmetrics.preload()\nsys.exit(3)\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=HANG)
    assert r.returncode == 3 and r.stderr == "", r.stderr[-3000:]
