"""PALs: projected attention layers for multi-task learning (docs/methods.md, section PALs; Stickland & Murray 2019).

For task t and layer l with input h, the layer's output LayerNorm gets one more summand:

    H_l = LN2(a + Dropout(W_2 GELU(W_1 a)) + TS(h)),   TS(h) = GELU(V_D_t(MHA_{t,l}(V_E_t h)))

V_E_t / V_D_t are shared by all layers of task t; MHA_{t,l} (q/k/v in the d_s space, no output
projection) is separate per layer and task. The Hugging Face backbone is left as it is: two
forward pre-hooks per layer do the work, so its parameter names, save_pretrained and
from_pretrained stay untouched:
  - on encoder.layer[l]: compute TS(h) from the layer input h for the active task;
  - on encoder.layer[l].output (BertOutput / RobertaOutput, forward(hidden, input_tensor) =
    LN(dropout(dense(hidden)) + input_tensor)): replace input_tensor by input_tensor + TS(h).
The active task and the padding mask are set by PALsModel.encode (called by forward) for the
duration of one call: state of this model instance, nothing global. Outside such a call the
backbone runs as plain BERT.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from deepen_run.errors import UserError
from deepen_run.methods.pals.config import Config, check, size_problem  # noqa: F401 (the method's contract)
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


def encoder_layers(backbone: nn.Module) -> nn.ModuleList:
    """The BERT/RoBERTa-style layers whose `output` submodule adds a residual inside its LayerNorm."""
    layers = getattr(getattr(backbone, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList) or not all(
            isinstance(getattr(layer, "output", None), nn.Module) and hasattr(layer.output, "LayerNorm")
            for layer in layers):
        raise UserError(f"method=pals needs a BERT/RoBERTa-style encoder (encoder.layer[i].output.LayerNorm); "
                        f"{type(backbone).__name__} has none: use backbone=bert_base, roberta_base, minilm or tiny")
    return layers


class PALsModel(EncoderClassifier):
    """Shared backbone and pooler; per task: PALs in every layer and a head."""

    def __init__(self, backbone: nn.Module, tasks, cfg: Config):
        layers = encoder_layers(backbone)
        if problem := size_problem(cfg.hidden_size_aug, cfg.num_heads):
            raise ValueError(problem)  # a run never gets here: config.check ran in the pre-flight
        if getattr(backbone.config, "chunk_size_feed_forward", 0):
            # The hook adds TS(h) for the whole sequence; a chunked feed-forward would see slices.
            raise UserError("method=pals needs the backbone's chunk_size_feed_forward=0")
        super().__init__(backbone, tasks, pooling=cfg.pooling)
        self.pals = nn.ModuleDict({t.name: TaskPALs(backbone.config.hidden_size, cfg, len(layers)) for t in tasks})
        # Set by encode() for one call: the routed task, the key-padding mask, TS(h) per layer.
        self._task: str | None = None
        self._keep: torch.Tensor | None = None
        self._pending: dict[int, torch.Tensor] = {}
        # Hooks are partials of bound methods (not closures) so that copy.deepcopy(model) gives a
        # copy whose backbone hooks route through the copy's PALs, not the original's.
        for i, layer in enumerate(layers):
            layer.register_forward_pre_hook(partial(self._before_layer, i), with_kwargs=True)
            layer.output.register_forward_pre_hook(partial(self._before_output, i), with_kwargs=True)

    def _before_layer(self, i: int, layer, args, kwargs):
        if getattr(layer, "gradient_checkpointing", False) and layer.training:
            # Its recomputation in backward would run after encode() has cleared the routed task.
            raise RuntimeError("method=pals does not support gradient checkpointing")
        if self._task is not None:
            h = args[0] if args else kwargs["hidden_states"]
            self._pending[i] = self.pals[self._task](i, h, self._keep)

    def _before_output(self, i: int, _module, args, kwargs):
        ts = self._pending.pop(i, None)
        if ts is None:
            return None
        if len(args) >= 2:  # forward(hidden_states, input_tensor), as BertLayer calls it
            return (args[0], args[1] + ts, *args[2:]), kwargs
        return args, {**kwargs, "input_tensor": kwargs["input_tensor"] + ts}

    def new_parameters(self) -> list[nn.Parameter]:
        """Every task's PALs (they hook into the backbone but live here) and the heads."""
        return [*self.pals.parameters(), *super().new_parameters()]

    def encode(self, task: str, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        if task not in self.pals:
            raise KeyError(f"task {task!r} has no PALs; this model has {', '.join(self.pals)}")
        keep = None if attention_mask is None else attention_mask[:, None, None, :].bool()
        self._task, self._keep = task, keep
        try:
            pooled = super().encode(task, input_ids, attention_mask, token_type_ids)
            if self._pending:
                # A layer computed TS(h) but never called its `output` submodule: the wrapped
                # transformers version changed how a layer calls its sublayers.
                raise RuntimeError(f"PALs of layers {sorted(self._pending)} were never added: "
                                   f"{type(self.backbone).__name__} layers no longer call layer.output")
            return pooled
        finally:
            self._task, self._keep = None, None
            self._pending.clear()


def build(backbone, cfg: Config, tasks):
    if str(cfg.variant) != "pals":  # the paper's other rows (top_pal, low_rank): variants.py
        from deepen_run.methods.pals.variants import build as build_variant
        return build_variant(backbone, cfg, tasks)
    model = PALsModel(backbone, tasks, cfg)
    for p in model.backbone.parameters():
        p.requires_grad_(not cfg.freeze_backbone)
    return model
