"""Layer redundancy measurements (Kao et al. 2020, arXiv 2001.09309, the observation behind
method=duplicate): how far the final hidden states move when one layer is removed or run twice.

Similarity = cosine between a modified model's final hidden state and the unmodified model's at
each real (attention-mask = 1) token, averaged over an example's tokens, then over examples (so
long sentences do not outweigh short ones). Optionally, with a pretrained MLM head: the head's
accuracy at reconstructing randomly masked tokens.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn
from tqdm.auto import tqdm

from deepen_run.model import adapter
from deepen_run.model.layers import copy_layer, encoder_layers, layer_stack


def sample_batches(datasets_: list, tokenizer, batch_size: int) -> list[dict]:
    """Padded CPU batches (input_ids, attention_mask[, token_type_ids]) from tokenized datasets,
    sorted by length first: every measure here is per example, so order is free and sorting
    roughly halves the padded positions the probe computes."""
    from deepen_run.data.loaders import make_loader

    batches = []
    for ds in datasets_:
        lengths = [len(x) for x in ds["input_ids"]]
        ds = ds.select(sorted(range(len(ds)), key=lengths.__getitem__))
        for b in make_loader(ds, tokenizer, batch_size, shuffle=False, seed=0):
            batches.append({k: b[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in b})
    return batches


def _device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


def _on(module: nn.Module, batch: dict) -> dict:
    """The batch on the module's device, as the family's forward takes it (no segment ids for some)."""
    dev = _device(module)
    return adapter.inputs(module, **{k: v.to(dev) for k, v in batch.items()})


@torch.no_grad()
def final_hidden(backbone: nn.Module, batches: list[dict]) -> list[torch.Tensor]:
    return [backbone(**_on(backbone, b)).last_hidden_state.float() for b in batches]


def cosine_per_example(ref: torch.Tensor, out: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T, d) x 2 -> (B,): token cosine averaged over each example's real tokens."""
    mask = attention_mask.to(ref.device).float()
    cos = nn.functional.cosine_similarity(ref, out.float(), dim=-1)
    return (cos * mask).sum(1) / mask.sum(1).clamp(min=1.0)


def mean_cosine(ref: list[torch.Tensor], out: list[torch.Tensor], batches: list[dict]) -> float:
    return torch.cat([cosine_per_example(r, o, b["attention_mask"])
                      for r, o, b in zip(ref, out, batches)]).mean().item()


def mask_tokens(batches: list[dict], tokenizer, prob: float, seed: int) -> list[tuple[dict, torch.Tensor]]:
    """Replace a seeded random `prob` of the real, non-special tokens by the mask token (all of
    them by [MASK]: we measure reconstruction, not train); returns (masked batch, masked positions)."""
    from transformers import DataCollatorForLanguageModeling

    collate = DataCollatorForLanguageModeling(tokenizer, mlm_probability=prob, mask_replace_prob=1.0,
                                              random_replace_prob=0.0, seed=seed, return_tensors="pt")
    out = []
    for b in batches:
        rows = [{k: v[r].tolist() for k, v in b.items()} for r in range(len(b["input_ids"]))]
        m = collate(rows)
        out.append(({k: m[k] for k in b}, m["labels"] != -100))
    return out


def _hits(logits: torch.Tensor, pick: torch.Tensor, original: dict) -> tuple[int, int]:
    pred = logits.argmax(-1).cpu()
    return (pred[pick] == original["input_ids"][pick]).sum().item(), pick.sum().item()


@torch.no_grad()
def mlm_accuracy(mlm_model: nn.Module, masked: list[tuple[dict, torch.Tensor]], batches: list[dict]) -> float:
    hits = [_hits(mlm_model(**_on(mlm_model, b)).logits, pick, orig) for (b, pick), orig in zip(masked, batches)]
    return sum(h for h, _ in hits) / max(sum(n for _, n in hits), 1)


class _Replay(nn.Module):
    """Stands in for the bottom of the stack: returns those layers' recorded output (whatever
    type the layer returns) for the current batch, so only the layers above are recomputed."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self, *args, **kwargs):
        return self.value


def _copy_at(backbone: nn.Module, layer: nn.Module, position: int) -> nn.Module:
    """Layer i's copy as `backbone.duplicate_layers=[i]` builds it, one position up: the layer itself
    unless the family fits a copy to its new place (ModernBERT's layer 0 gains an attention norm)."""
    if adapter.family_of(backbone).fresh_norm_on_copy is None:
        return layer  # nothing to fit: the layer itself, no copy made
    fresh = copy_layer(backbone, layer)
    return fresh if adapter.fit_copy(backbone, fresh, position) else layer


@torch.no_grad()
def _sweep(backbone: nn.Module, call, batches: list[dict], desc: str, progress: bool):
    """Yield (layer i, "removed" | "duplicated", batch index, call(batch)) for every layer.

    Removing or repeating layer i leaves layers below i untouched, so their output is recorded
    once (a forward hook on layer i during its duplicated run) and replayed: L^2 + L layer passes
    per batch instead of 2 L^2. `call(batch)` runs the model that contains `backbone`.
    """
    layers = list(encoder_layers(backbone))
    below = [None] * len(batches)  # output of layer i-1 per batch; None: start at the embeddings
    for i in tqdm(range(len(layers)), desc=desc, disable=not progress, dynamic_ncols=True):
        twin = _copy_at(backbone, layers[i], i + 1)
        for bi, b in enumerate(batches):
            head = [adapter.stand_in(backbone, _Replay(below[bi]), layers[0])] if below[bi] is not None else []
            with layer_stack(backbone, head + layers[i + 1:]):
                removed = call(b)
            yield i, "removed", bi, removed
            seen = []
            hook = layers[i].register_forward_hook(lambda m, args, out, seen=seen: seen.append(out))
            try:
                with layer_stack(backbone, head + [layers[i], twin] + layers[i + 1:]):
                    duplicated = call(b)
            finally:
                hook.remove()
            below[bi] = seen[0]
            yield i, "duplicated", bi, duplicated


def redundancy(backbone: nn.Module, batches: list[dict], mlm_model: Optional[nn.Module] = None,
               masked: Optional[list] = None, progress: bool = True) -> tuple[list[dict], float]:
    """One row per layer i: cosine to the unmodified model with layer i removed / duplicated, and
    (with `mlm_model`, whose base model is `backbone`) the MLM head's accuracy in both cases.

    Returns (rows, the unmodified model's MLM accuracy or NaN).
    """
    model = mlm_model if mlm_model is not None else backbone
    was_training = model.training
    model.eval()
    depth = len(encoder_layers(backbone))
    rows = [{"layer": i, "cos_removed": 0.0, "cos_duplicated": 0.0,
             "mlm_acc_removed": math.nan, "mlm_acc_duplicated": math.nan} for i in range(depth)]
    ref = final_hidden(backbone, batches)
    n = sum(len(b["input_ids"]) for b in batches)
    for i, kind, bi, out in _sweep(backbone, lambda b: backbone(**_on(backbone, b)).last_hidden_state,
                                   batches, "probe layers (cosine)", progress):
        rows[i][f"cos_{kind}"] += cosine_per_example(ref[bi], out, batches[bi]["attention_mask"]).sum().item() / n
    ref_acc = math.nan
    if mlm_model is not None:
        ref_acc = mlm_accuracy(mlm_model, masked, batches)
        counts = {}
        inputs = [b for b, _ in masked]
        for i, kind, bi, logits in _sweep(backbone, lambda b: mlm_model(**_on(mlm_model, b)).logits,
                                          inputs, "probe layers (MLM)", progress):
            h, t = _hits(logits, masked[bi][1], batches[bi])
            c = counts.setdefault((i, kind), [0, 0])
            c[0], c[1] = c[0] + h, c[1] + t
        for (i, kind), (h, t) in counts.items():
            rows[i][f"mlm_acc_{kind}"] = h / max(t, 1)
    model.train(was_training)
    return rows, ref_acc


def suggest(rows: list[dict], k: int) -> list[int]:
    """The k layers whose duplication moves the final hidden states least (highest
    cos_duplicated; ties go to the lower layer): copying them starts fine-tuning closest to the
    pretrained function, which is the premise of the duplication method."""
    ranked = sorted(rows, key=lambda r: (-r["cos_duplicated"], r["layer"]))
    return sorted(r["layer"] for r in ranked[:k])
