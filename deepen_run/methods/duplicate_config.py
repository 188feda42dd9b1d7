"""Layer duplication's options: light (no torch), so the schema registers without the model code.
The copy step itself and its checks are generic (deepen_run/duplication.py, run for every method)."""
from __future__ import annotations

from dataclasses import dataclass, field

from deepen_run.choices import Pooling


@dataclass
class Config:
    """method=duplicate: copy pretrained layers right after themselves, then fine-tune (Kao et al. 2020).

    name: the method (set by method=<option>)
    layers: the older spelling of backbone.duplicate_layers (0-based, e.g. [2,3]; twice = two copies)
    pooling: sentence vector: pooler | cls | mean | max (as the baseline)
    cosine_samples: dev examples per task for duplicate/cosine_before_finetune (wins over backbone.cosine_samples)
    """

    name: str = "duplicate"
    layers: list[int] = field(default_factory=list)  # as backbone.duplicate_layers (0-based; twice = two copies)
    pooling: Pooling = Pooling.pooler  # as the baseline: pooler | cls | mean | max
    # Dev examples per task for duplicate/cosine_before_finetune (wins over backbone.cosine_samples).
    cosine_samples: int = 256
