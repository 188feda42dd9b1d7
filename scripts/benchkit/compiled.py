"""Does train.compile=true pay on this machine? torch.compile (inductor, dynamic shapes, as
deepen_run/run/fast.py sets it) of a MiniLM training step against the eager step, in one process
(`make bench`'s limit part; `python scripts/bench.py --only compile`).

Measures the compile time (the first compiled steps' extra seconds: one per new shape until
dynamic shapes kick in), the step time of each, eager and compiled taking turns on the same
batches of varying length (as dynamic padding makes them), and the run length from which the
compiled run is ahead: compile seconds / (eager - compiled seconds per step).
"""
from __future__ import annotations

import statistics
import time

import torch

from .limit import Step, random_bert


def batches(n: int, lengths=(36, 44, 52, 40), batch_size: int = 32, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(1000, 20000, (batch_size, lengths[i % len(lengths)]), generator=g),
             "attention_mask": torch.ones(batch_size, lengths[i % len(lengths)], dtype=torch.long),
             "labels": torch.randint(0, 2, (batch_size,), generator=g)} for i in range(n)]


def measure(bf16: bool, warm: int = 3, steps: int = 12) -> dict:
    torch.manual_seed(0)
    eager = Step(random_bert("minilm"), torch.device("cpu"), bf16)
    torch.manual_seed(0)
    compiled = Step(random_bert("minilm"), torch.device("cpu"), bf16)
    compiled.enc = torch.compile(compiled.enc, backend="inductor", dynamic=True)
    bs = batches(warm + steps)
    first = {"eager": [], "compiled": []}
    for b in bs[:warm]:  # new shapes: the compiled side compiles (again, until dynamic shapes hold)
        for name, st in (("eager", eager), ("compiled", compiled)):
            t = time.perf_counter()
            st(b)
            first[name].append(time.perf_counter() - t)
    times = {"eager": [], "compiled": []}
    for i, b in enumerate(bs[warm:]):
        for name, st in ((("eager", eager), ("compiled", compiled)) if i % 2 else (("compiled", compiled), ("eager", eager))):
            t = time.perf_counter()
            st(b)
            times[name].append(time.perf_counter() - t)
    e, c = statistics.median(times["eager"]), statistics.median(times["compiled"])
    ratio = statistics.median(x / y for x, y in zip(times["eager"], times["compiled"]))
    compile_s = sum(first["compiled"]) - warm * c
    gain = e - c
    return {"precision": "bf16" if bf16 else "fp32", "compile_s": compile_s, "eager_step_s": e, "compiled_step_s": c,
            "speedup": ratio, "pays_after_steps": compile_s / gain if gain > 0 else None,
            "warm_s": first, "steps_s": times}


def markdown(r: dict) -> str:
    pays = f"{r['pays_after_steps']:,.0f} steps" if r["pays_after_steps"] else "never (not faster per step)"
    return (f"torch.compile of a MiniLM step ({r['precision']}, batch 32, lengths 36-52): compile "
            f"{r['compile_s']:.1f} s; step {1000 * r['eager_step_s']:.0f} ms eager, {1000 * r['compiled_step_s']:.0f} ms "
            f"compiled (speed-up {r['speedup']:.3f}, median of paired steps); pays after {pays}.\n")

