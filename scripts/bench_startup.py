"""Start-up section of `make bench`: the whole-process time of a dry run and of a rejected override,
each as a ratio to `python -c "import torch"` measured in the same rounds.

Interleaved rounds (the order rotated each round), one warm-up round first (it creates the MLflow
store and warms the OS file cache), and per-round ratios: a loaded shared machine slows all three
commands of a round alike, so the ratio holds where absolute seconds do not.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Targets (issue 16): a dry run costs at most 2.5 torch imports; a bad override is rejected
# before torch loads, in under half of one.
LIMITS = {"dry run": 2.5, "rejected override": 0.5}


def commands(tmp: str) -> dict[str, tuple[list[str], int]]:
    """name -> (argv, expected exit code)."""
    exe = Path(sys.executable).with_name("deepen-run")
    cli = [str(exe)] if exe.exists() else [sys.executable, "-m", "deepen_run.cli"]
    where = [f"hydra.run.dir={tmp}/run", f"tracking.uri=sqlite:///{tmp}/mlflow.db"]
    return {"import torch": ([sys.executable, "-c", "import torch"], 0),
            "dry run": ([*cli, "task=sst2", "dry_run=true", *where], 0),
            "rejected override": ([*cli, "task=nosuch", *where], 2)}


def timed(argv: list[str], code: int, env: dict) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    wall = time.perf_counter() - t0
    if r.returncode != code:
        raise SystemExit(f"bench: {' '.join(argv)} exited {r.returncode}, expected {code}:\n{r.stderr[-2000:]}")
    return wall


def measure(rounds: int = 3) -> dict:
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="deepen-bench-startup-") as tmp:
        cmds = commands(tmp)
        names = list(cmds)
        times = {n: [] for n in names}
        for r in range(rounds + 1):  # round 0: warm-up
            for n in names[r % len(names):] + names[:r % len(names)]:
                times[n].append(timed(*cmds[n], env))
    ref = times["import torch"][1:]
    out = {n: {"s": statistics.median(t[1:]), "rounds_s": [round(x, 3) for x in t]} for n, t in times.items()}
    for n in LIMITS:
        out[n]["x_import_torch"] = statistics.median([t / b for t, b in zip(times[n][1:], ref)])
    return {"commands": out, "rounds": rounds, "loadavg_start": load0, "loadavg_end": os.getloadavg()}


def targets(startup: dict) -> list[dict]:
    rows = []
    for n, limit in LIMITS.items():
        v = startup["commands"][n]["x_import_torch"]
        rows.append({"target": f"start-up: {n} / `import torch`", "measured": v, "wanted": f"<= {limit}",
                     "met": v <= limit})
    return rows


def markdown(startup: dict) -> str:
    c = startup["commands"]
    lines = [f"### Start-up (whole process, median of {startup['rounds']} interleaved rounds after a warm-up; "
             f"load average {startup['loadavg_start'][0]:.1f} -> {startup['loadavg_end'][0]:.1f})", "",
             "| command | s | x `import torch` |", "|---|---|---|"]
    label = {"import torch": '`python -c "import torch"`', "dry run": "`deepen-run task=sst2 dry_run=true`",
             "rejected override": "`deepen-run task=nosuch` (exit 2)"}
    for n, m in c.items():
        lines.append(f"| {label[n]} | {m['s']:.2f} | {m.get('x_import_torch', 1.0):.2f} |")
    return "\n".join(lines) + "\n"
