"""Layer duplication as a step on the backbone (Kao et al. 2020, arXiv 2001.09309).

`backbone.duplicate_layers=[2,3]` inserts an untrained copy of each listed layer (0-based) right
after itself, once the backbone has loaded and before any method builds on it, so every method
(baseline, hire, pals, ...) runs on the deeper encoder. An index listed twice gets two copies.

method=duplicate is the baseline on such a backbone; its `method.layers` is the older spelling
of the same list. Giving both is an error (which one did you mean?), not a concatenation.

Whenever layers were duplicated, record() logs `duplicate/cosine_before_finetune`: how far the
copies moved the final hidden states before fine-tuning (deepen_run/probe.py's measure, on up to
`backbone.cosine_samples` dev examples per task; method=duplicate's `method.cosine_samples` wins
for that method) and the tag `duplicate.layers`; the runner logs `model/num_layers` and
`params/duplicated` (the copies' parameters) for every run.
"""
from __future__ import annotations

import torch

from deepen_run import layers as surgery
from deepen_run.errors import UserError


def requested(cfg) -> tuple[str, list[int]]:
    """(the config key that asked, the indices to duplicate); the key names the culprit in errors."""
    dup = list(cfg.backbone.get("duplicate_layers") or [])
    legacy = list(cfg.method.get("layers") or []) if cfg.method.name == "duplicate" else []
    if dup and legacy:
        raise UserError(f"backbone.duplicate_layers={dup} and method.layers={legacy} both set: method=duplicate "
                        "is the baseline on a duplicated backbone; give the layers once, as "
                        "backbone.duplicate_layers (with any method) or method.layers (method=duplicate)")
    return ("method.layers", legacy) if legacy else ("backbone.duplicate_layers", dup)


def cosine_samples(cfg) -> int:
    return cfg.method.get("cosine_samples") or cfg.backbone.get("cosine_samples", 256)


def check(cfg) -> None:
    """Pre-flight, whatever the method: bad indices fail before any weights load. The depth comes
    from the backbone's config file alone."""
    key, indices = requested(cfg)
    for what, n in (("backbone.cosine_samples", cfg.backbone.get("cosine_samples", 256)),
                    ("method.cosine_samples", cfg.method.get("cosine_samples", 1))):
        if n is not None and n <= 0:
            raise UserError(f"{what}={n} must be positive")
    if indices:
        from deepen_run.backbone import depth

        surgery.check_indices(indices, depth(cfg.backbone), key)


def apply(backbone, cfg) -> list[int]:
    """Deepen a freshly loaded backbone as the config asks; returns the per-position source list
    (also kept on the backbone, see layers.sources). Draws no random numbers, so a run's RNG
    stream (and thus its head init and batches) is the same as before duplication moved here."""
    key, indices = requested(cfg)
    if not indices:
        return surgery.sources(backbone)
    return surgery.duplicate(backbone, indices, key)


def load(cfg):
    """The backbone of a run: loaded, then deepened. Anything that builds a run's model uses this."""
    from deepen_run import backbone as bb

    backbone = bb.load_model(cfg.backbone)
    apply(backbone, cfg)
    return backbone


def duplicated(backbone) -> bool:
    src = surgery.sources(backbone)
    return len(set(src)) < len(src)


@torch.no_grad()
def record(backbone, ctx) -> None:
    """Log the copy step's effect before training; a no-op when nothing was duplicated."""
    if not duplicated(backbone):
        return
    from deepen_run import probe

    cfg, n = ctx.cfg, cosine_samples(ctx.cfg)
    sets = []
    for d in ctx.data.values():
        dev = next(iter(d.dev.values()))
        sets.append(dev.shuffle(seed=cfg.seed).select(range(min(n, len(dev)))))
    batches = probe.sample_batches(sets, ctx.tokenizer, cfg.train.eval_batch_size)
    backbone = backbone.to(ctx.accelerator.device)
    was_training = backbone.training
    backbone.eval()  # dropout off: measure the function, not the noise
    with surgery.layer_order(backbone, surgery.original_positions(surgery.sources(backbone))):
        ref = probe.final_hidden(backbone, batches)
    cos = probe.mean_cosine(ref, probe.final_hidden(backbone, batches), batches)
    backbone.train(was_training)
    layers = requested(cfg)[1]
    depth = backbone.config.num_hidden_layers
    # model/num_layers is in the runner's params/* sizes, logged for every run.
    ctx.tracker.log_metrics({"duplicate/cosine_before_finetune": cos}, 0)
    ctx.tracker.set_tags({"duplicate.layers": str(layers)})
    ctx.accelerator.print(f"duplicate: layers {layers} -> {depth} layers; "
                          f"cosine to the original before fine-tuning {cos:.4f}")
