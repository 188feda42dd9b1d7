"""Plain fine-tuning: the backbone, a pooled sentence vector and one linear head per task."""
from __future__ import annotations

from deepen_run.methods.baseline.config import Config  # noqa: F401 (the method's contract)
from deepen_run.model.heads import EncoderClassifier


def build(backbone, cfg: Config, tasks):
    return EncoderClassifier(backbone, tasks, pooling=cfg.pooling)
