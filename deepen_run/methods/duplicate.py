"""Layer duplication (Kao et al. 2020, arXiv 2001.09309): copy some pretrained layers, untrained,
right after themselves, then fine-tune the deeper model like the baseline.

The copying is a step on the backbone (deepen_run/duplication.py, `backbone.duplicate_layers`),
applied by the runner before any method builds; this method is the baseline on that backbone, and
`method.layers` the original spelling of the same list, kept so existing commands and runs stay
valid: `method=duplicate 'method.layers=[2,3]'` and `method=baseline 'backbone.duplicate_layers=[2,3]'`
are the same run (same RNG stream, same metrics). Giving both lists is an error.
"""
from __future__ import annotations

from deepen_run.methods.duplicate_config import Config  # noqa: F401 (the contract)
from deepen_run.model import EncoderClassifier


def build(backbone, cfg: Config, tasks):
    # The backbone arrives deepened (duplication.apply): nothing left to do but the baseline.
    return EncoderClassifier(backbone, tasks, pooling=cfg.pooling)
