"""DenseFormer's depth-weighted average as a step on the backbone (Pagliardini et al. 2024, arXiv
2402.02622; docs/methods.md, section Depth-weighted average).

`backbone.dwa=true`: after layer i (0-based, of the possibly deepened stack) the next layer reads

    Y_i = sum_{j=0..i+1} a_{i,j} X_j,   X_0 = the first layer's input (embeddings), X_{j+1} = layer j's output

instead of X_{i+1}. The weights a_i start as the identity (a_{i,i+1} = 1, the rest 0), so the model is the
pretrained function at step 0, exactly; they are new parameters (train.new_params_lr_scale). DenseFormer
trained them from scratch in decoder pre-training; retrofitting them onto a pretrained encoder at
fine-tuning time is ours. Layer i is the i-th layer call of a forward, so ALBERT's shared layer gets
weights per depth. The backbone adapter finds the layers; the weights live in a module `dwa` on the
base model and the mixing is done by hooks, so the Hugging Face classes are untouched.

record() logs nothing before training (the weights are the identity then); after_train() logs
`dwa/weights.png` (layer x earlier layer) and `dwa/weights.csv`.
"""
from __future__ import annotations

from functools import partial

import torch
from torch import nn

from deepen_run.model import adapter

NAME = "dwa"  # the module on the base model: its parameters are dwa.weights.<i>


class DepthWeights(nn.Module):
    """a_i (i + 2 weights) per layer call, and the states X_0..X_{i+1} of the forward in flight."""

    def __init__(self, depth: int):
        super().__init__()
        # Each its own storage (a row of eye() is a view of the whole matrix, which safetensors refuses
        # to load into: a checkpointed run could not resume).
        self.weights = nn.ParameterList(nn.Parameter(torch.eye(i + 2)[-1].clone()) for i in range(depth))
        self._states: list[torch.Tensor] = []

    def start(self, *_):
        self._states = []

    def before_layer(self, _layer, args, kwargs):
        if not self._states:
            self._states.append(adapter.layer_input(args, kwargs))

    def after_layer(self, _layer, _args, _kwargs, output):
        out = output[0] if isinstance(output, tuple) else output
        self._states.append(out)
        i = len(self._states) - 2
        if i >= len(self.weights):
            raise RuntimeError(f"backbone.dwa: layer call {i + 1} of a forward, but weights for {len(self.weights)} "
                               "layers: the wrapped transformers version changed how its layers are called")
        w = self.weights[i].to(out.dtype)
        mixed = torch.einsum("j,j...->...", w, torch.stack(self._states))
        if i == len(self.weights) - 1:
            self._states = []  # the forward's last layer: free the states
        return (mixed, *output[1:]) if isinstance(output, tuple) else mixed


def check(cfg) -> None:
    """Nothing to check before the weights load: every family of the adapter's table takes it."""


def apply(backbone, cfg) -> tuple[list, list[nn.Parameter]]:
    """-> ([], the new weights). Draws no random numbers (the identity is exact)."""
    if not cfg.backbone.get("dwa", False):
        return [], []
    base = getattr(backbone, "base_model", backbone)
    dwa = DepthWeights(adapter.depth(backbone)).to(next(backbone.parameters()).device)
    base.add_module(NAME, dwa)
    base.register_forward_pre_hook(dwa.start)
    # Appended after a gated copy's own hook (deepen_run/model/duplication.py), so a copy is gated
    # first and then mixed; a shared layer (ALBERT) is hooked once and counts its calls.
    for layer in {id(m): m for m in adapter.layers(backbone)}.values():
        layer.register_forward_pre_hook(partial(DepthWeights.before_layer, dwa), with_kwargs=True)
        layer.register_forward_hook(partial(DepthWeights.after_layer, dwa), with_kwargs=True)
    return [], list(dwa.parameters())


def weights_of(backbone) -> DepthWeights | None:
    return getattr(getattr(backbone, "base_model", backbone), NAME, None)


def record(backbone, ctx) -> None:
    """Nothing: before training the weights are the identity."""


def after_train(backbone, ctx) -> None:
    dwa = weights_of(backbone)
    if dwa is None or not ctx.accelerator.is_main_process:
        return
    from deepen_run.model.dwa_report import record_weights

    record_weights(dwa, backbone, ctx)
