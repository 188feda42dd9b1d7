"""Whole process against the Trainer's, phase by phase (`make bench`; `python scripts/bench.py --only phases`).

The job: `deepen-run task=sst2 train.max_steps=150` (its defaults: bf16 autocast where the hardware
runs it natively) and scripts/benchkit/trainer_job.py (the Trainer on the same data, settings and
evaluation), once with the Trainer's default (fp32) and once with `bf16=True`. All are timed from the
moment the process is launched to the moment it has exited, in rounds that rotate which goes first,
each with the dev accuracy it printed; each marks its phases
(deepen_run.util.phase, DEEPEN_PHASES=<file>), so the table shows where the seconds go:

  python + imports   launch -> main()               (the interpreter and the entry's module imports)
  imports            -> libraries imported          (the Trainer's script; deepen-run imports lazily, below)
  config             main() -> config composed      (Hydra; the Trainer has none)
  checks             -> pre-flight done             (deepen-run: tasks, files, numbers; imports torch)
  store              -> tracking store open         (deepen-run only: MLflow)
  model              -> model built                 (weights loaded, method built)
  run recorded       -> MLflow run started           (deepen-run: params, config, sizes)
  data               -> data ready                  (tokenized, cached; loaders, optimizer)
  first step         -> step 1 done
  loop               -> the last step done
  evaluation         -> the final evaluation done
  records            -> final record written        (metrics, predictions, figures)
  run ended          -> run ended                   (deepen-run: status in the store, run.json, summary)
  teardown           -> process exited               (Hydra's job end, interpreter exit)

A warm-up round first (1 step) builds both tokenization caches and loads the GLUE metric once. A
ratio is the Trainer's seconds / deepen-run's seconds per round (>= 1.0: deepen-run at least as fast),
median over rounds.
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the repository
# (label, the mark that ends it); a process lacking a mark has the phase merged into the next one.
PHASES = [("python + imports", "main"), ("imports", "imported"), ("config", "composed"), ("checks", "checked"), ("store", "store"),
          ("model", "model"), ("run recorded", "started"), ("data", "data"), ("first step", "first_step"),
          ("loop", "steps"), ("evaluation", "eval"), ("records", "recorded"), ("run ended", "ended"),
          ("teardown", None)]


def _commands(tmp: str, r: int, steps: int) -> dict[str, list[str]]:
    exe = Path(sys.executable).with_name("deepen-run")
    cli = [str(exe)] if exe.exists() else [sys.executable, "-m", "deepen_run.cli.run"]
    return {"deepen-run": [*cli, "task=sst2", f"train.max_steps={steps}", f"hydra.run.dir={tmp}/run-{r}",
                           f"tracking.uri=sqlite:///{tmp}/mlflow.db", f"data.cache_dir={tmp}/cache"],
            "trainer": [sys.executable, str(HERE / "trainer_job.py"), f"--steps={steps}"],
            "trainer-bf16": [sys.executable, str(HERE / "trainer_job.py"), f"--steps={steps}", "--bf16"]}


# The dev accuracy each process prints: deepen-run's summary line, the Trainer's evaluate() dict.
ACCURACY = re.compile(r"sst2/accuracy (\d+\.\d+)|'eval_accuracy': (?:np\.float64\()?(\d+\.\d+)")


def accuracy(stdout: str) -> float:
    found = ACCURACY.findall(stdout)
    return float(next(x for x in found[-1] if x)) if found else float("nan")


def timed_phases(argv: list[str], env: dict, marks: Path) -> dict:
    marks.unlink(missing_ok=True)
    t0 = time.time()
    r = subprocess.run(argv, capture_output=True, text=True, env={**env, "DEEPEN_PHASES": str(marks)}, timeout=3600)
    t1 = time.time()
    if r.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv)} exited {r.returncode}:\n{r.stderr[-2000:]}")
    seen = dict(line.split() for line in marks.read_text().splitlines()) if marks.exists() else {}
    out, before = {}, t0
    for label, mark in PHASES:
        if mark is None:
            out[label] = t1 - before
        elif mark in seen:
            out[label], before = float(seen[mark]) - before, float(seen[mark])
    return {"wall_s": t1 - t0, "phases_s": out, "dev_accuracy": accuracy(r.stdout)}


def bf16_cpu() -> bool:
    """Without AMX or AVX-512 BF16 the Trainer's bf16 autocast is emulated: 150 steps had not ended after 40
    minutes on a 2-core AVX2-only EPYC, and the ratio says nothing a user of that CPU would choose."""
    import torch

    from deepen_run.precision import cpu_flags
    return bool({"amx_bf16", "avx512_bf16"} & cpu_flags()) or torch.cuda.is_available()


def measure(rounds: int = 3, steps: int = 150, bf16_trainer: bool | None = None) -> dict:
    """bf16_trainer None: time the Trainer with bf16=True only where the CPU (or a GPU) has bf16."""
    root = str(ROOT)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    load0 = os.getloadavg()
    names = ["deepen-run", "trainer", "trainer-bf16"]
    if not (bf16_cpu() if bf16_trainer is None else bf16_trainer):
        print("bench: no bf16 on this CPU, so the Trainer's bf16=True contender is left out", flush=True)
        names.remove("trainer-bf16")
    runs = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="deepen-bench-whole-") as tmp:
        marks = Path(tmp) / "marks.txt"
        for n in names:  # warm-up: caches, the metric script
            print(f"bench: warm-up {n}", flush=True)
            timed_phases(_commands(tmp, 0, 1)[n], env, marks)
        for r in range(1, rounds + 1):
            cmds = _commands(tmp, r, steps)
            order = names[r % len(names):] + names[:r % len(names)]  # each goes first once in a cycle
            if len(names) == 3 and r % 2 == 0:
                order.reverse()
            for n in order:
                print(f"bench: round {r}/{rounds}: {n}, {steps} steps", flush=True)
                runs[n].append(timed_phases(cmds[n], env, marks))
    out = {"steps": steps, "rounds": rounds, "runs": runs, "loadavg_start": load0, "loadavg_end": os.getloadavg()}
    for n, key in (("trainer", "x_trainer"), ("trainer-bf16", "x_trainer_bf16")):
        if n not in runs:
            continue
        ratios = [t["wall_s"] / d["wall_s"] for t, d in zip(runs[n], runs["deepen-run"])]
        out[key], out[key + "_ratios"] = statistics.median(ratios), ratios
    out["ratios"] = out["x_trainer_ratios"]
    out["accuracy"] = {n: statistics.mean(r["dev_accuracy"] for r in rs) for n, rs in runs.items()}
    return out


def markdown(p: dict) -> str:
    def med(n, label):
        vals = [r["phases_s"][label] for r in p["runs"][n] if label in r["phases_s"]]
        return f"{statistics.median(vals):.2f}" if vals else "-"

    names = [n for n in ("deepen-run", "trainer", "trainer-bf16") if p["runs"].get(n)]
    heads = {"deepen-run": "deepen-run (default) s", "trainer": "Trainer (default, fp32) s",
             "trainer-bf16": "Trainer bf16=True s"}
    lines = [f"### Whole process vs the Trainer: SST-2, {p['steps']} steps x 32 (median of {p['rounds']} "
             f"interleaved rounds; load average {p['loadavg_start'][0]:.1f} -> {p['loadavg_end'][0]:.1f})", "",
             "| phase | " + " | ".join(heads[n] for n in names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {label} | " + " | ".join(med(n, label) for n in names) + " |" for label, _ in PHASES]
    walls = {n: statistics.median(r["wall_s"] for r in p["runs"][n]) for n in names}
    lines += ["| **whole process** | " + " | ".join(f"**{walls[n]:.2f}**" for n in names) + " |"]
    if "accuracy" in p:
        lines += ["| dev accuracy (mean) | " + " | ".join(f"{p['accuracy'][n]:.4f}" for n in names) + " |"]
    lines += [""]
    for n, key in (("trainer", "x_trainer"), ("trainer-bf16", "x_trainer_bf16")):
        if key in p:
            lines += [f"- deepen-run speed-up over {heads[n][:-2]} ({n} s / deepen-run s, median of rounds): "
                      f"**{p[key]:.3f}** (rounds: {', '.join(f'{x:.3f}' for x in p[key + '_ratios'])})"]
    return "\n".join(lines) + "\n"

