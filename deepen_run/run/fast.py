"""The Accelerator a run trains with, and the model's fast paths the run's Compute record chose
(deepen_run/precision.py resolves them once; docs/performance.md has the measurements): CUDA's TF32
matmuls, torch.compile through Accelerate's dynamo plugin (train.compile), CPU DDP over gloo for
several processes, cheaper dropout masks and unpadded layer Linears (train.dropout_masks, train.unpad)."""
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


def use_dropout_masks(model, compute: Compute) -> list[str]:
    """train.dropout_masks=fast: the model's dropouts draw cheaper masks (model/dropout.py). -> what was swapped."""
    if compute.dropout_masks != "fast":
        return []
    from deepen_run.model.dropout import install

    return install(model, model.backbone, compute.attention)


def use_unpad(model, compute: Compute) -> dict[str, str]:
    """train.unpad=on: the backbone's layer Linears skip the padding in training (model/unpad.py).
    -> the params saying what was chosen, why, and how many Linears."""
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
    set_threads()  # before the weights load: loading computes too (run/threads.py; recorded in train.setup)
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
