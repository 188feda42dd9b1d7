"""Dropout whose random masks cost less than torch's (train.dropout_masks; docs/performance.md).

On a CPU, torch draws a dropout mask with `bernoulli_`, one Mersenne-Twister draw per element: about
160 M values/s, 17% of a bf16 MiniLM training step on an AVX-512 BF16 CPU. Here each element gets 16
random bits, cut from 64-bit words that `random_` fills (one draw per four elements), and is kept
when they reach p * 2^16: a mask of a 32 x 12 x 40 x 40 attention took 0.8 ms against bernoulli_'s
3.6 ms there. It is Bernoulli(1 - p) with p rounded to 2^-16 (0.1 becomes 0.100006), scaled by
1 / (1 - p) as torch's; only the random stream differs, so a run with these masks is as reproducible
(torch's seeded generator, saved in checkpoints) but not bit-equal to one with torch's.

`install` swaps every nn.Dropout of a model for FastDropout, and, in a backbone whose attention is
transformers' eager attention of the BERT families (EAGER_AS_BERT), the attention's dropout too
(eager_fast, registered with transformers' AttentionInterface). Outside training both compute
exactly what they replace: evaluation and predictions are unchanged.
"""
from __future__ import annotations

import torch
from torch import nn

NAME = "deepen_eager_fast"  # the attention function's name in transformers' AttentionInterface
# Families whose eager attention is BERT's line for line (tests/test_dropout.py checks the code).
EAGER_AS_BERT = ("bert", "roberta", "xlm-roberta", "electra", "camembert", "distilbert", "albert", "ernie")


def keep_mask(shape: torch.Size, p: float, device) -> torch.Tensor:
    """Bool mask, True with probability 1 - p (p rounded to 2^-16): 16 random bits an element, four
    elements a 64-bit draw (the full int64 range: random_() alone leaves the top bit 0)."""
    n = shape.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-2**63, 2**63 - 1)
    bits = words.view(torch.int16)[:n].view(shape)
    return bits >= -2**15 + round(p * 2**16)


def drop(x: torch.Tensor, p: float) -> torch.Tensor:
    """Training-mode dropout of x with probability p (0 < p < 1)."""
    # The scale as a Python number: in x's dtype (bf16) 1 / 0.9 would round to 1.109 and bias every value.
    return x.mul(keep_mask(x.shape, p, x.device)).mul_(1.0 / (1.0 - p))


class FastDropout(nn.Dropout):
    """nn.Dropout with keep_mask's masks; a no-op outside training, as torch's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.p == 1.0:
            return torch.zeros_like(x)
        return drop(x, self.p)


def eager_fast(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' eager attention of BERT (models/bert/modeling_bert.py, eager_attention_forward)
    with FastDropout's masks on the attention probabilities (dropout: their p, 0 outside training)."""
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = nn.functional.softmax(weights, dim=-1)
    if module.training and dropout > 0.0:
        weights = drop(weights, dropout)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return out, weights


def _register() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(NAME, eager_fast)
    # Its padding mask is eager attention's (additive, 4D): a name transformers has no mask for gets none.
    AttentionMaskInterface.register(NAME, eager_mask)


def install(model: nn.Module, backbone: nn.Module, attention: str | None) -> list[str]:
    """Swap model's dropouts for FastDropout (in place, parameters untouched); returns what was
    swapped: "hidden" and, where the backbone was built with the BERT families' eager attention
    (attention: the attn_implementation it was built with), "attention"."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                setattr(parent, name, FastDropout(child.p))
    done = ["hidden"]
    if backbone.config.model_type in EAGER_AS_BERT and attention == "eager":
        _register()
        backbone.set_attn_implementation(NAME)
        done.append("attention")
    return done
