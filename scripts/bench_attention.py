"""Where could a bf16 CPU step go faster? Dropout's masks and the attention path, measured in one
process (docs/performance.md, "Idle, on a CPU with AVX-512 BF16"). Not used by deepen-run: a
measurement of candidates, each a bare MiniLM-sized step (bench_limit.Step, bf16 autocast) taking
turns on the same batches:

- sdpa:         transformers' default; in training torch's CPU SDPA runs its math path with dropout
- eager:        transformers' own written-out attention (softmax in fp32, then nn.Dropout)
- math:         the same arithmetic written out (scores, softmax, F.dropout, weighted sum)
- math+masks:   math, with attention-probability masks drawn as 16 random bits an element
                (int64 random_() viewed as int16; p rounded to 1/65536) instead of bernoulli_
- all masks:    math+masks, and every nn.Dropout drawing its masks the same way

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


def cheap_mask(shape, p: float, dtype) -> torch.Tensor:
    """Keep-mask scaled by 1/(1-p): 16 random bits an element, drawn 64 at a time."""
    n = 1
    for s in shape:
        n *= s
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_().view(torch.int16)[:n].view(shape)
    return (bits >= -32768 + round(p * 65536)).to(dtype) * (1.0 / (1.0 - p))


def math_attention(cheap: bool):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attend(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kw):
        if dropout == 0.0:  # evaluation: the fused kernel
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=scaling, **kw)
        s = torch.matmul(query, key.transpose(-1, -2)) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
        if attention_mask is not None:
            s = s.masked_fill(~attention_mask, float("-inf")) if attention_mask.dtype == torch.bool else s + attention_mask
        w = s.softmax(-1)
        w = w * cheap_mask(w.shape, dropout, w.dtype) if cheap else torch.nn.functional.dropout(w, dropout, True)
        return torch.matmul(w, value).transpose(1, 2).contiguous(), None

    return attend


class CheapDropout(torch.nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x):
        return x * cheap_mask(x.shape, self.p, x.dtype) if self.training and self.p > 0 else x


def swap_dropouts(m: torch.nn.Module) -> None:
    for name, c in m.named_children():
        if isinstance(c, torch.nn.Dropout):
            setattr(m, name, CheapDropout(c.p))
        else:
            swap_dropouts(c)


def make(mode: str) -> Step:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    for name, cheap in (("bench_math", False), ("bench_math_masks", True)):
        AttentionInterface.register(name, math_attention(cheap))
        AttentionMaskInterface.register(name, sdpa_mask)
    torch.manual_seed(0)
    enc = random_bert("minilm")
    if mode == "eager":
        enc.set_attn_implementation("eager")
    elif mode != "sdpa":
        enc.set_attn_implementation("bench_math" if mode == "math" else "bench_math_masks")
    if mode == "all masks":
        swap_dropouts(enc)
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
    modes = ["sdpa", "eager", "math", "math+masks", "all masks"]
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
