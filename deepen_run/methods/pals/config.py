"""PALs' options and their check: light (no torch), so the schema registers and bad sizes fail
before anything heavy loads. The model is in deepen_run/methods/pals/model.py (it checks only what
needs the loaded backbone: its layer structure)."""
from __future__ import annotations

from dataclasses import dataclass

from deepen_run.config.choices import Pooling, StrEnum
from deepen_run.errors import UserError


class Variant(StrEnum):
    """method.variant: the adaptation rows of the PALs paper (docs/methods.md, section PALs' variants)."""
    pals = "pals"          # projected attention in every layer (the paper's PALs)
    top_pal = "top_pal"    # "Top Proj. Attn.": projected attention layers on top of the shared encoder only
    low_rank = "low_rank"  # a task-specific low-rank transform in every layer instead of the projected attention


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
    variant: pals (every layer, the paper's PALs) | top_pal (Top Proj. Attn.: attention layers on top only) | low_rank (a low-rank transform per layer)
    low_rank_size: width of variant=low_rank's transform (the paper: 100, its 1.13x budget)
    top_layers: variant=top_pal's attention layers in the d_s space (the authors' code: 6)
    top_heads: heads of each of those layers (the authors' code: 12)
    """

    name: str = "pals"
    hidden_size_aug: int = 204
    num_heads: int = 6
    attention_dropout: float = 0.1
    init_std: float = 0.02
    freeze_backbone: bool = False
    pooling: Pooling = Pooling.auto
    variant: Variant = Variant.pals
    low_rank_size: int = 100
    top_layers: int = 6
    top_heads: int = 12


def check(cfg) -> None:
    """The run's pre-flight (whole config), before any model loads."""
    m = cfg.method
    if not 0 <= m.attention_dropout < 1:  # `not` also catches NaN
        raise UserError(f"method.attention_dropout={m.attention_dropout} must be in [0, 1)")
    if not 0 <= m.init_std < float("inf"):
        raise UserError(f"method.init_std={m.init_std} must be a finite number >= 0")
    if problem := variant_problem(m):
        raise UserError(problem)


def variant_problem(m) -> str | None:
    """Why the chosen variant's sizes do not fit, or None; its model's constructor raises it too."""
    variant = Variant(str(m.variant))
    if variant == Variant.low_rank:
        ok = m.low_rank_size > 0
        return None if ok else f"method.low_rank_size={m.low_rank_size} must be positive (method.variant=low_rank)"
    if variant == Variant.top_pal:
        if m.top_layers < 1:
            return f"method.top_layers={m.top_layers} must be at least 1 (method.variant=top_pal)"
        problem = size_problem(m.hidden_size_aug, m.top_heads)
        return problem and problem.replace("method.num_heads", "method.top_heads") + " (method.variant=top_pal)"
    return size_problem(m.hidden_size_aug, m.num_heads)


def size_problem(aug: int, heads: int) -> str | None:
    """Why d_s and the head count do not fit (each head gets d_s / heads dims), or None; shared
    with the model's constructor, which raises it as a ValueError for callers of the library."""
    if aug <= 0 or heads <= 0 or aug % heads:
        return f"method.hidden_size_aug={aug} must be a positive multiple of method.num_heads={heads}"
    return None
