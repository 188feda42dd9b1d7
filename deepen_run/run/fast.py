"""Device fast paths in one place, so the loop stays plain (docs/performance.md has the measurements).

- bf16 autocast where the hardware runs bf16 matmuls natively: train.mixed_precision=auto picks it on
  a bf16 GPU and on a CPU with AMX or AVX-512 BF16; elsewhere, and with train.mixed_precision=no, the
  exact fp32 path. The runner resolves these choices once (deepen_run/precision.py, Compute); they
  and their reasons are run params.
- Training's layer Linears on the real tokens alone where bf16 runs on a CPU (use_unpad, train.unpad).
- Intra-op threads from the CPUs the process may use, OpenMP waiting passively (run/threads.py).
- CUDA: TF32 matmuls. AdamW's kernel: train.optimizer_impl (adamw_kwargs). Optional torch.compile
  (train.compile=true) through Accelerate's dynamo plugin, so unwrap_model / save / DDP keep working.
- Several processes (accelerate launch / torchrun): DDP must tolerate parameters a step leaves
  unused (other tasks' heads in multi-task runs, a backbone pooler a method does not read).
"""
from __future__ import annotations

import os

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, GradientAccumulationPlugin, TorchDynamoPlugin

from deepen_run.precision import Compute
from deepen_run.run.threads import set_threads


def enable_tf32() -> None:
    """TF32 tensor cores for fp32 matmuls on Ampere+ (torch's public switch); CUDA only: a CPU's fp32
    stays exact (torch >= 2.9 extends the switch to oneDNN, which is set back)."""
    if torch.cuda.is_available():
        torch.set_float32_matmul_precision("high")
        if hasattr(torch.backends.mkldnn, "matmul"):
            torch.backends.mkldnn.matmul.fp32_precision = "none"


def optimizer_impl(value: str, device_type: str) -> str:
    """train.optimizer_impl -> the AdamW kernel that runs: auto = fused where torch has it (one
    kernel over all tensors; foreach took ~3x its time per update on this project's idle CPU,
    docs/performance.md), else foreach. An explicit choice is kept as given."""
    if value != "auto":
        return str(value)
    return "fused" if device_type in ("cuda", "cpu") else "foreach"  # torch's fused kernels (CPU: >= 2.4)


def adamw_kwargs(impl: str) -> dict:
    """torch.optim.AdamW's keywords for an optimizer_impl: fused, foreach (one op over every tensor
    per arithmetic step) or loop (foreach=False: one tensor at a time, torch's reference path)."""
    return {"fused": {"fused": True}, "foreach": {"foreach": True}, "loop": {"foreach": False}}[impl]


def run_params(compute: Compute, tcfg, device_type: str) -> dict[str, str]:
    """What the run trains with, as params: its threads, the compute choices and why, AdamW's kernel."""
    return set_threads() | compute.params() | \
        {"train/optimizer_impl": optimizer_impl(tcfg.get("optimizer_impl", "auto"), device_type)}


def use_dropout_masks(model, compute: Compute) -> list[str]:
    """train.dropout_masks=fast (auto: bf16 on a CPU): the model's dropouts draw cheaper masks
    (deepen_run/model/dropout.py); returns what was swapped, nothing for torch's masks."""
    if compute.dropout_masks != "fast":
        return []
    from deepen_run.model.dropout import install

    return install(model, model.backbone, compute.attention)


def use_unpad(model, compute: Compute) -> dict[str, str]:
    """train.unpad=on (auto: bf16 on a CPU): the backbone's layer Linears skip the padding in training
    (deepen_run/model/unpad.py). -> the params saying what was chosen, why, and how many Linears."""
    choice, why = compute.unpad, compute.unpad_reason
    n = 0
    if choice == "on":
        from deepen_run.model import unpad

        ok, why_not = unpad.supported(model.backbone)
        if ok:
            n = unpad.install(model.backbone)
        else:
            choice, why = "off", why_not
    return {"train/unpad": choice, "train/unpad_reason": why, "train/unpad_linears": str(n)}


def cpu_processes() -> bool:
    """Several processes and no GPU: Accelerate runs DDP over gloo only when told `cpu`
    (else it silently trains each process alone); `accelerate launch --cpu` alone spawns one."""
    gpu = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    return not gpu and int(os.environ.get("WORLD_SIZE", "1")) > 1


def make_accelerator(tcfg, precision: str) -> Accelerator:
    """precision: the run's resolved one (Compute.precision)."""
    enable_tf32()
    set_threads()  # before the weights load: loading computes too (run/threads.py; recorded by run_params)
    # Inductor compiles again for each new padded length unless shapes are marked dynamic.
    dynamo = TorchDynamoPlugin(backend="inductor", dynamic=True) if tcfg.compile else None
    # One update every gradient_accumulation_steps micro-batches, the loop's step, and nothing else:
    # Accelerate's default also updates at a loader's end, but our loaders cycle (data.stream.TaskStream),
    # so that update would come mid-step, shift every later one, and not be in the checkpoint.
    accumulate = GradientAccumulationPlugin(num_steps=tcfg.gradient_accumulation_steps, sync_with_dataloader=False)
    return Accelerator(mixed_precision=precision,
                       gradient_accumulation_plugin=accumulate,
                       kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
                       dynamo_plugin=dynamo, cpu=cpu_processes())
