"""HIRE: HIdden Representation Extractor + fusion network (Yang & Zhao, arXiv 1911.01940).

The backbone's intermediate layers H_j (j in 1..L-1, optionally 0 = embeddings) are each read by
one shared 2-layer BiGRU; its pooled summary s_j gives a score w^T s_j, and a softmax over the
layers gives per-example importances alpha. A = sum_j alpha_j H_j is fused with R = H_L as
M = [R; A; R+A; R*A] by a k-layer BiGRU whose pooled output feeds the task's head.

Padding never changes the result: each GRU's backward direction starts at the sequence's last
real token, as with packed sequences (see BiGRU for why we do not pack). The spec with what is the
paper's and what is ours: docs/methods.md, section HIRE.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from deepen_run.model import adapter
from deepen_run.model import layers as surgery
from deepen_run.errors import UserError
from deepen_run.methods.hire.config import Config, check, check_method  # noqa: F401 (the method's contract)
from deepen_run.methods.contract import Output
from deepen_run.model.heads import TaskHeads, pool


def reverse_within(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each sequence's first `lengths` positions, leaving its padding in place (an involution)."""
    t = torch.arange(x.shape[1], device=x.device)
    idx = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)
    return x.gather(1, idx.unsqueeze(-1).expand_as(x))


class BiGRU(nn.Module):
    """A stacked bidirectional GRU over right-padded batches, d/2 per direction (output width d).

    Padding-exact: the forward direction never reads past a real token, and the backward direction
    reads each sequence reversed within its length, so it starts at the last real token, as a packed
    sequence would. We do not use PackedSequence: on CPU its backward zero-fills a full-size
    gradient for every time step (aten::fill_ was ~half of a profiled HIRE step), and an
    extractor-sized packed nn.GRU (160 x 64 x 384, forward + backward) measured 1.6x slower than
    this. Each layer is two library nn.GRU calls over the whole batch.
    """

    def __init__(self, in_dim: int, d: int, layers: int):
        super().__init__()
        h = d // 2
        self.layers = nn.ModuleList(
            nn.ModuleDict({"fwd": nn.GRU(in_dim if k == 0 else 2 * h, h, batch_first=True),
                           "bwd": nn.GRU(in_dim if k == 0 else 2 * h, h, batch_first=True)})
            for k in range(layers))

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (N, T, in), lengths (N,), mask (N, T) -> outputs (N, T, d), zero at padded positions."""
        keep = mask.unsqueeze(-1).to(x.dtype)
        for layer in self.layers:
            fwd = layer["fwd"](x)[0]
            bwd = reverse_within(layer["bwd"](reverse_within(x, lengths))[0], lengths)
            x = torch.cat([fwd, bwd], dim=-1) * keep
        return x


class Extractor(nn.Module):
    """Layers (J, B, T, d) -> importances (B, J): one batched BiGRU call over all J layers."""

    def __init__(self, d: int, summary: str):
        super().__init__()
        self.summary = summary
        self.gru = BiGRU(d, d, 2)
        self.score = nn.Linear(d, 1, bias=False)  # a bias is the same for every layer: softmax cancels it

    def forward(self, layers: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        J, B, T, d = layers.shape
        lengths, masks = mask.sum(1).repeat(J), mask.repeat(J, 1)
        out = self.gru(layers.reshape(J * B, T, d), lengths, masks)
        if self.summary == "mean":
            s = out.sum(1) / lengths.unsqueeze(-1).to(out.dtype)  # padded outputs are zero
        else:  # final states: forward's at the last real token, backward's at the first
            last = out.gather(1, (lengths - 1).view(-1, 1, 1).expand(-1, 1, out.shape[-1])).squeeze(1)
            s = torch.cat([last[:, : d // 2], out[:, 0, d // 2:]], dim=-1)
        # The softmax in fp32 at least, under bf16 autocast too: the importances a run reports sum to 1
        # (bf16 rounding moved their mean's sum by 2e-5); a no-op in fp32 and fp64.
        scores = self.score(s).view(J, B).t()
        return scores.to(torch.promote_types(scores.dtype, torch.float32)).softmax(dim=-1)


class Hire(nn.Module):
    """Importances, the extracted representation A, and the fusion BiGRU."""

    def __init__(self, d: int, cfg: Config, fixed: Optional[torch.Tensor]):
        super().__init__()
        # Fixed weights need no layer summaries, so those ablations skip the extractor entirely;
        # the capacity control (extractor=false) reads no intermediate layer at all.
        self.extractor = Extractor(d, cfg.summary) if fixed is None and cfg.extractor else None
        self.last_only = not cfg.extractor
        if fixed is not None:
            self.register_buffer("fixed", fixed)
        self.fuse = BiGRU(4 * d, d, cfg.gru_layers)

    def forward(self, layers, last, mask):
        if self.last_only:  # A = R; alpha = 0 says that no intermediate layer is read
            a, alpha = last, last.new_zeros(last.shape[0], layers.shape[0])
            return self.fuse(torch.cat([last, a, last + a, last * a], dim=-1), mask.sum(1), mask), alpha
        if self.extractor is not None:
            alpha = self.extractor(layers, mask)
        else:
            alpha = self.fixed.expand(last.shape[0], -1)  # fp32, as the extractor's (mixed below in layers' dtype)
        a = torch.einsum("bj,jbtd->btd", alpha.to(layers.dtype), layers)
        fused = self.fuse(torch.cat([last, a, last + a, last * a], dim=-1), mask.sum(1), mask)
        return fused, alpha


def fixed_weights(cfg: Config, J: int) -> Optional[torch.Tensor]:
    if cfg.importance == "mean":
        return torch.full((J,), 1.0 / J)
    if cfg.importance == "random":
        w = torch.rand(J, generator=torch.Generator().manual_seed(cfg.random_seed))
        return w / w.sum()
    return None


class HireClassifier(nn.Module):
    def __init__(self, backbone: nn.Module, cfg: Config, tasks):
        super().__init__()
        check_method(cfg)
        conf = backbone.config
        d, L = conf.hidden_size, conf.num_hidden_layers
        self.layer_ids = list(range(0 if cfg.include_embeddings else 1, L))  # hidden_states indices
        if not self.layer_ids:
            raise UserError(f"method=hire needs at least 2 backbone layers (this one has {L}); "
                            "use a deeper backbone or method.include_embeddings=true")
        if d % 2:
            raise UserError(f"method=hire splits hidden size {d} over two GRU directions; it must be even")
        self.backbone, self.cfg = backbone, cfg
        # hidden_states labels in the original numbering, a duplicated layer's copy as 3' (layers.duplicate).
        self.labels = surgery.hidden_state_labels(surgery.sources(backbone))
        fixed = fixed_weights(cfg, len(self.layer_ids))
        keys = ["shared"] if cfg.shared else [t.name for t in tasks]
        self.hire = nn.ModuleDict({k: Hire(d, cfg, fixed) for k in keys})
        dropout = cfg.dropout if cfg.dropout is not None else getattr(conf, "hidden_dropout_prob", 0.1)
        self.heads = TaskHeads(tasks, d, dropout)

    @property
    def layer_labels(self) -> list[str]:
        """Figure / CSV labels of the extractor's layers: "3", a copy of it "3'", a second copy "3''"."""
        return [self.labels[j] for j in self.layer_ids]

    @property
    def layer_names(self) -> list[str]:
        """MLflow-safe names (no quotes): layer_3, layer_3_copy1."""
        return [surgery.metric_label(label) for label in self.layer_labels]

    @property
    def extra_columns(self) -> dict[str, list[str]]:
        """What each value of an Output.extras entry is (deepen-predict's column names): alpha's
        values are the extractor's layers, named as its metrics are (hire/<task>/layer_3)."""
        return {"alpha": self.layer_names}

    def features(self, task, input_ids, attention_mask, token_type_ids=None):
        """-> pooled sentence vectors (B, d), importances (B, J)."""
        out = self.backbone(**adapter.inputs(self.backbone, input_ids, attention_mask, token_type_ids),
                            output_hidden_states=True)
        hs = adapter.hidden_states(self.backbone, out)  # one footing (ModernBERT: its final norm on each)
        layers = torch.stack([hs[j] for j in self.layer_ids])
        block = self.hire["shared" if self.cfg.shared else task]
        fused, alpha = block(layers, hs[-1], attention_mask)
        return pool(fused, attention_mask, self.cfg.pool), alpha

    def forward(self, task, input_ids, attention_mask, token_type_ids=None) -> Output:
        # The importances ride along as an extra: the evaluation keeps them for the report.
        pooled, alpha = self.features(task, input_ids, attention_mask, token_type_ids)
        return Output(self.heads[task](pooled), {"alpha": alpha.detach()})

    def new_parameters(self) -> list[nn.Parameter]:
        """The HIRE blocks (extractor, fusion) and the heads: everything but the backbone."""
        return [*self.hire.parameters(), *self.heads.parameters()]


def build(backbone, cfg: Config, tasks) -> HireClassifier:
    model = HireClassifier(backbone, cfg, tasks)
    for p in model.parameters():
        p.requires_grad_(True)  # end-to-end fine-tuning, as in the paper
    return model


def after_train(model: HireClassifier, ctx) -> None:
    from deepen_run.methods.hire.report import record

    if model.cfg.extractor:  # the capacity control has no importances to report
        record(model, ctx)
