"""PALs: projected attention layers for multi-task learning (docs/methods.md, section PALs; Stickland & Murray 2019).

For task t and layer l with input h, the layer's output LayerNorm gets one more summand:

    H_l = LN2(a + Dropout(W_2 GELU(W_1 a)) + TS(h)),   TS(h) = GELU(V_D_t(MHA_{t,l}(V_E_t h)))

V_E_t / V_D_t are shared by all layers of task t; MHA_{t,l} (q/k/v in the d_s space, no output
projection) is separate per layer and task. The Hugging Face backbone is left as it is: hooks that the
backbone adapter places (deepen_run/model/adapter.py, hook_residual_term) do the work, so its parameter
names, save_pretrained and from_pretrained stay untouched:
  - before each layer call: compute TS(h) from the layer input h for the active task;
  - post-LN families: add it inside the layer's output LayerNorm, as above (BERT: BertOutput's
    input_tensor); pre-LN families (ModernBERT): add it to the layer's output, a parallel residual term
    H_l = x + attn + mlp + TS(x) (ours: the paper's backbone has no pre-LN block; docs/methods.md).
Layer l is the l-th layer call of a forward, so a shared layer (ALBERT) gets a PAL per depth.
The active task and the padding mask are set by encode (terms.py, LayerTerms; called by forward) for the
duration of one call: state of this model instance, nothing global. Outside such a call the
backbone runs as it is.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from deepen_run.methods.pals.config import Config, check, size_problem  # noqa: F401 (the method's contract)
from deepen_run.model import adapter
from deepen_run.methods.pals.terms import LayerTerms


class ProjectedAttention(nn.Module):
    """Multi-head self-attention inside the d_s space; no output projection (as the authors' code).

    q, k and v are three Linear(d_s, d_s) with biases, stored stacked in one Linear(d_s, 3 d_s):
    the same parameters, initialisation and function, in one matmul instead of three.
    """

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """x: (B, T, D); keep: (B, 1, 1, T) bool, True for real tokens, or None (no padding)."""
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        bias = None
        if keep is not None:
            # Additive, in the query's dtype (autocast may have lowered it): a large negative rather
            # than -inf, so even an all-padding row stays finite.
            bias = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill_(~keep, torch.finfo(q.dtype).min)
        # SDPA picks a fused kernel where the device has one.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=self.dropout if self.training else 0.0)
        return out.transpose(1, 2).reshape(B, T, D)


class TaskPALs(nn.Module):
    """One task's PALs: the encoder/decoder pair shared by all layers, one attention per layer."""

    def __init__(self, hidden: int, cfg: Config, num_layers: int):
        super().__init__()
        self.encoder = nn.Linear(hidden, cfg.hidden_size_aug)  # V_E
        self.decoder = nn.Linear(cfg.hidden_size_aug, hidden)  # V_D
        self.attention = nn.ModuleList(ProjectedAttention(cfg.hidden_size_aug, cfg.num_heads, cfg.attention_dropout)
                                       for _ in range(num_layers))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=cfg.init_std)
                nn.init.zeros_(m.bias)

    def forward(self, layer: int, h: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        return F.gelu(self.decoder(self.attention[layer](self.encoder(h), keep)))


def pal_params_per_task(hidden: int, aug: int, num_layers: int) -> int:
    """V_E + V_D + num_layers x (q, k, v), all with biases: 1,819,836 for BERT-base at d_s=204."""
    return (hidden * aug + aug) + (aug * hidden + hidden) + num_layers * 3 * (aug * aug + aug)


class PALsModel(LayerTerms):
    """Per task: PALs in every layer and a head."""

    kind = "PALs"

    def __init__(self, backbone: nn.Module, tasks, cfg: Config):
        if problem := size_problem(cfg.hidden_size_aug, cfg.num_heads):
            raise ValueError(problem)  # a run never gets here: config.check ran in the pre-flight
        super().__init__(backbone, tasks, cfg.pooling)
        depth = adapter.depth(backbone)
        self.pals = nn.ModuleDict({t.name: TaskPALs(backbone.config.hidden_size, cfg, depth) for t in tasks})

    @property
    def terms(self) -> nn.ModuleDict:
        return self.pals

    def term(self, i: int, h: torch.Tensor) -> torch.Tensor:
        return self.pals[self._task](i, h, self._keep)


def build(backbone, cfg: Config, tasks):
    if str(cfg.variant) != "pals":  # the paper's other rows (top_pal, low_rank): variants.py
        from deepen_run.methods.pals.variants import build as build_variant
        return build_variant(backbone, cfg, tasks)
    model = PALsModel(backbone, tasks, cfg)
    for p in model.backbone.parameters():
        p.requires_grad_(not cfg.freeze_backbone)
    return model
