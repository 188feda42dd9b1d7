"""The method registry: FOLDERS, one line per method; each is a folder deepen_run/methods/<name>/.

A method's folder holds (what each must provide is written down as Protocols in contract.py):
  config.py    light (no torch), so composing and checking a config never imports torch: its config
               dataclass `Config` (validated by Hydra, with `name`; the only place its defaults
               live), optionally check(cfg), every check of its options, run by the pre-flight
               before any weights load (raises UserError), and optionally PRESETS: name -> a Config
               subclass, config-only variants of this method selectable as method=<name>
  model.py     the model: re-exports Config and provides
    build(backbone, cfg, tasks)  -> a contract.MethodModel: `backbone`, `heads` (ModuleDict),
                                 new_parameters() (what it added: trained at new_params_lr_scale x lr,
                                 wherever it sits) and forward(task, ...) -> contract.Output;
                                 it sets requires_grad for what trains
    and optionally the hooks (contract.OPTIONAL_HOOKS, fetched with hook(module, name)):
    after_build(model, ctx)      before training (ctx: deepen_run.run.context.RunState)
    after_train(model, ctx)      after the final evaluation (figures, tables)
    model_files(model, folder)   files of its own in a model folder (LoggedModel, export) that other
                                 tools read (method=lora: PEFT's adapters); -> a paragraph for the card
  report.py    optional: what after_train records
conf/method/<name>.yaml, optional, selects the schema (a defaults line) and may say more; without it
method=<name> is the dataclass itself. Adding a method: its folder and one line in FOLDERS;
tests/test_methods_contract.py then checks it (tests/test_add_method.py adds one that way).

NAMES: every method=<name> option (methods and their presets). METHODS maps each name to its model
module, imported on first access (METHODS["hire"] imports deepen_run.methods.hire.model, and torch
with it); config_of(name) gives the light module, schema_of(name) the dataclass.

Layers: this registry, contract.py and each method's config.py are light and sit just above config/
(they use its types; the entry points hand schemas() to config/schema.py's register); a method's
other modules (model.py, report.py: "method models") sit above model/. The registry reaches the
model modules only by name (importlib).
May import: base, config
Method models may import: base, config, methods, data, model
A config module's check(cfg) may import inside the function: model (layer indices against the
backbone's depth, read from its config file; the pre-flight calls it after transformers loads)
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType, ModuleType

from deepen_run.methods.contract import Output, hook  # noqa: F401 (the contract's pieces, for callers)

FOLDERS = ("baseline", "hire", "pals", "scalar_mix", "lora")
# What the report compares every other row with.
REFERENCE = "baseline"


def _config_module(folder: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{folder}.config")


def _owners() -> dict[str, str]:
    """option name -> the folder that implements it (a preset's is the method it configures)."""
    owners = {}
    for folder in FOLDERS:
        owners[folder] = folder
        for preset in getattr(_config_module(folder), "PRESETS", {}):
            owners[preset] = folder
    return owners


_OWNER = MappingProxyType(_owners())  # read-only: the registry is code, not state
NAMES = tuple(_OWNER)


def owner(name: str) -> str:
    if name not in _OWNER:
        raise KeyError(name)
    return _OWNER[name]


def config_of(name: str) -> ModuleType:
    """The light module of the method (or of the method a preset configures): Config and check(cfg)."""
    return _config_module(owner(name))


def schema_of(name: str) -> type:
    """The config dataclass of method=<name>: the method's Config, or its preset's subclass."""
    module = config_of(name)
    return module.Config if name == owner(name) else module.PRESETS[name]


def schemas() -> Mapping[str, type]:
    """method=<name> -> its config dataclass, for every name: what config.schema.register and
    neutral_keys take (the config layer imports nothing of methods/)."""
    return MappingProxyType({name: schema_of(name) for name in NAMES})


class _Registry(Mapping):
    """name -> model module, imported when first looked up (a plain dict would import them all)."""

    __slots__ = ()  # no state: the lookup is the registry's code

    def __getitem__(self, name: str) -> ModuleType:
        return importlib.import_module(f"{__name__}.{owner(name)}.model")

    def __iter__(self):
        return iter(NAMES)

    def __len__(self) -> int:
        return len(NAMES)


METHODS: Mapping[str, ModuleType] = _Registry()
