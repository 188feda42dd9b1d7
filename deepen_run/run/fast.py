"""Device fast paths in one place, so the loop stays plain (docs/performance.md has the measurements).

- bf16 autocast where the hardware runs bf16 matmuls natively: train.mixed_precision=auto picks it on
  a bf16 GPU and on a CPU with AMX or AVX-512 BF16 (choose_precision); elsewhere, and with
  train.mixed_precision=no, the exact fp32 path. The choice and its reason are run params.
- CUDA: TF32 matmuls. AdamW's kernel: train.optimizer_impl (adamw_kwargs). Optional torch.compile
  (train.compile=true) through Accelerate's dynamo plugin, so unwrap_model / save / DDP keep working.
- Several processes (accelerate launch / torchrun): DDP must tolerate parameters a step leaves
  unused (other tasks' heads in multi-task runs, a backbone pooler a method does not read).
"""
from __future__ import annotations

import os

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, TorchDynamoPlugin


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
    """choose_precision on this machine: -> (precision, reason). With several processes on a GPU
    machine, every rank asks the same question of the same hardware, so all agree."""
    cuda = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return choose_precision(value, cuda, set() if cuda else cpu_flags())


def resolve_precision(value: str) -> str:
    """Accelerate's mixed_precision for train.mixed_precision (one of config.choices.Precision)."""
    return precision_choice(value)[0]


def enable_tf32() -> None:
    """TF32 tensor cores for fp32 matmuls on Ampere+; a no-op without CUDA."""
    if not torch.cuda.is_available():
        return
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9 API
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def fused_adamw_ok(device_type: str) -> bool:
    """torch has a fused AdamW kernel on CUDA and (torch >= 2.4) on CPU."""
    return device_type in ("cuda", "cpu")


def optimizer_impl(value: str, device_type: str) -> str:
    """train.optimizer_impl -> the AdamW kernel that runs: auto = fused where torch has it (one
    kernel over all tensors; foreach took ~3x its time per update on this project's idle CPU,
    docs/performance.md), else foreach. An explicit choice is kept as given."""
    if value != "auto":
        return str(value)
    return "fused" if fused_adamw_ok(device_type) else "foreach"


def adamw_kwargs(impl: str) -> dict:
    """torch.optim.AdamW's keywords for an optimizer_impl: fused, foreach (one op over every tensor
    per arithmetic step) or loop (foreach=False: one tensor at a time, torch's reference path)."""
    return {"fused": {"fused": True}, "foreach": {"foreach": True}, "loop": {"foreach": False}}[impl]


def run_params(tcfg, device_type: str) -> dict[str, str]:
    """What the run trains with, as params: the precision and why, AdamW's kernel."""
    precision, reason = precision_choice(tcfg.mixed_precision)
    return {"train/precision": precision, "train/precision_reason": reason,
            "train/optimizer_impl": optimizer_impl(tcfg.get("optimizer_impl", "auto"), device_type)}


def cpu_processes() -> bool:
    """Several processes and no GPU: Accelerate runs DDP over gloo only when told `cpu`
    (else it silently trains each process alone); `accelerate launch --cpu` alone spawns one."""
    gpu = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    return not gpu and int(os.environ.get("WORLD_SIZE", "1")) > 1


def make_accelerator(tcfg) -> Accelerator:
    enable_tf32()
    # Inductor compiles again for each new padded length unless shapes are marked dynamic.
    dynamo = TorchDynamoPlugin(backend="inductor", dynamic=True) if tcfg.compile else None
    return Accelerator(mixed_precision=resolve_precision(tcfg.mixed_precision),
                       gradient_accumulation_steps=tcfg.gradient_accumulation_steps,
                       kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
                       dynamo_plugin=dynamo, cpu=cpu_processes())
