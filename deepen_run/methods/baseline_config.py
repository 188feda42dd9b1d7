"""The baseline's options: light (no torch), so the schema registers before anything heavy loads."""
from __future__ import annotations

from dataclasses import dataclass

from deepen_run.choices import Pooling


@dataclass
class Config:
    """method=baseline: plain fine-tuning, one linear head per task.

    name: the method (set by method=<option>)
    pooling: sentence vector: pooler (BERT's pretrained pooler, else cls) | cls | mean | max
    """

    name: str = "baseline"
    pooling: Pooling = Pooling.pooler  # pooler (BERT's pretrained pooler, else cls) | cls | mean | max
