"""The baseline's options: light (no torch), so the schema registers before anything heavy loads.

Its preset method=duplicate (Kao et al. 2020) is configuration only: the baseline on a backbone
whose listed layers are copied (backbone.duplicate_layers, a backbone step that works with every
method); conf/method/duplicate.yaml maps its `method.layers` onto that key.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

from deepen_run.config.choices import Pooling
from deepen_run.errors import UserError


@dataclass
class Config:
    """method=baseline: plain fine-tuning, one linear head per task.

    name: the method (set by method=<option>)
    pooling: sentence vector: auto (the family's convention: BERT's/ALBERT's pretrained pooler, ModernBERT's classifier_pooling, the first token for families whose checkpoints hold no pooler: RoBERTa, XLM-R, ELECTRA, DeBERTa, DistilBERT) | pooler (the backbone's pooler; counted and trained as new where its checkpoint lacks it) | cls | mean | max
    """

    name: str = "baseline"
    pooling: Pooling = Pooling.auto


@dataclass
class Duplicate(Config):
    """method=duplicate: the baseline with pretrained layers copied right after themselves (Kao et al. 2020).

    name: the method (set by method=<option>)
    pooling: sentence vector: auto (the family's convention: BERT's/ALBERT's pretrained pooler, ModernBERT's classifier_pooling, the first token for families whose checkpoints hold no pooler: RoBERTa, XLM-R, ELECTRA, DeBERTa, DistilBERT) | pooler (the backbone's pooler; counted and trained as new where its checkpoint lacks it) | cls | mean | max
    layers: the older spelling of backbone.duplicate_layers (0-based, e.g. [2,3]; twice = two copies)
    """

    name: str = "duplicate"
    layers: list[int] = field(default_factory=list)


PRESETS = MappingProxyType({"duplicate": Duplicate})


def check(cfg) -> None:
    """method=duplicate's YAML sets backbone.duplicate_layers to ${method.layers}; a command line that
    also sets backbone.duplicate_layers replaced that link: two lists, which one was meant?"""
    layers = list(cfg.method.get("layers") or [])
    if layers:
        from deepen_run.model.backbone import depth
        from deepen_run.model.layers import check_indices

        check_indices(layers, depth(cfg.backbone), "method.layers")
    if layers and layers != list(cfg.backbone.duplicate_layers or []):
        raise UserError(f"backbone.duplicate_layers={list(cfg.backbone.duplicate_layers)} and method.layers={layers} "
                        "both set: method=duplicate is the baseline on a duplicated backbone; give the layers "
                        "once, as backbone.duplicate_layers (with any method) or method.layers (method=duplicate)")
