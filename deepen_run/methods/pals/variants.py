"""The PALs paper's other adaptation rows (docs/methods.md, section "PALs' variants"): method.variant=
top_pal ("Top Proj. Attn.") and low_rank. method.variant=pals is model.py's PALsModel.

top_pal, for task t, on top of the shared encoder's last layer H_L (the authors' `config.top`):

    x_0 = V_E_t H_L,   x_k = LN_{t,k}(x_{k-1} + Dropout(W_O_{t,k} MHA_{t,k}(x_{k-1}))),  k = 1..K,   H' = V_D_t x_K

  V_E_t: Linear(d -> d_s), V_D_t: Linear(d_s -> d) (no activation), K = method.top_layers (6) layers
  of attention in the d_s space with method.top_heads (12) heads, q/k/v and an output projection
  W_O, a LayerNorm(d_s) each. The shared pooler (or the pooling) then reads H' instead of H_L.

low_rank, for task t and layer l with input h (the authors' BERTLowRank, `config.mult` without pals):

    H_l = LN2(a + Dropout(W_2 GELU(W_1 a)) + V_D_{t,l} GELU(V_E_{t,l} h))

  a separate Linear(d -> r) / Linear(r -> d) pair per task and layer, r = method.low_rank_size
  (the paper: 100), added inside the output LayerNorm exactly where PALs add theirs.

The backbone stays untouched: low_rank hooks into each layer as PALs do (the adapter's
hook_residual_term: read h before the layer, add the term where the family takes it); top_pal only rereads the last hidden state. This file
reaches the layers through the backbone adapter (deepen_run/model/adapter.py), as PALs do.
"""
from __future__ import annotations

from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch import nn

from deepen_run.methods.pals.config import Config, Variant, variant_problem
from deepen_run.model import adapter
from deepen_run.methods.pals.terms import LayerTerms
from deepen_run.model.heads import EncoderClassifier, pool


def _init(module: nn.Module, std: float) -> None:
    """New weights N(0, std), biases zero (the authors' init); LayerNorms start as identity (ours)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            nn.init.zeros_(m.bias)


def _additive_mask(keep: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if keep is None:
        return None
    # A large negative rather than -inf, so even an all-padding row stays finite.
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, torch.finfo(dtype).min)


class TopLayer(nn.Module):
    """One attention sublayer in the d_s space: LN(x + Dropout(W_O MHA(x))) (the authors' BERTAttention(config, 12))."""

    def __init__(self, dim: int, heads: int, attention_dropout: float, hidden_dropout: float, eps: float):
        super().__init__()
        self.heads, self.attention_dropout = heads, attention_dropout
        self.qkv = nn.Linear(dim, 3 * dim)  # q, k, v stacked: one matmul, the same parameters
        self.out = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(hidden_dropout)
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=_additive_mask(keep, q.dtype),
                                           dropout_p=self.attention_dropout if self.training else 0.0)
        return self.norm(x + self.dropout(self.out(a.transpose(1, 2).reshape(B, T, D))))


class TaskTop(nn.Module):
    """One task's Top Proj. Attn.: V_E, K attention layers in d_s, V_D."""

    def __init__(self, hidden: int, cfg: Config, hidden_dropout: float, eps: float):
        super().__init__()
        self.encoder = nn.Linear(hidden, cfg.hidden_size_aug)  # V_E
        self.layers = nn.ModuleList(TopLayer(cfg.hidden_size_aug, cfg.top_heads, cfg.attention_dropout,
                                             hidden_dropout, eps) for _ in range(cfg.top_layers))
        self.decoder = nn.Linear(cfg.hidden_size_aug, hidden)  # V_D
        _init(self, cfg.init_std)

    def forward(self, h: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        x = self.encoder(h)
        for layer in self.layers:
            x = layer(x, keep)
        return self.decoder(x)


class LowRank(nn.Module):
    """V_D GELU(V_E h) for one task and layer."""

    def __init__(self, hidden: int, rank: int):
        super().__init__()
        self.encoder, self.decoder = nn.Linear(hidden, rank), nn.Linear(rank, hidden)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(F.gelu(self.encoder(h)))


def top_params_per_task(hidden: int, aug: int, layers: int) -> int:
    """V_E + V_D + layers x (q, k, v, W_O with biases, a LayerNorm): 1,320,444 for BERT-base at d_s=204, 6 layers."""
    return (hidden * aug + aug) + (aug * hidden + hidden) + layers * (4 * (aug * aug + aug) + 2 * aug)


def low_rank_params_per_task(hidden: int, rank: int, num_layers: int) -> int:
    """num_layers x (V_E + V_D, with biases): 1,853,616 for BERT-base at r=100."""
    return num_layers * ((hidden * rank + rank) + (rank * hidden + hidden))


class TopPALModel(EncoderClassifier):
    """Shared backbone; per task: Top Proj. Attn. over its last hidden state, then the shared pooler and a head."""

    def __init__(self, backbone: nn.Module, tasks, cfg: Config):
        super().__init__(backbone, tasks, pooling=cfg.pooling)
        c = backbone.config
        self.top = nn.ModuleDict({t.name: TaskTop(c.hidden_size, cfg, getattr(c, "hidden_dropout_prob", 0.1),
                                                  getattr(c, "layer_norm_eps", 1e-12)) for t in tasks})

    def new_parameters(self) -> list[nn.Parameter]:
        return [*self.top.parameters(), *super().new_parameters()]

    def encode(self, task: str, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        out = self.backbone(**adapter.inputs(self.backbone, input_ids, attention_mask, token_type_ids))
        keep = None if attention_mask is None else attention_mask[:, None, None, :].bool()
        h = self.top[task](out.last_hidden_state, keep)
        if self.pooling == "pooler":
            return adapter.pooler_over(self.backbone, h)
        return pool(h, attention_mask, self.pooling)


class LowRankModel(LayerTerms):
    """Per task: a low-rank transform of each layer's input, added in its output LayerNorm (where PALs add theirs)."""

    kind = "low-rank terms"

    def __init__(self, backbone: nn.Module, tasks, cfg: Config):
        super().__init__(backbone, tasks, cfg.pooling)
        hidden, depth = backbone.config.hidden_size, adapter.depth(backbone)
        self.low_rank = nn.ModuleDict({t.name: nn.ModuleList(LowRank(hidden, cfg.low_rank_size) for _ in range(depth))
                                       for t in tasks})
        _init(self.low_rank, cfg.init_std)

    @property
    def terms(self) -> nn.ModuleDict:
        return self.low_rank

    def term(self, i: int, h: torch.Tensor) -> torch.Tensor:
        return self.low_rank[self._task][i](h)


MODELS = MappingProxyType({Variant.top_pal: TopPALModel, Variant.low_rank: LowRankModel})


def build(backbone, cfg: Config, tasks):
    """method.variant=top_pal or low_rank (model.build hands these here)."""
    if problem := variant_problem(cfg):
        raise ValueError(problem)  # a run never gets here: config.check ran in the pre-flight
    model = MODELS[Variant(str(cfg.variant))](backbone, tasks, cfg)
    for p in model.backbone.parameters():
        p.requires_grad_(not cfg.freeze_backbone)
    return model
