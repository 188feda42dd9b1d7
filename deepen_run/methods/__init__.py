"""The method registry: name = conf/method/<name>.yaml = deepen_run/methods/<name>.py.

Each method is two modules, so that composing and checking a config never imports torch; what
each must provide is written down as Protocols in methods/contract.py:
  methods/<name>_config.py     light (no torch): its config dataclass `Config` (validated by Hydra,
                               with `name`; the only place its defaults live) and optionally
                               check(cfg), every check of its options, run by the pre-flight
                               (preflight.method_checks) before any weights load; raises UserError
  methods/<name>.py            the model: re-exports Config and provides
    build(backbone, cfg, tasks)  -> a contract.MethodModel: `backbone`, `heads` (ModuleDict) and
                                 forward(task, input_ids, attention_mask, token_type_ids) -> logits;
                                 it sets requires_grad for what trains
  and optionally the hooks (contract.OPTIONAL_HOOKS, fetched with hook(module, name))
    after_build(model, ctx)      before training (ctx: deepen_run.context.RunContext)
    after_train(model, ctx)      after the final evaluation (figures, tables)

NAMES is the explicit registry. METHODS maps each name to its model module, imported on first
access (METHODS["hire"] imports deepen_run.methods.hire, and torch with it); config_of(name) gives
the light module. Adding a method: its two modules, conf/method/<name>.yaml (a defaults line
selecting its schema), and a name here; tests/test_methods_contract.py then checks it.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType

from deepen_run.methods.contract import hook  # noqa: F401 (optional hooks: hook(module, "after_train"))

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
