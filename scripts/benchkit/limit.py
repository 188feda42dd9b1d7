"""How close a training step comes to the machine's limit (`make bench`, docs/performance.md).

- peak: the matmul rate of this machine in fp32 and in bf16, measured in the same run (square
  matmuls, fp32 and bf16 taking turns; the best of the repeats, as the least disturbed by load);
- achieved: a bare training step (forward, backward, fused AdamW; bf16 autocast where deepen-run's
  mixed_precision=auto picks it) of MiniLM and of a BERT-base-sized random model, as model FLOP/s:
  6 x (parameters in matmuls) x tokens, plus attention's 12 x layers x hidden x length per token,
  over the step time, and as a fraction of the peak of the step's precision;
- profile: torch.profiler over a few MiniLM steps, the self CPU (or CUDA) time of each op summed
  into matmuls, attention, optimizer, casts, norms, dropout's random masks and the rest, as shares
  of the step.

    python scripts/bench.py --only limit     # both models, then the profile
"""
from __future__ import annotations

import statistics
import time

import torch

# Op names (lower case, without "aten::") -> the share they count in; the first match wins.
GROUPS = [("optimizer", ("adam", "_foreach_")),
          ("attention", ("attention", "softmax", "sdpa", "flash")),
          ("matmuls", ("mm", "addmm", "bmm", "matmul", "linear", "mkldnn")),
          ("casts", ("copy_", "_to_copy", "to")),
          ("norms", ("layer_norm",)),
          # Drawing the masks, not applying them (a mul): 17% of a bf16 MiniLM step on an AVX-512 BF16 CPU
          # with bernoulli_; random_ draws train.dropout_masks=fast's (deepen_run/model/dropout.py).
          ("dropout masks", ("bernoulli", "native_dropout", "random_"))]


def group_of(op: str) -> str:
    name = op.split("::")[-1].lower()
    for group, keys in GROUPS:
        if any(name == k or (len(k) > 3 and k in name) for k in keys):
            return group
    return "other"


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_matmul(device, n: int = 2048, repeats: int = 5) -> dict:
    """GFLOP/s of an n x n matmul in fp32 and bf16, taking turns; the best of the repeats."""
    out = {}
    mats = {dt: (torch.randn(n, n, device=device, dtype=dt), torch.randn(n, n, device=device, dtype=dt))
            for dt in (torch.float32, torch.bfloat16)}
    best = {dt: float("inf") for dt in mats}
    for _ in range(repeats):
        for dt, (x, y) in mats.items():
            x @ y  # warm: oneDNN's first call packs and picks its kernel
            sync(device)
            t = time.perf_counter()
            for _ in range(3):
                x @ y
            sync(device)
            best[dt] = min(best[dt], (time.perf_counter() - t) / 3)
    for dt, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        out[name] = 2 * n ** 3 / best[dt] / 1e9
    out["bf16_over_fp32"] = out["bf16"] / out["fp32"]
    return out


def flops_per_token(config, length: int) -> float:
    """Training FLOPs per token of a BERT-style encoder: 6 x matmul parameters (attention's four
    h x h projections and the two h x i FFN matrices per layer), plus attention's scores and
    weighted sum (2 x 2 x length x h per layer forward, x3 with the backward)."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    matmul_params = layers * (4 * h * h + 2 * h * i)
    return 6 * matmul_params + 12 * layers * h * length


def random_bert(size: str):
    from transformers import BertConfig, BertModel

    dims = {"minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
            "bert_base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)}
    return BertModel(BertConfig(**dims[size], attn_implementation="sdpa"))


class Step:
    """A bare step of an encoder + linear head: autocast(dtype) forward, backward, fused AdamW."""

    def __init__(self, encoder, device, bf16: bool):
        self.enc = encoder.to(device).train()
        self.head = torch.nn.Linear(encoder.config.hidden_size, 2).to(device)
        params = [*self.enc.parameters(), *self.head.parameters()]
        self.opt = torch.optim.AdamW(params, lr=2e-5, fused=device.type in ("cuda", "cpu"))
        self.device, self.bf16 = device, bf16

    def __call__(self, batch: dict) -> None:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            h = self.enc(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
            logits = self.head(h[:, 0])
        torch.nn.functional.cross_entropy(logits.float(), batch["labels"]).backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def batches(device, n: int, batch_size: int = 32, length: int = 48, seed: int = 0) -> list[dict]:
    """Random tokens, every token real: SST-2's dynamically padded batches are about 40 long."""
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(1000, 20000, (batch_size, length), generator=g).to(device),
             "attention_mask": torch.ones(batch_size, length, dtype=torch.long, device=device),
             "labels": torch.randint(0, 2, (batch_size,), generator=g).to(device)} for _ in range(n)]


def achieved(device, bf16: bool, peak: dict, steps: int, sizes=("minilm", "bert_base"), pretrained=None) -> dict:
    """Model FLOP/s of each size's step, median of `steps` timed steps after one warm-up."""
    out = {}
    for size in sizes:
        torch.manual_seed(0)
        enc = pretrained if (size == "minilm" and pretrained is not None) else random_bert(size)
        step, bs = Step(enc, device, bf16), batches(device, steps + 1)
        times = []
        for i, b in enumerate(bs):
            sync(device)
            t = time.perf_counter()
            step(b)
            sync(device)
            if i:
                times.append(time.perf_counter() - t)
        b, length = bs[0]["input_ids"].shape
        flops = flops_per_token(enc.config, length) * b * length
        rate = flops / statistics.median(times) / 1e9
        out[size] = {"step_ms": 1000 * statistics.median(times), "gflop_per_step": flops / 1e9,
                     "model_gflops": rate, "of_peak": rate / peak["bf16" if bf16 else "fp32"],
                     "of_bf16_peak": rate / peak["bf16"], "tokens": b * length}
        del step
    return out


def profile_shares(device, bf16: bool, steps: int, encoder=None) -> dict:
    """Shares of a MiniLM step's op time by group (GROUPS), from torch.profiler over `steps` steps."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    step = Step(encoder if encoder is not None else random_bert("minilm"), device, bf16)
    bs = batches(device, steps + 1)
    step(bs[0])
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for b in bs[1:]:
            step(b)
        sync(device)
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    total, shares, calls = 0.0, {g: 0.0 for g, _ in GROUPS} | {"other": 0.0}, {}
    for e in prof.key_averages():
        if not e.key.startswith("aten::"):
            continue  # user annotations (Optimizer.step, ...) hold no self time worth counting
        t = getattr(e, attr, 0.0) or 0.0
        g = group_of(e.key)
        shares[g] += t
        total += t
        calls[g] = calls.get(g, 0) + e.count
    return {"shares": {g: v / total for g, v in shares.items()} if total else shares,
            "calls_per_step": {g: n / steps for g, n in calls.items()}, "steps": steps}


def measure(device, bf16: bool, quick: bool = False, pretrained=None) -> dict:
    """The peak, the achieved rates and the profile, in this order (the peak first: least warm)."""
    peak = peak_matmul(device, 1024 if quick else 2048, 2 if quick else 5)
    sizes = ("minilm",) if quick else ("minilm", "bert_base")
    return {"precision": "bf16" if bf16 else "fp32", "peak_gflops": peak,
            "achieved": achieved(device, bf16, peak, 2 if quick else 6, sizes, pretrained),
            "profile": profile_shares(device, bf16, 1 if quick else 3, pretrained)}


def markdown(r: dict) -> str:
    p = r["peak_gflops"]
    lines = [f"### Against the machine's limit ({r['precision']} step)", "",
             f"Peak matmul (2048 x 2048, best of repeats): fp32 {p['fp32']:,.0f} GFLOP/s, bf16 {p['bf16']:,.0f} "
             f"GFLOP/s ({p['bf16_over_fp32']:.2f}x).", "",
             "| model | tokens/step | model GFLOP/step | ms/step | model GFLOP/s | of its precision's peak | of bf16 peak |",
             "|---|---|---|---|---|---|---|"]
    for size, a in r["achieved"].items():
        lines.append(f"| {size} | {a['tokens']:,} | {a['gflop_per_step']:,.1f} | {a['step_ms']:,.0f} | "
                     f"{a['model_gflops']:,.0f} | {100 * a['of_peak']:.1f}% | {100 * a['of_bf16_peak']:.1f}% |")
    prof = r["profile"]
    lines += ["", f"Profile of a MiniLM step ({prof['steps']} steps, torch.profiler, self time of aten ops):", "",
              "| share | " + " | ".join(prof["shares"]) + " |", "|---|" + "---|" * len(prof["shares"]),
              "| % of op time | " + " | ".join(f"{100 * v:.1f}" for v in prof["shares"].values()) + " |",
              "| op calls / step | " + " | ".join(f"{prof['calls_per_step'].get(g, 0):.0f}" for g in prof["shares"])
              + " |"]
    return "\n".join(lines) + "\n"

