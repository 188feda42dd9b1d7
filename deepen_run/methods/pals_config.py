"""PALs' options: light (no torch), so the schema registers before anything heavy loads.
The model is in deepen_run/methods/pals.py (it checks the sizes against the backbone it gets)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Config:
    """method=pals: projected attention layers for multi-task learning (Stickland & Murray 2019).

    name: the method (set by method=<option>)
    hidden_size_aug: d_s, the width of the projected space (the paper: 204 for BERT-base)
    num_heads: heads of the per-layer attention in the d_s space
    attention_dropout: dropout on those attention weights
    init_std: standard deviation of the new weights' normal initialisation
    freeze_backbone: train only PALs and heads (the paper fine-tunes everything: false)
    pooling: sentence vector: pooler (shared pretrained pooler, as the paper) | cls | mean | max
    """

    name: str = "pals"
    hidden_size_aug: int = 204  # d_s; the paper's value for BERT-base
    num_heads: int = 6  # heads of the per-layer attention in the d_s space
    attention_dropout: float = 0.1
    init_std: float = 0.02
    freeze_backbone: bool = False  # the paper fine-tunes everything; true = only PALs + heads train
    pooling: str = "pooler"  # the shared pretrained pooler (as the paper), else cls | mean | max
