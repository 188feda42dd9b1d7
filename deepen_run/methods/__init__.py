"""The method registry: name = conf/method/<name>.yaml = deepen_run/methods/<name>.py.

Each method is two modules, so that composing and checking a config never imports torch:
  methods/<name>_config.py     light (no torch): its config dataclass `Config` (validated by Hydra,
                               with `name`) and optionally check(cfg), a cheap validation of the whole
                               config before anything loads (called by preflight.method_checks after
                               the backbone preflight); raises UserError
  methods/<name>.py            the model; re-exports Config (and check) and provides
    build(backbone, cfg, tasks)  -> nn.Module with forward(task, input_ids, attention_mask,
                                 token_type_ids) -> logits and a `heads` ModuleDict; it sets
                                 requires_grad for what trains
  and optionally
    after_build(model, ctx)      before training (ctx: deepen_run.context.RunContext)
    after_train(model, ctx)      after the final evaluation (figures, tables)

NAMES is the explicit registry. METHODS maps each name to its model module, imported on first
access (METHODS["hire"] imports deepen_run.methods.hire, and torch with it); config_of(name) gives
the light module. Adding a method: its two modules, conf/method/<name>.yaml, and a name here.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType

NAMES = ("baseline", "duplicate", "hire", "pals")


def config_of(name: str) -> ModuleType:
    """The light module: Config and (optionally) check(cfg)."""
    return importlib.import_module(f"{__name__}.{name}_config")


class _Registry(Mapping):
    """name -> model module, imported when first looked up (a plain dict would import them all)."""

    def __getitem__(self, name: str) -> ModuleType:
        if name not in NAMES:
            raise KeyError(name)
        return importlib.import_module(f"{__name__}.{name}")

    def __iter__(self):
        return iter(NAMES)

    def __len__(self) -> int:
        return len(NAMES)


METHODS: Mapping[str, ModuleType] = _Registry()
