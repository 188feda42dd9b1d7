"""Training on the real tokens only: the layers' Linears skip the padding (train.unpad; docs/performance.md).

A batch of SST-2 sentences padded to its longest holds about three positions for every real token, and
the Linears of the encoder layers (attention's q, k, v and output, the feed-forward pair) are most of a
step. Each of them maps every position on its own, so computing it on the real tokens alone gives
them the values they had: padding reaches a real token only as an attention key, where the padding
mask gives it weight 0. Padded positions get zeros instead (finite, and masked wherever they are
read). Attention, the norms and the activations still see the padded layout; nothing else changes.

`install` turns the Linears of the backbone's layers into TokenLinear (the same parameters, names and
state dict) and hooks the backbone so that each training forward knows its real tokens (Tokens).
Outside training they compute exactly what nn.Linear does: evaluation and predictions are unchanged.
Families whose layers also project something other than the tokens (DeBERTa's relative-position
table goes through the same q/k projections) are left as they are.
"""
from __future__ import annotations

from functools import partial
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from deepen_run.model import adapter


class Tokens:
    """The real tokens of the batch in the backbone now: its padding mask's shape and the flat indices
    of its ones, set for one training forward (None: no padding, or no forward running)."""

    def __init__(self) -> None:
        self.shape: Optional[torch.Size] = None
        self.index: Optional[torch.Tensor] = None

    def set(self, mask: Optional[torch.Tensor]) -> None:
        if mask is None or mask.dim() != 2 or bool(mask.all()):
            self.shape = self.index = None
            return
        self.shape, self.index = mask.shape, mask.reshape(-1).nonzero().squeeze(1)


class TokenLinear(nn.Linear):
    """nn.Linear that, in training, maps only the positions Tokens names and leaves zeros elsewhere."""

    tokens: Tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.tokens
        if not self.training or t.index is None or x.dim() != 3 or x.shape[:2] != t.shape:
            return super().forward(x)
        B, T, _ = x.shape
        y = F.linear(x.reshape(B * T, -1).index_select(0, t.index), self.weight, self.bias)
        return y.new_zeros(B * T, y.shape[-1]).index_copy(0, t.index, y).view(B, T, -1)


def supported(backbone: nn.Module) -> tuple[bool, str]:
    """-> (can this backbone's layers skip padding, why not)."""
    fam = adapter.family_of(backbone)
    if not fam.token_linears:
        return False, f"{backbone.config.model_type}'s layer Linears also map more than the tokens"
    return True, ""


def _set(tokens: Tokens, module, args, kwargs) -> None:
    tokens.set(kwargs.get("attention_mask") if module.training else None)


def _clear(tokens: Tokens, module, args, kwargs, output) -> None:
    tokens.set(None)


def install(backbone: nn.Module) -> int:
    """Turn the Linears of backbone's layers into TokenLinear, in place, and hook its forward to set
    their Tokens. Returns how many Linears now skip padding."""
    tokens, n = Tokens(), 0
    for layer in {id(m): m for m in adapter.layers(backbone)}.values():
        for m in layer.modules():
            if type(m) is nn.Linear:
                # The same module, parameters and hooks: only its forward changes (a subclass without
                # state of its own besides the shared Tokens).
                m.__class__, m.tokens = TokenLinear, tokens
                n += 1
    # partials, not closures: a deep copy of the model then hooks the copy's own Tokens.
    backbone.register_forward_pre_hook(partial(_set, tokens), with_kwargs=True)
    backbone.register_forward_hook(partial(_clear, tokens), with_kwargs=True)
    return n
