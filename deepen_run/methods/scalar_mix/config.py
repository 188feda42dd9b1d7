"""The scalar mix's options: light (no torch). The model is in deepen_run/methods/scalar_mix/model.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from deepen_run.config.choices import Pool


@dataclass
class Config:
    """method=scalar_mix: ELMo's scalar mix of the hidden states, one per task (Peters et al. 2018).

    name: the method (set by method=<option>)
    include_embeddings: also mix the embedding output H_0 (jiant and AllenNLP do; the default mixes layers 1..L)
    pool: mixed sequence -> sentence vector: cls | mean | max
    dropout: head dropout; null = the backbone's hidden_dropout_prob
    """

    name: str = "scalar_mix"
    include_embeddings: bool = False
    pool: Pool = Pool.cls
    dropout: Optional[float] = None


def check(cfg) -> None:
    from deepen_run.errors import UserError

    d = cfg.method.dropout
    if d is not None and not 0 <= d < 1:  # `not` also catches NaN
        raise UserError(f"method.dropout={d} must be in [0, 1) (null: the backbone's hidden_dropout_prob)")
