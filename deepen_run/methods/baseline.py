"""Plain fine-tuning: the backbone, a pooled sentence vector and one linear head per task."""
from __future__ import annotations

from dataclasses import dataclass

from deepen_run.model import EncoderClassifier


@dataclass
class Config:
    name: str = "baseline"
    pooling: str = "pooler"  # pooler (BERT's pretrained pooler, else cls) | cls | mean | max


def build(backbone, cfg: Config, tasks):
    return EncoderClassifier(backbone, tasks, pooling=cfg.pooling)
