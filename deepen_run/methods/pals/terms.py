"""What PALs and the low-rank variant share: per task, a term added to each backbone layer's residual,
computed from the layer's input. The backbone adapter (deepen_run/model/adapter.py, hook_residual_term)
says where a family takes it; this class routes the active task through those hooks for one forward
(docs/methods.md, section PALs)."""
from __future__ import annotations

import torch
from torch import nn

from deepen_run.errors import UserError
from deepen_run.model import adapter
from deepen_run.model.heads import EncoderClassifier


class LayerTerms(EncoderClassifier):
    """Shared backbone and pooler; per task, a term added to each layer's residual where the adapter
    hooks (hook_residual_term). encode() routes one task for one call. A subclass builds its per-task
    modules in `terms` (under its own attribute name) and says with term(i, h) what layer call i adds."""

    kind = "terms"  # what the subclass's modules are called in errors

    def __init__(self, backbone: nn.Module, tasks, pooling: str):
        if getattr(backbone.config, "chunk_size_feed_forward", 0):
            # The hook adds the term for the whole sequence; a chunked feed-forward would see slices.
            raise UserError("method=pals needs the backbone's chunk_size_feed_forward=0")
        super().__init__(backbone, tasks, pooling=pooling)
        # Set by encode() for one call: the routed task, the key-padding mask, the layer calls so far,
        # the term per layer call.
        self._task: str | None = None
        self._keep: torch.Tensor | None = None
        self._calls = 0
        self._pending: dict[int, torch.Tensor] = {}
        # Bound methods (not closures), so that copy.deepcopy(model) gives a copy whose backbone
        # hooks route through the copy's modules, not the original's.
        adapter.hook_residual_term(backbone, self._before_layer, self._take)

    @property
    def terms(self) -> nn.ModuleDict:
        raise NotImplementedError

    def term(self, i: int, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _before_layer(self, layer, h):
        if getattr(layer, "gradient_checkpointing", False) and layer.training:
            # Its recomputation in backward would run after encode() has cleared the routed task.
            raise RuntimeError("method=pals does not support gradient checkpointing")
        i, self._calls = self._calls, self._calls + 1
        if self._task is not None:
            self._pending[i] = self.term(i, h)

    def _take(self):
        return self._pending.pop(self._calls - 1, None)

    def new_parameters(self) -> list[nn.Parameter]:
        """Every task's modules (they hook into the backbone but live here) and the heads."""
        return [*self.terms.parameters(), *super().new_parameters()]

    def encode(self, task: str, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        if task not in self.terms:
            raise KeyError(f"task {task!r} has no {self.kind}; this model has {', '.join(self.terms)}")
        keep = None if attention_mask is None else attention_mask[:, None, None, :].bool()
        self._task, self._keep, self._calls = task, keep, 0
        try:
            pooled = super().encode(task, input_ids, attention_mask, token_type_ids)
            if self._pending:
                # A layer computed its term but never called the submodule that adds it: the wrapped
                # transformers version changed how a layer calls its sublayers.
                raise RuntimeError(f"{self.kind} of layers {sorted(self._pending)} were never added: "
                                   f"{type(self.backbone).__name__} layers no longer call the submodule "
                                   "the backbone adapter hooks")
            return pooled
        finally:
            self._task, self._keep, self._calls = None, None, 0
            self._pending.clear()
