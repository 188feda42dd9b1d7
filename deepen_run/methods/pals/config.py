"""PALs' options and their check: light (no torch), so the schema registers and bad sizes fail
before anything heavy loads. The model is in deepen_run/methods/pals.py (it checks only what
needs the loaded backbone: its layer structure)."""
from __future__ import annotations

from dataclasses import dataclass

from deepen_run.config.choices import Pooling
from deepen_run.errors import UserError


@dataclass
class Config:
    """method=pals: projected attention layers for multi-task learning (Stickland & Murray 2019).

    name: the method (set by method=<option>)
    hidden_size_aug: d_s, the width of the projected space (the paper: 204 for BERT-base)
    num_heads: heads of the per-layer attention in the d_s space
    attention_dropout: dropout on those attention weights
    init_std: standard deviation of the new weights' normal initialisation
    freeze_backbone: train only PALs and heads (the paper fine-tunes everything: false)
    pooling: sentence vector: auto (the family's convention: BERT's shared pretrained pooler, as the paper; the first token for families whose checkpoints hold none) | pooler (the backbone's pooler; counted and trained as new where its checkpoint lacks it) | cls | mean | max
    """

    name: str = "pals"
    hidden_size_aug: int = 204
    num_heads: int = 6
    attention_dropout: float = 0.1
    init_std: float = 0.02
    freeze_backbone: bool = False
    pooling: Pooling = Pooling.auto


def check(cfg) -> None:
    """The run's pre-flight (whole config), before any model loads."""
    m = cfg.method
    if problem := size_problem(m.hidden_size_aug, m.num_heads):
        raise UserError(problem)


def size_problem(aug: int, heads: int) -> str | None:
    """Why d_s and the head count do not fit (each head gets d_s / heads dims), or None; shared
    with the model's constructor, which raises it as a ValueError for callers of the library."""
    if aug <= 0 or heads <= 0 or aug % heads:
        return f"method.hidden_size_aug={aug} must be a positive multiple of method.num_heads={heads}"
    return None
