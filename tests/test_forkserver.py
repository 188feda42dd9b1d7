"""The suite starts most commands from a fork server (tests/forkserver.py) that has imported torch,
transformers and MLflow once. A command it runs must behave as the same command in a fresh process:
the same exit code, the same output and the same records."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import forkserver
from conftest import HANG, isolated, runs_of

pytestmark = [pytest.mark.subprocess, pytest.mark.skipif(forkserver.off(), reason="DEEPEN_TEST_FORK=0")]
EXE = str(Path(sys.executable).with_name("deepen-run"))
TINY = ["backbone=tiny", "task=rte", "train.batch_size=8", "data.max_train_samples=32", "data.max_eval_samples=32",
        "data.max_seq_length=32", "train.max_steps=3", "train.eval_every=2"]


def both(argv: list[str]) -> dict[str, subprocess.CompletedProcess]:
    """argv run through the server and as a fresh process; the server must really have run it."""
    before = forkserver.forked
    forked = forkserver.run(argv, timeout=HANG)
    assert forkserver.forked == before + 1, "the command fell back to a fresh process"
    fresh = subprocess.run(argv, capture_output=True, text=True, timeout=HANG)
    return {"fork": forked, "fresh": fresh}


def shape(text: str) -> list[str]:
    """Output lines with what differs between two runs (ids, paths, times, rates) masked."""
    text = re.sub(r"[0-9a-f]{32}", "<id>", text)
    return [re.sub(r"/\S+|\d+(\.\d+)?", "#", line) for line in text.splitlines() if "it/s" not in line]


def test_a_forked_run_ends_records_and_prints_as_a_fresh_process(glue_dir, tmp_path):
    results, histories = {}, {}
    for how in ("fork", "fresh"):
        uri = f"sqlite:///{tmp_path}/{how}/mlflow.db"
        (tmp_path / how).mkdir()
        argv = [EXE, *isolated([*TINY, f"data.glue_dir={glue_dir}", f"tracking.uri={uri}",
                                f"hydra.run.dir={tmp_path}/{how}/run"])]
        r = forkserver.run(argv, timeout=HANG) if how == "fork" else \
            subprocess.run(argv, capture_output=True, text=True, timeout=HANG)
        assert r.returncode == 0, r.stderr[-2000:]
        results[how] = r
        _, (run,) = runs_of(uri)
        assert run.info.status == "FINISHED"
        client = MlflowClient(uri)
        histories[how] = {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)]
                          for k in sorted(run.data.metrics) if not k.startswith("system/") and "time" not in k
                          and "per_second" not in k and "runtime" not in k}
    assert histories["fork"] == histories["fresh"] and histories["fork"]
    assert shape(results["fork"].stdout) == shape(results["fresh"].stdout)


def test_bad_input_and_a_usage_error_end_the_same_way(tmp_path):
    r = both([EXE, "backbone=nope", f"hydra.run.dir={tmp_path}/run"])
    assert r["fork"].returncode == r["fresh"].returncode == 2
    assert r["fork"].stderr == r["fresh"].stderr and "backbone=nope" in r["fork"].stderr
    r = both([sys.executable, "-m", "deepen_run.cli.predict", "--no-such-flag"])
    assert r["fork"].returncode == r["fresh"].returncode == 2
    assert r["fork"].stderr == r["fresh"].stderr and "deepen-predict: error" in r["fork"].stderr


def test_a_command_that_runs_past_its_timeout_is_killed_as_subprocess_run_kills_it(glue_dir, tmp_path):
    argv = [EXE, *isolated([*TINY, "train.max_steps=100000", f"data.glue_dir={glue_dir}"])]
    with pytest.raises(subprocess.TimeoutExpired):  # 100,000 steps: still training, or loading, after 5 s
        forkserver.run(argv, timeout=5)
    # the server goes on serving
    r = forkserver.run([EXE, "backbone=nope", f"hydra.run.dir={tmp_path}/run"], timeout=HANG)
    assert r.returncode == 2


def test_a_forked_popen_is_signalled_waited_on_and_read_as_a_fresh_one(glue_dir, tmp_path):
    """forkserver.popen, for the tests that stop a command while it runs: its pid takes the signal, its
    pipe gives stderr line by line, wait's timeout and poll behave as Popen's, and the run ends as
    docs/reliability.md says (SIGTERM: KILLED with a checkpoint, exit 143)."""
    import signal
    import time

    before = forkserver.forked
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    argv = [EXE, *isolated([*TINY, "train.max_steps=100000", "train.save_every=5", f"data.glue_dir={glue_dir}",
                            f"tracking.uri={uri}", f"hydra.run.dir={tmp_path}/run"])]
    proc = forkserver.popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert forkserver.forked == before + 1 and os.getpgid(proc.pid) == proc.pid  # its own session
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=1)
    t0 = time.time()
    while not list((tmp_path / "run" / "checkpoints").glob("step-*/trainer_state.json")):
        assert proc.poll() is None and time.time() - t0 < HANG, proc.communicate()[1][-2000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=HANG)[1]
    assert proc.returncode == 143 and proc.poll() == 143, err[-2000:]
    _, (run,) = runs_of(uri)
    assert run.info.status == "KILLED" and "SIGTERM" in err
    # A usage error's stderr through the pipe, line by line, is a fresh process's.
    bad = [EXE, "backbone=nope", f"hydra.run.dir={tmp_path}/bad"]
    proc = forkserver.popen(bad, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = list(proc.stderr)
    assert proc.wait(timeout=HANG) == 2 and forkserver.forked == before + 2
    fresh = subprocess.run(bad, capture_output=True, text=True, timeout=HANG)
    assert "".join(lines) == fresh.stderr and "backbone=nope" in fresh.stderr
