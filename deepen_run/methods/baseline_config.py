"""The baseline's options: light (no torch), so the schema registers before anything heavy loads."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Config:
    name: str = "baseline"
    pooling: str = "pooler"  # pooler (BERT's pretrained pooler, else cls) | cls | mean | max
