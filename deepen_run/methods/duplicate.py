"""Layer duplication (Kao et al. 2020, arXiv 2001.09309): copy some pretrained layers, untrained,
right after themselves, then fine-tune the deeper model like the baseline.

The copying is a step on the backbone (deepen_run/duplication.py, `backbone.duplicate_layers`),
applied by the runner before any method builds; this method is the baseline on that backbone, and
`method.layers` the original spelling of the same list, kept so existing commands and runs stay
valid: `method=duplicate 'method.layers=[2,3]'` and `method=baseline 'backbone.duplicate_layers=[2,3]'`
are the same run (same RNG stream, same metrics). Giving both lists is an error.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from deepen_run.model import EncoderClassifier


@dataclass
class Config:
    name: str = "duplicate"
    layers: list[int] = field(default_factory=list)  # as backbone.duplicate_layers (0-based; twice = two copies)
    pooling: str = "pooler"  # as the baseline: pooler | cls | mean | max
    # Dev examples per task for duplicate/cosine_before_finetune (wins over backbone.cosine_samples).
    cosine_samples: int = 256


def build(backbone, cfg: Config, tasks):
    # The backbone arrives deepened (duplication.apply): nothing left to do but the baseline.
    return EncoderClassifier(backbone, tasks, pooling=cfg.pooling)
