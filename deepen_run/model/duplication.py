"""Layer duplication as a step on the backbone (Kao et al. 2020, arXiv 2001.09309; docs/methods.md,
section Layer duplication).

`backbone.duplicate_layers=[2,3]` inserts a copy of each listed layer (0-based) right after itself,
once the backbone has loaded and before any method builds on it, so every method runs on the deeper
encoder. An index listed twice gets two copies. `backbone.duplicate_init` says how a copy enters:
  plain   the copy's output replaces its input, as in the paper: the deeper model computes another
          function than the pretrained one before fine-tuning
  gated   the copy starts as the identity, so the deeper model computes exactly the pretrained function
          at step 0, in the family's own way (deepen_run/model/adapter.py, identity_copy):
          post-LN (BERT, RoBERTa, ...): the copy's output is h + g * (copy(h) - h), g a learned scalar
            per copy starting at 0, a new parameter (train.new_params_lr_scale)
          pre-LN (ModernBERT): the copy's output projections (attention and MLP) start at zero, so the
            block adds nothing to its residual stream (LLaMA Pro, ours); those zeroed weights are new
          the copies' other weights are pretrained ones (1x)
A family whose layers share one set of weights (ALBERT) cannot copy a layer: refused in the pre-flight.
`backbone.duplicate_train` says what trains: all (the paper: the whole deeper model) or copies (LLaMA Pro,
Wu et al. 2024: the copies alone, with the gates, heads and method weights; the originals, embeddings
and pooler stay frozen; deepen_run/model/steps.py, Added.frozen).

Whenever layers were duplicated, record() logs `duplicate/cosine_before_finetune`: how far the
copies moved the final hidden states before fine-tuning (deepen_run/model/probe.py's measure, on up to
`backbone.cosine_samples` dev examples per task) and the tag `duplicate.layers`; the runner logs
`model/num_layers` and `params/duplicated` (the copies' parameters, gates included) for every run.
"""
from __future__ import annotations

import torch
from torch import nn

from deepen_run.model import adapter
from deepen_run.model import layers as surgery
from deepen_run.errors import UserError

GATE = "copy_gate"  # the parameter a gated copy carries: <layer>.copy_gate


def check(cfg) -> None:
    """Pre-flight: bad indices fail before any weights load. The depth comes from the backbone's
    config file alone."""
    b = cfg.backbone
    if b.cosine_samples <= 0:
        raise UserError(f"backbone.cosine_samples={b.cosine_samples} must be positive")
    if b.duplicate_layers:
        from deepen_run.model.backbone import depth, model_type

        adapter.refuse_shared(model_type(b), "backbone.duplicate_layers")
        surgery.check_indices(list(b.duplicate_layers), depth(b), "backbone.duplicate_layers")
    if str(b.get("duplicate_train", "all")) == "copies" and not b.duplicate_layers:
        raise UserError("backbone.duplicate_train=copies trains only the layer copies, but "
                        "backbone.duplicate_layers is empty; list the layers to copy, e.g. "
                        "'backbone.duplicate_layers=[2,3]'")


def _gated(layer: nn.Module, args, kwargs, output):
    """Forward hook of a gated copy: h + g * (copy(h) - h), h the copy's input. Registered first
    (prepend), so whatever else reads the layer's output (transformers' hidden_states) reads this."""
    h = args[0] if args else kwargs["hidden_states"]
    g = getattr(layer, GATE)
    if isinstance(output, tuple):
        return (h + g * (output[0] - h), *output[1:])
    return h + g * (output - h)


def apply(backbone, cfg) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """Deepen a freshly loaded backbone as the config asks. -> (the copies' parameters, the new
    ones: gates, zeroed projections, norms a copy gained). Draws no random numbers, so a run's RNG stream
    (and thus its head init and batches) is the same with and without duplication."""
    indices = list(cfg.backbone.duplicate_layers or [])
    if not indices:
        return [], []
    src = surgery.duplicate(backbone, indices, "backbone.duplicate_layers")
    layers = surgery.encoder_layers(backbone)
    originals = set(surgery.original_positions(src))
    copies = [(p, layers[p]) for p in range(len(src)) if p not in originals]
    new = []
    for p, layer in copies:
        new += adapter.fit_copy(backbone, layer, p)
        if cfg.backbone.duplicate_init != "gated":
            continue
        zeroed = adapter.identity_copy(backbone, layer)
        if zeroed is None:  # post-LN: no weight makes the block the identity, a gate does
            layer.register_parameter(GATE, nn.Parameter(torch.zeros(())))
            layer.register_forward_hook(_gated, with_kwargs=True, prepend=True)
            zeroed = [getattr(layer, GATE)]
        new += zeroed
    new_ids = {id(g) for g in new}
    return [p for _, layer in copies for p in layer.parameters() if id(p) not in new_ids], new


def duplicated(backbone) -> bool:
    src = surgery.sources(backbone)
    return len(set(src)) < len(src)


def after_train(backbone, ctx) -> None:
    """Nothing: what the copies learned is in the run's scores and saved weights."""


@torch.no_grad()
def record(backbone, ctx) -> None:
    """Log the copy step's effect before training; a no-op when nothing was duplicated."""
    if not duplicated(backbone):
        return
    from deepen_run.model import probe

    cfg, n = ctx.cfg, ctx.cfg.backbone.cosine_samples
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
    layers = list(cfg.backbone.duplicate_layers)
    depth = backbone.config.num_hidden_layers
    # model/num_layers is in the runner's params/* sizes, logged for every run.
    ctx.tracker.log_metrics({"duplicate/cosine_before_finetune": cos}, 0)
    ctx.tracker.set_tags({"duplicate.layers": str(layers)})
    ctx.accelerator.print(f"duplicate: layers {layers} ({cfg.backbone.duplicate_init}) -> {depth} layers; "
                          f"cosine to the original before fine-tuning {cos:.4f}")
