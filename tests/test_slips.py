"""Small things a new user trips on: a typo'd key without +, a run that will take hours, the
probe's --help. The real CLI in a subprocess where the behaviour is the process's."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import forkserver
from conftest import HANG, cli, isolated
from deepen_run.run.bookkeeping import long_run_warning


@pytest.mark.subprocess
def test_a_key_without_plus_gets_did_you_mean():
    r = cli("method=hire", "method.gru_layer=1", timeout=HANG)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert "did you mean method.gru_layers?" in lines[0] and "To append" not in lines[0]
    r = cli("sed=3", timeout=HANG)
    assert r.returncode == 2 and "unknown config key sed (did you mean seed?)" in r.stderr


@pytest.mark.subprocess
def test_a_sweep_of_methods_with_a_method_option_points_to_arms(tmp_path):
    r = cli("-m", "method=baseline,hire", "method.gru_layers=1,2", f"hydra.sweep.dir={tmp_path}/s", timeout=HANG)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "unknown config key method.gru_layers" in r.stderr and "+arm=baseline,hire_g1,hire_g2" in r.stderr
    r = cli("-m", "method=hire", "method.gru_layer=1,2", f"hydra.sweep.dir={tmp_path}/s", timeout=HANG)
    assert r.returncode == 2 and "did you mean method.gru_layers?" in r.stderr, r.stderr[-2000:]


def test_long_run_warning_says_how_long_and_how_to_cut_it():
    assert long_run_warning(0.5, 7000) is None  # 58 min
    line = long_run_warning(14.24, 6315)
    assert line.startswith("deepen-run: this run needs about 24 h 59 min more at 14.24 s/step (6,315 steps")
    assert "data.max_train_samples=" in line and "train.max_steps=" in line


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_run_of_hours_says_so_after_its_first_steps(tmp_path, glue_dir):
    exe = Path(sys.executable).with_name("deepen-run")
    args = isolated(["task=rte", "backbone=tiny", "train.max_steps=3000000", "train.batch_size=8",
                     "data.max_train_samples=32", "data.max_eval_samples=32", "data.max_seq_length=32",
                     "train.save_every=0", f"data.glue_dir={glue_dir}"])
    proc = forkserver.popen([str(exe), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    err, t0 = "", time.time()
    try:
        for line in proc.stderr:  # tqdm's bar and the warning share stderr
            err += line
            if "this run needs about" in line:
                break
            assert time.time() - t0 < 600, err[-2000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, rest = proc.communicate(timeout=HANG)
    warn = next(ln for ln in (err + rest).replace("\r", "\n").splitlines() if "this run needs about" in ln)
    assert " h " in warn and "3,000,000" not in warn and "data.max_train_samples=2000" in warn


def test_probe_help_names_its_own_experiment_and_key():
    from deepen_run.cli.probe import ProbeConfig
    from deepen_run.cli.usage import probe_help

    text = probe_help(ProbeConfig)
    assert "tracking.experiment=deepen-probe" in text and "tracking.experiment=deepen-run" not in text
    assert "method.layers" not in text and "suggest for backbone.duplicate_layers" in text
