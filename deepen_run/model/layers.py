"""Surgery on an encoder's layer stack: find it, duplicate layers in it, or run it reordered.

Works on every family the backbone adapter knows (deepen_run/model/adapter.py finds the stack).
Shared by the duplication step (deepen_run/model/duplication.py,
`backbone.duplicate_layers`, method=duplicate) and the redundancy probe.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Iterator, Sequence

from torch import nn

from deepen_run.errors import UserError
from deepen_run.model import adapter


def encoder_layers(backbone: nn.Module) -> nn.ModuleList:
    """The layer stack, for surgery: a family whose layers share weights (ALBERT) has none to cut."""
    adapter.refuse_shared(backbone.config.model_type, "layer surgery")
    return adapter.layers(backbone)


def check_indices(indices: Sequence[int], depth: int, what: str = "method.layers") -> None:
    bad = [i for i in indices if not 0 <= i < depth]
    if bad:
        raise UserError(f"{what}={list(indices)}: {bad} out of range; this backbone has {depth} layers, "
                        f"valid indices are 0..{depth - 1}")


def _renumber(layers: nn.ModuleList, config) -> None:
    """Keep the per-layer bookkeeping transformers relies on consistent with the new order:
    `layer_idx` (attention modules use it to address their slot in a KV cache) and the config's
    layer count, which from_pretrained uses to rebuild the stack before loading weights."""
    for pos, layer in enumerate(layers):
        for m in layer.modules():
            if hasattr(m, "layer_idx"):
                m.layer_idx = pos
    config.num_hidden_layers = len(layers)


def copy_layer(backbone: nn.Module, layer: nn.Module) -> nn.Module:
    """A copy of one of backbone's layers: deepcopy, not a second reference, so it trains independently
    of its source; the model's config stays shared (memo), so a later switch of it (the attention
    kernel) reaches the copy too."""
    return copy.deepcopy(layer, {id(backbone.config): backbone.config})


def duplicate(backbone: nn.Module, indices: Sequence[int], what: str = "method.layers") -> list[int]:
    """Insert an independent deep copy of layer i right after layer i, for each i in `indices`
    (an index listed twice gets two copies). No weights change, nothing is trained.

    Returns, for each position of the new stack, the original index it came from; the backbone's
    config keeps that list as `layer_sources` beside num_hidden_layers and layer_types, which
    describe the same stack (see sources()), so methods can name the copies and a saved deepened
    model still says which layers are copies.
    """
    adapter.refuse_shared(backbone.config.model_type, what)
    layers = encoder_layers(backbone)
    depth = len(layers)
    check_indices(indices, depth, what)
    # Duplicating twice composes: positions refer to the current stack, sources to the original.
    before = sources(backbone)
    copies = {i: list(indices).count(i) for i in set(indices)}
    order = [i for i in range(depth) for _ in range(1 + copies.get(i, 0))]
    new = []
    for i in range(depth):
        new.append(layers[i])
        new.extend(copy_layer(backbone, layers[i]) for _ in range(copies.get(i, 0)))
    adapter.set_layers(backbone, nn.ModuleList(new))
    config = backbone.config
    if isinstance(getattr(config, "layer_types", None), list) and len(config.layer_types) == depth:
        config.layer_types = [config.layer_types[s] for s in order]
    _renumber(encoder_layers(backbone), config)
    config.layer_sources = [before[s] for s in order]
    return list(config.layer_sources)


def sources(backbone: nn.Module) -> list[int]:
    """For each position of the layer stack, the original (0-based) layer it is, or is a copy of."""
    config = backbone.config
    found = config.to_dict().get("layer_sources")  # a key of the config, absent until a duplication
    return list(found) if found is not None else list(range(config.num_hidden_layers))


def original_positions(sources: Sequence[int]) -> list[int]:
    """Positions of the original layers in a deepened stack (the first of each run of one source):
    running only these reproduces the pretrained model exactly."""
    return [p for p, s in enumerate(sources) if p == 0 or sources[p - 1] != s]


def hidden_state_labels(sources: Sequence[int]) -> list[str]:
    """Labels of hidden_states[0..L'] in the original numbering: "0" the embeddings, "j" the output of
    original layer j (1-based), "j'" its first copy, "j''" the second."""
    labels, seen = ["0"], {}
    for s in sources:
        labels.append(f"{s + 1}" + "'" * seen.get(s, 0))
        seen[s] = seen.get(s, 0) + 1
    return labels


def metric_label(label: str) -> str:
    """An MLflow-safe form of a hidden_state_labels entry (no quotes): 3 -> layer_3, 3'' -> layer_3_copy2."""
    copies = label.count("'")
    return f"layer_{label.rstrip(chr(39))}" + (f"_copy{copies}" if copies else "")


@contextmanager
def layer_stack(backbone: nn.Module, modules: Sequence[nn.Module]) -> Iterator[None]:
    """Run the encoder with another stack of modules (existing layers, shared, in any order),
    then put the original stack back. For measurements only: a layer listed twice is the same
    module, so training through it would tie the two uses' weights."""
    original, depth = encoder_layers(backbone), backbone.config.num_hidden_layers
    adapter.set_layers(backbone, nn.ModuleList(modules))
    backbone.config.num_hidden_layers = len(modules)
    try:
        yield
    finally:
        adapter.set_layers(backbone, original)
        backbone.config.num_hidden_layers = depth


def layer_order(backbone: nn.Module, order: Sequence[int]):
    """The stack's own layers in another order: skip one (removal) or repeat one (duplication)."""
    layers = encoder_layers(backbone)
    return layer_stack(backbone, [layers[j] for j in order])
