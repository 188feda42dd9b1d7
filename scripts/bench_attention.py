"""Where could a bf16 CPU step go faster? The attention path and dropout's masks, measured in one
process (docs/performance.md, "Idle, on a CPU with AVX-512 BF16"): a bare MiniLM-sized step
(bench_limit.Step, bf16 autocast) of each variant taking turns on the same batches:

- sdpa:              transformers' default; in training torch's CPU SDPA runs its math path with dropout
- eager:             transformers' own written-out attention (train.attention=eager), torch's masks
- eager+fast masks:  eager with train.dropout_masks=fast (deepen_run/model/dropout.py: 32 random bits
                     an element instead of bernoulli_), what train.*=auto trains bf16 on a CPU with

    python scripts/bench_attention.py            # 6 batches x 4 rounds
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_limit import Step, batches, random_bert  # noqa: E402


def make(mode: str) -> Step:
    from deepen_run.model.dropout import install

    torch.manual_seed(0)
    enc = random_bert("minilm")
    if mode != "sdpa":
        enc.set_attn_implementation("eager")
    if mode == "eager+fast masks":
        install(enc, enc, "eager")
    return Step(enc, torch.device("cpu"), bf16=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--length", type=int, default=40)
    a = ap.parse_args()
    bs = batches(torch.device("cpu"), a.batches + 1, length=a.length)
    for b in bs:  # some padding, as SST-2's batches have
        b["attention_mask"][: len(b["attention_mask"]) // 4, (3 * a.length) // 4:] = 0
    modes = ["sdpa", "eager", "eager+fast masks"]
    steps = {m: make(m) for m in modes}
    for m in modes:
        steps[m](bs[0])  # warm-up
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(a.rounds):
        for b in bs[1:]:
            for m in modes:
                t = time.perf_counter()
                steps[m](b)
                times[m].append(time.perf_counter() - t)
    base = statistics.median(times["sdpa"])
    print(f"bf16 MiniLM step, batch {len(bs[0]['input_ids'])} x {a.length}, {torch.get_num_threads()} threads, "
          f"median of {a.batches * a.rounds} steps each, taking turns\n")
    print("| attention / dropout | ms/step | speed-up over sdpa |\n|---|---|---|")
    for m in modes:
        med = statistics.median(times[m])
        print(f"| {m} | {1000 * med:,.0f} | {base / med:.3f} |")


if __name__ == "__main__":
    main()
