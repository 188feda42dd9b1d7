"""The optimizer and the learning-rate schedule of a run: AdamW with the kernel train.optimizer_impl
picks, over parameter groups by tensor rank, by what a parameter is and (train.layer_decay) by how deep
it sits; transformers' schedule with its warm-up. docs/configuration.md (train.layer_decay) states the
rule, the layer-wise decay of the ELECTRA and DeBERTa recipes (BEiT's layer ids: embeddings 0, layer i
-> i + 1, the top L + 1 at the full rate). One rule for every method, so a comparison between methods
treats their new weights alike.
"""
from __future__ import annotations

import torch
from transformers import get_scheduler


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


def layer_depths(backbone: torch.nn.Module) -> tuple[dict[int, int], int]:
    """id(parameter) -> its depth by the backbone adapter (0 below the layer stack, i + 1 for layer
    position i, L + 1 above it: the pooler, a final norm), and L, the number of layers."""
    from deepen_run.model import adapter

    index = adapter.layer_index(backbone)
    return {id(p): index[n] for n, p in backbone.named_parameters()}, len(adapter.layers(backbone))


def lr_scale(depth: int | None, num_layers: int, decay: float) -> float:
    """decay^(L + 1 - depth); depth None (not in the embeddings or a layer) = the top, 1.0."""
    return 1.0 if depth is None or decay == 1.0 else decay ** (num_layers + 1 - depth)


def param_groups(model: torch.nn.Module, tcfg, new_params) -> list[dict]:
    """AdamW's groups: one per (decayed or not, learning rate), in the order parameters first come.
    No weight decay on 1-D tensors (biases, LayerNorm weights). new_params: what the method declared
    it created (contract.MethodModel.new_parameters) and what the backbone steps created."""
    decay = float(tcfg.get("layer_decay", 1.0))
    new = {id(p) for p in new_params}
    depths, num_layers = layer_depths(model.backbone) if decay != 1.0 else ({}, 0)
    groups: dict[tuple, list] = {}
    for p in model.parameters():
        if p.requires_grad:
            k = tcfg.new_params_lr_scale if id(p) in new else lr_scale(depths.get(id(p)), num_layers, decay)
            groups.setdefault((p.ndim >= 2, k), []).append(p)
    return [{"params": ps, "weight_decay": tcfg.weight_decay if wd else 0.0, "lr": tcfg.learning_rate * k}
            for (wd, k), ps in groups.items()]


def optimizer_for(model: torch.nn.Module, tcfg, device_type: str, new_params) -> torch.optim.Optimizer:
    impl = optimizer_impl(tcfg.get("optimizer_impl", "auto"), device_type)
    return torch.optim.AdamW(param_groups(model, tcfg, new_params), lr=tcfg.learning_rate, **adamw_kwargs(impl))


def scheduler_for(optimizer, tcfg, total_steps: int, processes: int = 1):
    """The schedule over total_steps optimizer steps. Accelerate's prepared scheduler steps once per
    process at every optimizer step, so with several processes it is laid out in those steps."""
    warmup = int(round(tcfg.warmup_ratio * total_steps))
    return get_scheduler(tcfg.lr_scheduler, optimizer, num_warmup_steps=warmup * processes,
                         num_training_steps=total_steps * processes)
