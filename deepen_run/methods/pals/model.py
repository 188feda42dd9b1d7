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
The active task and the padding mask are set by PALsModel.encode (called by forward) for the
duration of one call: state of this model instance, nothing global. Outside such a call the
backbone runs as it is.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from deepen_run.errors import UserError
from deepen_run.methods.pals.config import Config, check, size_problem  # noqa: F401 (the method's contract)
from deepen_run.model import adapter
from deepen_run.model.heads import EncoderClassifier


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


class PALsModel(EncoderClassifier):
    """Shared backbone and pooler; per task: PALs in every layer and a head."""

    def __init__(self, backbone: nn.Module, tasks, cfg: Config):
        if problem := size_problem(cfg.hidden_size_aug, cfg.num_heads):
            raise ValueError(problem)  # a run never gets here: config.check ran in the pre-flight
        if getattr(backbone.config, "chunk_size_feed_forward", 0):
            # The hook adds TS(h) for the whole sequence; a chunked feed-forward would see slices.
            raise UserError("method=pals needs the backbone's chunk_size_feed_forward=0")
        super().__init__(backbone, tasks, pooling=cfg.pooling)
        depth = adapter.depth(backbone)
        self.pals = nn.ModuleDict({t.name: TaskPALs(backbone.config.hidden_size, cfg, depth) for t in tasks})
        # Set by encode() for one call: the routed task, the key-padding mask, the layer calls so far,
        # TS(h) per layer call.
        self._task: str | None = None
        self._keep: torch.Tensor | None = None
        self._calls = 0
        self._pending: dict[int, torch.Tensor] = {}
        # Bound methods (not closures), so that copy.deepcopy(model) gives a copy whose backbone
        # hooks route through the copy's PALs, not the original's.
        adapter.hook_residual_term(backbone, self._before_layer, self._take)

    def _before_layer(self, layer, h):
        if getattr(layer, "gradient_checkpointing", False) and layer.training:
            # Its recomputation in backward would run after encode() has cleared the routed task.
            raise RuntimeError("method=pals does not support gradient checkpointing")
        i, self._calls = self._calls, self._calls + 1
        if self._task is not None:
            self._pending[i] = self.pals[self._task](i, h, self._keep)

    def _take(self):
        return self._pending.pop(self._calls - 1, None)

    def new_parameters(self) -> list[nn.Parameter]:
        """Every task's PALs (they hook into the backbone but live here) and the heads."""
        return [*self.pals.parameters(), *super().new_parameters()]

    def encode(self, task: str, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        if task not in self.pals:
            raise KeyError(f"task {task!r} has no PALs; this model has {', '.join(self.pals)}")
        keep = None if attention_mask is None else attention_mask[:, None, None, :].bool()
        self._task, self._keep, self._calls = task, keep, 0
        try:
            pooled = super().encode(task, input_ids, attention_mask, token_type_ids)
            if self._pending:
                # A layer computed TS(h) but never called its `output` submodule: the wrapped
                # transformers version changed how a layer calls its sublayers.
                raise RuntimeError(f"PALs of layers {sorted(self._pending)} were never added: "
                                   f"{type(self.backbone).__name__} layers no longer call the submodule "
                                   "the backbone adapter hooks")
            return pooled
        finally:
            self._task, self._keep, self._calls = None, None, 0
            self._pending.clear()


def build(backbone, cfg: Config, tasks):
    if str(cfg.variant) != "pals":  # the paper's other rows (top_pal, low_rank): variants.py
        from deepen_run.methods.pals.variants import build as build_variant
        return build_variant(backbone, cfg, tasks)
    model = PALsModel(backbone, tasks, cfg)
    for p in model.backbone.parameters():
        p.requires_grad_(not cfg.freeze_backbone)
    return model
