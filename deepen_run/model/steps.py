"""Backbone steps: changes to the loaded backbone, applied before any method builds on it, so they
compose with every method. STEPS is the registry, in the order they apply; each step is a module with

  check(cfg)              pre-flight (no weights loaded); raises UserError naming the key
  apply(backbone, cfg)    -> (copied, new): the parameters it added that start from pretrained ones
                          (trained at 1x) and those that start from scratch (new_params_lr_scale)
  record(backbone, ctx)   once the data is loaded, before training: log what the step did
  after_train(backbone, ctx)  after the final evaluation: log what it learned (a no-op for most)

Generic code calls these four functions and never asks which step or method runs.
"""
from __future__ import annotations

from dataclasses import dataclass

from deepen_run.model import duplication, dwa

STEPS = (duplication, dwa)


@dataclass(frozen=True)
class Added:
    """What the steps added to the backbone: copies of pretrained weights, and new weights; and
    `fresh`, the backbone's own parameters its checkpoint did not hold (transformers initialised them
    at random, e.g. RoBERTa's pooler): part of the backbone as loaded, but new, not pretrained.
    `frozen`: what backbone.duplicate_train=copies keeps fixed whatever the method says (the original
    layers, embeddings and pooler; LLaMA Pro); the copies then train even under a frozen backbone."""
    copied: tuple = ()
    new: tuple = ()
    fresh: tuple = ()
    frozen: tuple = ()


def check(cfg) -> None:
    for step in STEPS:
        step.check(cfg)


def apply(backbone, cfg, fresh: tuple = ()) -> Added:
    copied, new = [], []
    for step in STEPS:
        c, n = step.apply(backbone, cfg)
        copied += c
        new += n
    frozen = ()
    if str(cfg.backbone.get("duplicate_train", "all")) == "copies":
        # Decided here, before any method adds weights to the backbone (LoRA's): only what the
        # backbone was loaded with is frozen, minus what a step made of it.
        ours = {id(p) for p in (*copied, *new, *fresh)}
        frozen = tuple(p for p in backbone.parameters() if id(p) not in ours)
    return Added(tuple(copied), tuple(new), tuple(fresh), frozen)


def train_new(added: Added) -> None:
    """What starts from scratch in the backbone (a step's gates or zeroed projections, weights its
    checkpoint lacked) trains even where the method froze the backbone (PALs' freeze_backbone freezes
    what was pretrained): frozen at its start, a gate would keep its copy out of the model for good."""
    for p in added.frozen:
        p.requires_grad_(False)
    for p in (*added.new, *added.fresh, *(added.copied if added.frozen else ())):
        p.requires_grad_(True)


def record(backbone, ctx) -> None:
    for step in STEPS:
        step.record(backbone, ctx)


def after_train(backbone, ctx) -> None:
    for step in STEPS:
        step.after_train(backbone, ctx)


def load(cfg, compute=None):
    """The backbone of a run: loaded, then every step applied. -> (backbone, the parameters it was
    loaded with, Added): what model.new_parameters needs to tell pretrained weights from new ones.
    compute: the run's resolved choices (deepen_run/precision.py), resolved here for a caller without."""
    from deepen_run.model import backbone as bb
    from deepen_run.precision import resolve

    attention = (compute or resolve(cfg.train)).attention
    backbone, fresh = bb.load_model(cfg.backbone, with_fresh=True, attention=attention)
    loaded = tuple(backbone.parameters())
    return backbone, loaded, apply(backbone, cfg, fresh)
