"""Which CPU a bench ran on: its model and the flags that decide what train.*=auto does there.

Every `make bench` output starts with this line (scripts/bench.py prints it, bench.md's first line
holds it): a number means little without its CPU. On an AMX CPU bf16 matmuls run about 5x fp32's
rate, with AVX-512 BF16 about 2.3x, and with AVX2 alone bf16 is emulated, so auto trains in fp32
(docs/performance.md). The flags are read the way deepen-run reads them (deepen_run.precision).
"""
from __future__ import annotations

import os
import platform

import torch

from deepen_run.precision import choose_precision, cpu_flags

# (label, /proc/cpuinfo flag): what a reader compares machines by.
FLAGS = (("AMX", "amx_bf16"), ("AVX-512 BF16", "avx512_bf16"), ("AVX-512", "avx512f"), ("AVX2", "avx2"))


def cpu_model(path: str = "/proc/cpuinfo") -> str:
    """The first `model name` of the file (Linux x86); else what the platform module says."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def describe(path: str = "/proc/cpuinfo") -> dict:
    """-> the model, each flag of FLAGS present or not, the cores, and what auto picks here."""
    flags = cpu_flags(path)
    cuda = torch.cuda.is_available() and torch.cuda.is_bf16_supported()  # a bf16 GPU decides first, as in a run
    precision, why = choose_precision("auto", cuda, flags)
    return {"model": cpu_model(path), "flags": {label: flag in flags for label, flag in FLAGS},
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(), "torch_capability": torch.backends.cpu.get_cpu_capability(),
            "auto_precision": "fp32" if precision == "no" else precision, "auto_reason": why}


def header(d: dict) -> str:
    """One line, e.g. `CPU: AMD EPYC 7B12, 2 cores; AMX no, AVX-512 BF16 no, AVX-512 no, AVX2 yes
    (torch: AVX2); train.mixed_precision=auto -> fp32 (auto: no bf16 GPU, ...)`."""
    flags = ", ".join(f"{label} {'yes' if on else 'no'}" for label, on in d["flags"].items())
    return (f"CPU: {d['model']}, {d['cores']} cores; {flags} (torch: {d['torch_capability']}); "
            f"train.mixed_precision=auto -> {d['auto_precision']} ({d['auto_reason']})")
