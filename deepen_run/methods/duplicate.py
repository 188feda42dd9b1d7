"""Layer duplication (Kao et al. 2020, arXiv 2001.09309): copy some pretrained layers, untrained,
right after themselves, then fine-tune the deeper model like the baseline.

`layers` lists 0-based indices; an index listed twice gets two copies. The backbone's config
records the new depth, so the fine-tuned backbone saves and reloads with save_pretrained /
from_pretrained. Before training, after_build logs how far the copy step moved the output
(`duplicate/cosine_before_finetune`, see deepen_run/probe.py for the exact measure).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from deepen_run import layers as surgery
from deepen_run.model import EncoderClassifier


@dataclass
class Config:
    """method=duplicate: copy pretrained layers right after themselves, then fine-tune (Kao et al. 2020).

    name: the method (set by method=<option>)
    layers: 0-based layer indices to copy, e.g. [2,3]; an index listed twice gets two copies
    pooling: sentence vector: pooler | cls | mean | max (as the baseline)
    cosine_samples: dev examples per task for duplicate/cosine_before_finetune
    """
    name: str = "duplicate"
    layers: list[int] = field(default_factory=list)
    pooling: str = "pooler"  # as the baseline: pooler | cls | mean | max
    # Dev examples per task for duplicate/cosine_before_finetune.
    cosine_samples: int = 256


def backbone_depth(bcfg) -> int:
    """The backbone's layer count from its config file alone (no weights load)."""
    if not bcfg.pretrained:
        return bcfg.num_hidden_layers
    from transformers import AutoConfig

    from deepen_run.backbone import resolve

    kw = dict(revision=bcfg.revision, trust_remote_code=bcfg.trust_remote_code)
    try:  # a cached Hub config reads without the network (the preflight already found it)
        return AutoConfig.from_pretrained(resolve(bcfg.path), local_files_only=True, **kw).num_hidden_layers
    except (OSError, ValueError):
        return AutoConfig.from_pretrained(resolve(bcfg.path), **kw).num_hidden_layers


def check(cfg) -> None:
    """Runner hook, after the backbone preflight: bad indices fail before any weights load."""
    surgery.check_indices(list(cfg.method.layers), backbone_depth(cfg.backbone))
    if cfg.method.cosine_samples <= 0:
        from deepen_run.errors import UserError

        raise UserError(f"method.cosine_samples={cfg.method.cosine_samples} must be positive")


def build(backbone, cfg: Config, tasks):
    sources = surgery.duplicate(backbone, list(cfg.layers))
    model = EncoderClassifier(backbone, tasks, pooling=cfg.pooling)
    # Positions of the original layers in the deeper stack: running only these reproduces the
    # pretrained model exactly, with no second copy of its weights kept around.
    model.original_positions = [p for p, s in enumerate(sources) if p == 0 or sources[p - 1] != s]
    return model


@torch.no_grad()
def after_build(model, ctx) -> None:
    from deepen_run import probe

    mcfg = ctx.cfg.method
    sets = []
    for d in ctx.data.values():
        dev = next(iter(d.dev.values()))
        n = min(mcfg.cosine_samples, len(dev))
        sets.append(dev.shuffle(seed=ctx.cfg.seed).select(range(n)))
    batches = probe.sample_batches(sets, ctx.tokenizer, ctx.cfg.train.eval_batch_size)
    backbone = model.backbone.to(ctx.accelerator.device)
    was_training = backbone.training
    backbone.eval()  # dropout off: measure the function, not the noise
    with surgery.layer_order(backbone, model.original_positions):
        ref = probe.final_hidden(backbone, batches)
    cos = probe.mean_cosine(ref, probe.final_hidden(backbone, batches), batches)
    backbone.train(was_training)
    ctx.tracker.log_metrics({"duplicate/cosine_before_finetune": cos,
                             "model/num_layers": backbone.config.num_hidden_layers}, 0)
    ctx.tracker.set_tags({"duplicate.layers": str(list(mcfg.layers))})
    print(f"duplicate: layers {list(mcfg.layers)} -> {backbone.config.num_hidden_layers} layers; "
          f"cosine to the original before fine-tuning {cos:.4f}")
