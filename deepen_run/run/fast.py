"""Device fast paths in one place, so the loop stays plain and CPU runs stay untouched.

- CUDA: TF32 matmuls, bf16 autocast (train.mixed_precision=auto picks it on a bf16 GPU),
  fused AdamW (train.optimizer_for), optional torch.compile (train.compile=true) through
  Accelerate's dynamo plugin, so unwrap_model / save / DDP keep working on the compiled model.
- Several processes (accelerate launch / torchrun): DDP must tolerate parameters a step leaves
  unused (other tasks' heads in multi-task runs, a backbone pooler a method does not read).
"""
from __future__ import annotations

import os

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, TorchDynamoPlugin


def resolve_precision(value: str) -> str:
    """auto = bf16 where the GPU supports it, else full fp32 (CPU autocast is slower here). The
    schema allows only deepen_run.config.choices.Precision, so value is one of them."""
    if value != "auto":
        return str(value)
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


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
    """torch's fused AdamW runs on CUDA and (torch >= 2.4) on CPU, where it is ~3x faster than
    the default for-each kernel; the Trainer's default optimizer is the same fused kernel."""
    return device_type in ("cuda", "cpu")


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
