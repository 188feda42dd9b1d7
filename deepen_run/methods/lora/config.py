"""LoRA's options: light (no torch). The model, through the `peft` library, is in
deepen_run/methods/lora/model.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from deepen_run.config.choices import Pooling
from deepen_run.errors import UserError


@dataclass
class Config:
    """method=lora: one PEFT LoRA adapter per task on a shared backbone (Hu et al. 2021), PALs' standard alternative.

    name: the method (set by method=<option>)
    rank: r of every adapted projection; null = the rank whose per-task size matches PALs' (method=pals defaults) on this backbone, logged as param lora.rank
    alpha: LoRA's scaling numerator (the update is alpha / r * B A); null = the rank (a scale of 1)
    dropout: dropout on the adapter's input
    train_backbone: also fine-tune the backbone (false: only the adapters and heads train, as LoRA)
    pooling: sentence vector: auto (the family's convention, as method=baseline) | pooler | cls | mean | max
    """

    name: str = "lora"
    rank: Optional[int] = None
    alpha: Optional[float] = None
    dropout: float = 0.0
    train_backbone: bool = False
    pooling: Pooling = Pooling.auto


def check(cfg) -> None:
    m = cfg.method
    if m.rank is not None and m.rank < 1:
        raise UserError(f"method.rank={m.rank} must be a positive integer (null: PALs' per-task budget)")
    if not 0 <= m.dropout < 1:  # `not` also catches NaN
        raise UserError(f"method.dropout={m.dropout} must be in [0, 1)")
    if m.alpha is not None and not 0 < m.alpha < float("inf"):
        raise UserError(f"method.alpha={m.alpha} must be a positive number (null: the rank)")
