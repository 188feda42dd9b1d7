"""Which precision a run computes in: train.mixed_precision=auto -> bf16 where the hardware runs bf16
matmuls natively, else fp32 (docs/performance.md). Used by the run (deepen_run/run/fast.py) and by
deepen_run.load, which predicts at the precision its run evaluated in. And the attention kernel
that goes with it (train.attention, choose_attention)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of native bf16 matmuls (oneDNN uses them)


def choose_precision(value: str, cuda_bf16: bool, cpu_flags: set[str]) -> tuple[str, str]:
    """-> (Accelerate's mixed_precision, why). auto = bf16 on a bf16 GPU or on a CPU whose flags show
    native bf16 matmuls (AMX or AVX-512 BF16; there bf16 autocast trains ~1.5x faster), else fp32
    ("no"): without them CPU bf16 is emulated and slower than fp32. Pure, for the test."""
    if value != "auto":
        return str(value), "set by train.mixed_precision"
    if cuda_bf16:
        return "bf16", "auto: the GPU supports bf16"
    native = [f for f in CPU_BF16_FLAGS if f in cpu_flags]
    if native:
        return "bf16", f"auto: CPU with {' and '.join(native)}"
    return "no", "auto: no bf16 GPU, and no amx_bf16 / avx512_bf16 CPU flag"


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags (Linux x86); empty where the file or its flags line is missing.
    torch.backends.cpu.get_cpu_capability() says only "AVX512", not whether bf16 is native."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def precision_choice(value: str) -> tuple[str, str]:
    """choose_precision on this machine: -> (precision, reason)."""
    cuda = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return choose_precision(value, cuda, set() if cuda else cpu_flags())


def resolve_precision(value: str) -> str:
    """Accelerate's mixed_precision for train.mixed_precision (one of config.choices.Precision)."""
    return precision_choice(value)[0]


def choose_attention(value: str, precision: str, cuda: bool) -> tuple[str | None, str]:
    """-> (transformers' attn_implementation, or None for its default; why). auto = eager for bf16 on
    a CPU: in training (dropout on) torch's CPU SDPA takes its math path, and transformers' eager
    attention trained a bf16 MiniLM step 1.10x faster than it on an AVX-512 BF16 CPU
    (docs/history/performance.md). Elsewhere the default (sdpa): fp32 runs keep their exact path.
    Pure, for the test."""
    if value != "auto":
        return str(value), "set by train.attention"
    if precision == "bf16" and not cuda:
        return "eager", "auto: bf16 on a CPU"
    return None, "auto: transformers' default"


def _bf16_cpu_path(key: str, value: str, precision: str, cuda: bool, fast: str, other: tuple[str, str]):
    """train.<key>: a CPU bf16 fast path. -> (choice, why): as set, else `fast` for bf16 on a CPU and
    `other` (with its reason) elsewhere."""
    if value != "auto":
        return str(value), f"set by train.{key}"
    if precision == "bf16" and not cuda:
        return fast, "auto: bf16 on a CPU"
    return other


def choose_dropout_masks(value: str, precision: str, cuda: bool) -> tuple[str, str]:
    """-> (torch | fast, why). auto = fast for bf16 on a CPU, where torch's bernoulli_ masks were 17%
    of a MiniLM training step (deepen_run/model/dropout.py); elsewhere torch's own, so fp32 runs keep
    their exact random stream. Pure, for the test."""
    return _bf16_cpu_path("dropout_masks", value, precision, cuda, "fast", ("torch", "auto: torch's own elsewhere"))


def choose_unpad(value: str, precision: str, cuda: bool) -> tuple[str, str]:
    """-> (on | off, why). auto = on for bf16 on a CPU, where the layers' Linears are most of a step and
    an SST-2 batch is two-thirds padding (deepen_run/model/unpad.py); elsewhere off, so fp32 runs keep
    their exact path. Pure, for the test."""
    return _bf16_cpu_path("unpad", value, precision, cuda, "on", ("off", "auto: the padded path elsewhere"))


@dataclass(frozen=True)
class Compute:
    """How a run computes, resolved once on this machine (resolve): each choice with its reason. The
    runner logs it as params and passes it on (the Accelerator, the backbone's attention, the fast
    paths, the saved model's info), so no later stage decides again."""
    precision: str  # Accelerate's mixed_precision: no | fp16 | bf16
    precision_reason: str
    attention: Optional[str]  # transformers' attn_implementation; None: its default
    attention_reason: str
    dropout_masks: str  # torch | fast
    dropout_masks_reason: str
    unpad: str  # on | off
    unpad_reason: str

    def params(self) -> dict[str, str]:
        return {"train/precision": self.precision, "train/precision_reason": self.precision_reason,
                "train/attention": self.attention or "default", "train/attention_reason": self.attention_reason,
                "train/dropout_masks": self.dropout_masks, "train/dropout_masks_reason": self.dropout_masks_reason}


def resolve(tcfg) -> Compute:
    """The choices of a run's train config on this machine. With several processes every rank asks
    the same question of the same hardware, so all agree."""
    precision, why = precision_choice(str(tcfg.get("mixed_precision", "no")))
    cuda = torch.cuda.is_available()
    return Compute(precision, why, *choose_attention(str(tcfg.get("attention", "auto")), precision, cuda),
                   *choose_dropout_masks(str(tcfg.get("dropout_masks", "auto")), precision, cuda),
                   *choose_unpad(str(tcfg.get("unpad", "auto")), precision, cuda))
