"""Does bf16 keep fp32's accuracy? The same deepen-run job in both precisions over several seeds (`make bench`).

Each seed runs `deepen-run task=sst2 ... train.mixed_precision=no` and `...=bf16` back to back (the
order alternates by seed), as whole processes; the dev accuracy comes from the run's own summary line.
bf16 holds if the difference of the means is within the seeds' spread (max - min) of fp32. The wall
times give bf16's whole-process speed-up as a ratio per seed, so machine load cancels out.

    python scripts/bench.py --only accuracy                           # 150 steps, full SST-2, 3 seeds
    python scripts/bench.py --only accuracy --accuracy-steps 60 --accuracy-train-samples 2000 --accuracy-max-len 64
"""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
PRECISIONS = ("no", "bf16")
ACCURACY = re.compile(r"sst2/accuracy (\d+\.\d+)")


def one(tmp: str, seed: int, precision: str, a) -> dict:
    exe = Path(sys.executable).with_name("deepen-run")
    cli = [str(exe)] if exe.exists() else [sys.executable, "-m", "deepen_run.cli.run"]
    argv = [*cli, "task=sst2", f"train.max_steps={a.steps}", f"seed={seed}", f"train.mixed_precision={precision}",
            f"data.max_seq_length={a.max_len}", f"hydra.run.dir={tmp}/run-{precision}-{seed}",
            f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"data.cache_dir={tmp}/cache"]
    if a.train_samples:
        argv.append(f"data.max_train_samples={a.train_samples}")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.time()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
    wall = time.time() - t0
    found = ACCURACY.search(r.stdout)
    if r.returncode != 0 or not found:
        raise SystemExit(f"bench: {' '.join(argv)} exited {r.returncode}:\n{r.stderr[-2000:]}")
    return {"seed": seed, "precision": precision, "accuracy": float(found.group(1)), "wall_s": wall}


def measure(a) -> dict:
    load0, runs = os.getloadavg(), []
    with tempfile.TemporaryDirectory(prefix="deepen-bench-acc-") as tmp:
        for i, seed in enumerate(a.seeds):
            for p in (PRECISIONS if i % 2 == 0 else PRECISIONS[::-1]):
                print(f"bench: accuracy, seed {seed}, mixed_precision={p}, {a.steps} steps", flush=True)
                runs.append(one(tmp, seed, p, a))
    acc = {p: [r["accuracy"] for r in runs if r["precision"] == p] for p in PRECISIONS}
    wall = {p: [r["wall_s"] for r in runs if r["precision"] == p] for p in PRECISIONS}
    spread = max(acc["no"]) - min(acc["no"])
    diff = statistics.mean(acc["bf16"]) - statistics.mean(acc["no"])
    return {"steps": a.steps, "train_samples": a.train_samples, "max_len": a.max_len, "seeds": a.seeds,
            "runs": runs, "mean": {p: statistics.mean(v) for p, v in acc.items()}, "fp32_spread": spread,
            "bf16_minus_fp32": diff, "holds": abs(diff) <= spread,
            "bf16_speedup": statistics.median(f / b for f, b in zip(wall["no"], wall["bf16"])),
            "loadavg_start": load0, "loadavg_end": os.getloadavg()}


def markdown(p: dict) -> str:
    subset = f", {p['train_samples']} training examples" if p["train_samples"] else ""
    lines = [f"### bf16 vs fp32 accuracy: deepen-run task=sst2, {p['steps']} steps, max length {p['max_len']}{subset} "
             f"(load average {p['loadavg_start'][0]:.1f} -> {p['loadavg_end'][0]:.1f})", "",
             "| seed | fp32 dev acc | bf16 dev acc | fp32 s | bf16 s |", "|---|---|---|---|---|"]
    by = {(r["seed"], r["precision"]): r for r in p["runs"]}
    for s in p["seeds"]:
        f, b = by[(s, "no")], by[(s, "bf16")]
        lines.append(f"| {s} | {f['accuracy']:.4f} | {b['accuracy']:.4f} | {f['wall_s']:.1f} | {b['wall_s']:.1f} |")
    lines += ["", f"Mean: fp32 {p['mean']['no']:.4f}, bf16 {p['mean']['bf16']:.4f} (bf16 - fp32 "
              f"{p['bf16_minus_fp32']:+.4f}; fp32's spread over seeds {p['fp32_spread']:.4f}: "
              f"{'within' if p['holds'] else 'OUTSIDE'} it). Whole-process speed-up of bf16, fp32 s / bf16 s, "
              f"median of seeds: {p['bf16_speedup']:.3f}."]
    return "\n".join(lines) + "\n"

