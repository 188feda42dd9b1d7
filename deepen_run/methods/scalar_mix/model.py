"""ELMo's scalar mix (Peters et al. 2018, arXiv 1802.05365, eq. 1): per task t, a fixed learned mix

    M_t = gamma_t * sum_j softmax(s_t)_j H_j

of the backbone's hidden states H_j (j in 1..L, or 0..L with method.include_embeddings), pooled and fed to
task t's head. The static counterpart of HIRE's per-example importances (docs/methods.md, section Scalar
mix): the weights depend on the task alone, not on the input. s_t starts at 0 (the uniform mix), gamma_t
at 1. The backbone fine-tunes end to end, as with HIRE.
"""
from __future__ import annotations

import torch
from torch import nn

from deepen_run.methods.contract import Output
from deepen_run.methods.scalar_mix.config import Config, check  # noqa: F401 (the method's contract)
from deepen_run.model import adapter
from deepen_run.model import layers as surgery
from deepen_run.model.heads import TaskHeads, pool


class ScalarMix(nn.Module):
    """softmax-normalised weights over J hidden states, times a learned scale gamma."""

    def __init__(self, num_states: int):
        super().__init__()
        self.scalars = nn.Parameter(torch.zeros(num_states))
        self.gamma = nn.Parameter(torch.ones(()))

    def weights(self) -> torch.Tensor:
        return self.scalars.float().softmax(-1)  # in fp32 under autocast too: the reported weights sum to 1

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """states (J, B, T, d) -> (B, T, d)."""
        return self.gamma * torch.einsum("j,jbtd->btd", self.weights().to(states.dtype), states)


class ScalarMixClassifier(nn.Module):
    def __init__(self, backbone: nn.Module, cfg: Config, tasks):
        super().__init__()
        conf = backbone.config
        self.backbone, self.cfg = backbone, cfg
        self.state_ids = list(range(0 if cfg.include_embeddings else 1, conf.num_hidden_layers + 1))
        # Labels in the original numbering (a copy of layer 3 is 3'), as HIRE's figures label them.
        self.labels = surgery.hidden_state_labels(surgery.sources(backbone))
        self.mix = nn.ModuleDict({t.name: ScalarMix(len(self.state_ids)) for t in tasks})
        dropout = cfg.dropout if cfg.dropout is not None else getattr(conf, "hidden_dropout_prob", 0.1)
        self.heads = TaskHeads(tasks, conf.hidden_size, dropout)

    @property
    def layer_labels(self) -> list[str]:
        return [self.labels[j] for j in self.state_ids]

    @property
    def layer_names(self) -> list[str]:
        return [surgery.metric_label(label) for label in self.layer_labels]

    def forward(self, task, input_ids, attention_mask, token_type_ids=None) -> Output:
        out = self.backbone(**adapter.inputs(self.backbone, input_ids, attention_mask, token_type_ids),
                            output_hidden_states=True)
        hs = adapter.hidden_states(self.backbone, out)  # one footing (ModernBERT: its final norm on each)
        mixed = self.mix[task](torch.stack([hs[j] for j in self.state_ids]))
        return Output(self.heads[task](pool(mixed, attention_mask, str(self.cfg.pool))))

    def new_parameters(self) -> list[nn.Parameter]:
        return [*self.mix.parameters(), *self.heads.parameters()]


def build(backbone, cfg: Config, tasks) -> ScalarMixClassifier:
    model = ScalarMixClassifier(backbone, cfg, tasks)
    for p in model.parameters():
        p.requires_grad_(True)  # end-to-end fine-tuning, as HIRE (the comparison it is for)
    return model


def after_train(model: ScalarMixClassifier, ctx) -> None:
    from deepen_run.methods.scalar_mix.report import record

    record(model, ctx)
