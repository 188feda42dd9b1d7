"""The optimizer and the learning-rate schedule of a run: AdamW over the parameter groups of
deepen_run/run/param_groups.py with the kernel train.optimizer_impl picks, and transformers'
schedule with its warm-up."""
from __future__ import annotations

import torch
from transformers import get_scheduler

from deepen_run.run.fast import adamw_kwargs, optimizer_impl
from deepen_run.run.param_groups import param_groups


def optimizer_for(model: torch.nn.Module, tcfg, device_type: str, new_params) -> torch.optim.Optimizer:
    """AdamW; no weight decay on biases and LayerNorm weights (every 1-D tensor). Its kernel is
    train.optimizer_impl (fast.optimizer_impl: auto = fused where torch has one, CUDA and CPU).

    One rule for every method, so a comparison between methods treats their new weights alike:
    `new_params`, what the method declared it created (contract.MethodModel.new_parameters: heads,
    HIRE's GRUs, PALs, an adapter inside the backbone) and what the backbone steps created (a gated
    copy's gate), train at train.new_params_lr_scale x train.learning_rate, wherever they sit;
    everything else (the pretrained backbone, its pooler, copies of its layers) at 1x. The
    schedule then scales every group alike. train.layer_decay lowers the pretrained layers' rates
    with depth (deepen_run/run/param_groups.py).
    """
    params = param_groups(model, tcfg, new_params)
    impl = optimizer_impl(tcfg.get("optimizer_impl", "auto"), device_type)
    return torch.optim.AdamW(params, lr=tcfg.learning_rate, **adamw_kwargs(impl))


def scheduler_for(optimizer, tcfg, total_steps: int):
    warmup = int(round(tcfg.warmup_ratio * total_steps))
    return get_scheduler(tcfg.lr_scheduler, optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)
