"""Backbone steps: changes to the loaded backbone, applied before any method builds on it, so they
compose with every method. STEPS is the registry, in the order they apply; each step is a module with

  check(cfg)              pre-flight (no weights loaded); raises UserError naming the key
  apply(backbone, cfg)    -> (copied, new): the parameters it added that start from pretrained ones
                          (trained at 1x) and those that start from scratch (new_params_lr_scale)
  record(backbone, ctx)   once the data is loaded, before training: log what the step did

Generic code calls these four functions and never asks which step or method runs.
"""
from __future__ import annotations

from dataclasses import dataclass

from deepen_run.model import duplication

STEPS = (duplication,)


@dataclass(frozen=True)
class Added:
    """What the steps added to the backbone: copies of pretrained weights, and new weights."""
    copied: tuple = ()
    new: tuple = ()


def check(cfg) -> None:
    for step in STEPS:
        step.check(cfg)


def apply(backbone, cfg) -> Added:
    copied, new = [], []
    for step in STEPS:
        c, n = step.apply(backbone, cfg)
        copied += c
        new += n
    return Added(tuple(copied), tuple(new))


def record(backbone, ctx) -> None:
    for step in STEPS:
        step.record(backbone, ctx)


def load(cfg):
    """The backbone of a run: loaded, then every step applied. -> (backbone, the parameters it was
    loaded with, Added): what model.new_parameters needs to tell pretrained weights from new ones."""
    from deepen_run.model import backbone as bb

    backbone = bb.load_model(cfg.backbone)
    loaded = tuple(backbone.parameters())
    return backbone, loaded, apply(backbone, cfg)
