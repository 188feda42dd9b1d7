"""Pieces every method shares: per-task heads, pooling, the task loss, parameter accounting."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from deepen_run.data.glue import TaskSpec
from deepen_run.output import Output
from deepen_run.model import adapter


def pool(hidden: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """(B, T, d) -> (B, d): first token, or a mean / max over real (unpadded) tokens."""
    if how == "cls":
        return hidden[:, 0]
    m = mask.unsqueeze(-1).to(hidden.dtype)
    if how == "mean":
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)
    if how == "max":
        return hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).max(1).values
    raise ValueError(f"unknown pooling {how!r}; use cls, mean or max")


class TaskHeads(nn.ModuleDict):
    """One dropout + linear classifier (or regressor, 1 output) per task."""

    def __init__(self, tasks: list[TaskSpec], dim: int, dropout: float):
        super().__init__({t.name: nn.Sequential(nn.Dropout(dropout), nn.Linear(dim, t.num_labels))
                          for t in tasks})
        for head in self.values():
            nn.init.normal_(head[1].weight, std=0.02)
            nn.init.zeros_(head[1].bias)


class EncoderClassifier(nn.Module):
    """Backbone -> pooled sentence vector -> the task's head. The baseline, and a base to extend.

    pooling: auto = the family's convention (deepen_run/model/adapter.py, pooling: BERT's and ALBERT's
    pretrained pooler, the first token for families whose checkpoints hold none), pooler = the
    backbone's pooler layer (new where the checkpoint lacks it: params/backbone_new), cls, mean, max.
    """

    def __init__(self, backbone: nn.Module, tasks: list[TaskSpec], pooling: str = "auto"):
        super().__init__()
        self.backbone = backbone
        self.pooling = adapter.pooling(backbone, str(pooling))
        dropout = getattr(backbone.config, "hidden_dropout_prob", 0.1)
        self.heads = TaskHeads(tasks, backbone.config.hidden_size, dropout)

    def encode(self, task: str, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        out = self.backbone(**adapter.inputs(self.backbone, input_ids, attention_mask, token_type_ids))
        if self.pooling == "pooler":
            return adapter.pooled(out)
        return pool(out.last_hidden_state, attention_mask, self.pooling)

    def forward(self, task: str, input_ids, attention_mask, token_type_ids=None) -> Output:
        return Output(self.heads[task](self.encode(task, input_ids, attention_mask, token_type_ids)))

    def new_parameters(self) -> list[nn.Parameter]:
        """The heads; a subclass adds what it builds (contract.MethodModel.new_parameters)."""
        return list(self.heads.parameters())


def task_loss(logits: torch.Tensor, labels: torch.Tensor, regression: bool) -> torch.Tensor:
    if regression:
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    return F.cross_entropy(logits.float(), labels)


def count(module: nn.Module, trainable_only: bool = False) -> int:
    # Count each tensor once: a method may share a parameter between modules.
    seen = {id(p): p for p in module.parameters() if p.requires_grad or not trainable_only}
    return sum(p.numel() for p in seen.values())


def new_parameters(model: nn.Module, loaded, added) -> tuple:
    """What starts from scratch (trained at train.new_params_lr_scale x lr): the method's declaration
    (contract.MethodModel.new_parameters), the backbone steps' new weights and the backbone's parameters
    its checkpoint did not hold (backbone_steps.Added: new and fresh).
    loaded: the parameters the backbone was loaded with (the tensors, not their ids: a module a method
    replaces is freed, and a new tensor may reuse a freed id). Every parameter must be loaded, a
    step's, or declared by the method: one built but not declared would silently train at the
    pretrained rate, so it is an error (naming it) instead."""
    new = (*model.new_parameters(), *added.new, *added.fresh)
    known = {id(p) for p in (*loaded, *new, *added.copied)}
    undeclared = [n for n, p in model.named_parameters() if id(p) not in known]
    if undeclared:
        raise RuntimeError(f"{type(model).__name__} built parameters it does not declare in new_parameters(): "
                           f"{', '.join(undeclared[:5])}{' ...' if len(undeclared) > 5 else ''}")
    return new


def param_report(model: nn.Module, backbone_params: int, duplicated: int = 0, fresh: int = 0) -> dict[str, float]:
    """Sizes for params/*; backbone, duplicated, method and heads add up to params/total: backbone =
    the backbone as loaded, duplicated = the layer copies (backbone.duplicate_layers, gates included),
    method = what the method added on top of the (deepened) backbone, heads. ratio = total / backbone.
    backbone_new = the part of backbone its checkpoint did not hold (randomly initialised by
    transformers, e.g. RoBERTa's pooler), trained as new (train.new_params_lr_scale)."""
    total = count(model)
    heads = count(model.heads) if hasattr(model, "heads") else 0
    return {"params/backbone": backbone_params, "params/backbone_new": fresh, "params/duplicated": duplicated,
            "params/method": total - backbone_params - duplicated - heads,
            "params/heads": heads, "params/total": total, "params/trainable": count(model, True),
            "params/ratio": total / backbone_params}
