"""HIRE's GRUs under CPU bf16 autocast: as they run (autocast computes nn.GRU in bf16 itself) against
each GRU run explicitly on bf16 copies of its fp32 weights (torch.func.functional_call, as autocast
does for a Linear). Tried and not kept (docs/performance.md, "HIRE's GRUs under bf16").

HIRE's shapes at MiniLM's width: the extractor BiGRU over 5 layers x B examples x T tokens, the fusion
BiGRU over B x T x 4d, beside the same GRUs in fp32 without autocast. The variants take turns; each row is the median of --repeats calls.

    python scripts/bench_gru.py                  # B=32, T=40, 2 rounds
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.func import functional_call

from deepen_run.methods.hire.model import BiGRU, reverse_within


class ExplicitBf16(BiGRU):
    """The variant tried: each GRU on bf16 weight copies, the gradients reaching the fp32 weights."""

    def forward(self, x, lengths, mask):
        dtype, x = x.dtype, x.to(torch.bfloat16)
        keep = mask.unsqueeze(-1).to(x.dtype)

        def run(gru, inp):
            return functional_call(gru, {n: p.to(torch.bfloat16) for n, p in gru.named_parameters()}, (inp,))[0]

        for layer in self.layers:
            fwd = run(layer["fwd"], x)
            bwd = reverse_within(run(layer["bwd"], reverse_within(x, lengths)), lengths)
            x = torch.cat([fwd, bwd], dim=-1) * keep
        return x.to(dtype)


def timed(ext, fuse, B, T, d, train: bool, repeats: int, autocast: bool = True) -> float:
    lengths = torch.randint(8, T + 1, (B,), generator=torch.Generator().manual_seed(0))
    lengths[0] = T
    mask = (torch.arange(T) < lengths[:, None]).long()
    times = []
    for k in range(repeats + 1):  # the first call warms up
        x = torch.randn(5 * B, T, d, requires_grad=train)
        m = torch.randn(B, T, 4 * d, requires_grad=train)
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), torch.set_grad_enabled(train):
            y = ext(x, lengths.repeat(5), mask.repeat(5, 1)).sum() + fuse(m, lengths, mask).sum()
        if train:
            y.backward()
        if k:
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def autocast_differs(d: int) -> float:
    """max |GRU output under bf16 autocast - without|: nonzero when autocast runs the GRU in bf16."""
    torch.manual_seed(0)
    gru, x = torch.nn.GRU(d, d // 2, batch_first=True), torch.randn(64, 32, d)
    with torch.no_grad():
        exact = gru(x)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = gru(x)[0]
    return (low.float() - exact).abs().max().item()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=40)
    p.add_argument("--width", type=int, default=384, help="the backbone's hidden size (MiniLM: 384)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    d = a.width
    print(f"B={a.batch} T={a.length} d={d}, {torch.get_num_threads()} threads; ms, median of {a.repeats}")
    print(f"an nn.GRU under bf16 autocast differs from fp32 by up to {autocast_differs(d):.4f}: it runs in bf16")
    print("| round | pass | fp32, no autocast | autocast (kept) | explicit bf16 (tried) |\n|---|---|---|---|---|")
    for r in range(1, a.rounds + 1):
        for train in (True, False):
            row = []
            for cls, autocast in ((BiGRU, False), (BiGRU, True), (ExplicitBf16, True)):
                torch.manual_seed(0)
                row.append(timed(cls(d, d, 2), cls(4 * d, d, 2), a.batch, a.length, d, train, a.repeats, autocast))
            print(f"| {r} | {'train fwd+bwd' if train else 'eval fwd'} | " + " | ".join(f"{t:.0f}" for t in row) + " |")


if __name__ == "__main__":
    main()
