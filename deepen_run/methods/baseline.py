"""Plain fine-tuning: the backbone, a pooled sentence vector and one linear head per task."""
from __future__ import annotations

from dataclasses import dataclass

from deepen_run.model import EncoderClassifier


@dataclass
class Config:
    """method=baseline: plain fine-tuning, one linear head per task.

    name: the method (set by method=<option>)
    pooling: sentence vector: pooler (BERT's pretrained pooler, else cls) | cls | mean | max
    """
    name: str = "baseline"
    pooling: str = "pooler"  # pooler (BERT's pretrained pooler, else cls) | cls | mean | max


def build(backbone, cfg: Config, tasks):
    return EncoderClassifier(backbone, tasks, pooling=cfg.pooling)
