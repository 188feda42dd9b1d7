"""Whole-process section of `make bench`: start-up cost and HIRE's whole-run cost.

1. Start-up: a dry run and a rejected override, each as a ratio to `python -c "import torch"`
   measured in the same round; beside them, the imports a dry run cannot avoid (torch, transformers'
   BERT code, MLflow with its SQL store, Hydra) timed alone, so the dry run's own overhead shows.
2. Whole run: `deepen-run task=sst2 train.max_steps=60` with method=hire and method=baseline, side by
   side, as the ratio hire / baseline (issue 16: <= 2.05x). A 1-step run first builds the tokenized
   data cache both share, so neither pays for it.

Rounds are interleaved with the order rotated each round, and every ratio is a median of per-round
ratios: a loaded shared machine slows the commands of one round alike, so ratios hold where absolute
seconds do not. A start-up warm-up round comes first (it creates the MLflow store, warms the file cache).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Targets (issue 16): a dry run costs at most 2.5 torch imports; a bad override is rejected before
# torch loads, in under half of one; a 60-step HIRE run costs at most 2.05 baseline runs.
LIMITS = {"dry run": 2.5, "rejected override": 0.5}
WHOLE_LIMIT = 2.05
FLOOR = ("import torch, hydra, mlflow, transformers.models.bert.modeling_bert; "
         "from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore")
LABELS = {"import torch": '`python -c "import torch"`',
          "dry-run imports": "the dry run's imports alone (torch, transformers' BERT, MLflow's SQL store, Hydra)",
          "dry run": "`deepen-run task=sst2 dry_run=true`",
          "rejected override": "`deepen-run task=nosuch` (exit 2)",
          "baseline": "`deepen-run task=sst2 train.max_steps=60`",
          "hire": "`deepen-run task=sst2 train.max_steps=60 method=hire`"}


def _cli() -> list[str]:
    exe = Path(sys.executable).with_name("deepen-run")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "deepen_run.cli.run"]


def _where(tmp: str, name: str) -> list[str]:
    return [f"hydra.run.dir={tmp}/{name}", f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"data.cache_dir={tmp}/cache"]


def startup_commands(tmp: str, r: int) -> dict[str, tuple[list[str], int]]:
    """name -> (argv, expected exit code)."""
    return {"import torch": ([sys.executable, "-c", "import torch"], 0),
            "dry-run imports": ([sys.executable, "-c", FLOOR], 0),
            "dry run": ([*_cli(), "task=sst2", "dry_run=true", *_where(tmp, f"dry-{r}")], 0),
            "rejected override": ([*_cli(), "task=nosuch", *_where(tmp, f"bad-{r}")], 2)}


def whole_commands(tmp: str, r: int) -> dict[str, tuple[list[str], int]]:
    run = [*_cli(), "task=sst2", "train.max_steps=60"]
    return {m: ([*run, f"method={m}", *_where(tmp, f"{m}-{r}")], 0) for m in ("baseline", "hire")}


def timed(argv: list[str], code: int, env: dict) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    if r.returncode != code:
        raise SystemExit(f"bench: {' '.join(argv)} exited {r.returncode}, expected {code}:\n{r.stderr[-2000:]}")
    return wall


def _rounds(cmds_of, rounds: int, env: dict, warmup: bool) -> dict[str, list[float]]:
    names = list(cmds_of(0))
    times = {n: [] for n in names}
    for r in range(rounds + warmup):
        cmds = cmds_of(r)
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(timed(*cmds[n], env))
    return {n: t[warmup:] for n, t in times.items()}


def _summary(times: dict[str, list[float]], ref: str, ratio_of) -> dict:
    out = {n: {"s": statistics.median(t), "rounds_s": [round(x, 3) for x in t]} for n, t in times.items()}
    for n in ratio_of:
        out[n]["x_" + ref.replace(" ", "_")] = statistics.median([t / b for t, b in zip(times[n], times[ref])])
    return out


def measure(rounds: int = 3, whole_rounds: int = 2) -> dict:
    """whole_rounds = 0 skips the 60-step runs (about 3 minutes a round on 2 CPU cores)."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="deepen-bench-process-") as tmp:
        times = _rounds(lambda r: startup_commands(tmp, r), rounds, env, warmup=True)
        out = {"commands": _summary(times, "import torch", ["dry-run imports", *LIMITS]),
               "rounds": rounds, "loadavg_start": load0}
        if whole_rounds:
            print("bench: whole 60-step runs, hire vs baseline", flush=True)
            timed([*_cli(), "task=sst2", "train.max_steps=1", "data.max_eval_samples=8", *_where(tmp, "warm")], 0, env)
            times = _rounds(lambda r: whole_commands(tmp, r), whole_rounds, env, warmup=False)
            out["whole"] = _summary(times, "baseline", ["hire"])
            out["whole_rounds"] = whole_rounds
    out["loadavg_end"] = os.getloadavg()
    return out


def targets(p: dict) -> list[dict]:
    rows = [(f"start-up: {n} / `import torch`", p["commands"][n]["x_import_torch"], limit)
            for n, limit in LIMITS.items()]
    c = p["commands"]  # issue 24: a dry run faster than the imports it cannot avoid, timed alone
    per_round = [d / i for d, i in zip(c["dry run"]["rounds_s"], c["dry-run imports"]["rounds_s"])]
    rows.append(("start-up: dry run / its imports alone", statistics.median(per_round), 1.0))
    if "whole" in p:
        rows.append(("whole 60-step SST-2 run: hire / baseline", p["whole"]["hire"]["x_baseline"], WHOLE_LIMIT))
    return [{"target": t, "measured": v, "wanted": f"<= {limit}", "met": v <= limit} for t, v, limit in rows]


def markdown(p: dict) -> str:
    lines = [f"### Start-up (whole process, median of {p['rounds']} interleaved rounds after a warm-up; "
             f"load average {p['loadavg_start'][0]:.1f} -> {p['loadavg_end'][0]:.1f})", "",
             "| command | s | x `import torch` |", "|---|---|---|"]
    for n, m in p["commands"].items():
        lines.append(f"| {LABELS[n]} | {m['s']:.2f} | {m.get('x_import_torch', 1.0):.2f} |")
    if "whole" in p:
        lines += ["", f"### Whole run: HIRE vs baseline (median of {p['whole_rounds']} interleaved rounds)", "",
                  "| command | s | x baseline |", "|---|---|---|"]
        for n, m in p["whole"].items():
            lines.append(f"| {LABELS[n]} | {m['s']:.1f} | {m.get('x_baseline', 1.0):.3f} |")
    return "\n".join(lines) + "\n"
