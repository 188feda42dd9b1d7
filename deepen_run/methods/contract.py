"""The method contract: what the runner relies on, and nothing more. Light (no torch).

A method `<name>` is a folder of two modules (deepen_run/methods/__init__.py says why two):
  <name>/config.py   MethodConfigModule: `Config` (a dataclass, the schema of method.*), and the
                     optional hook check(cfg)
  <name>/model.py    MethodModule: `Config` again, `build(backbone, cfg, tasks) -> MethodModel`,
                     and the optional hooks after_build / after_train / model_files
Optional hooks are declared in OPTIONAL_HOOKS and fetched with hook(module, name), which returns a
no-op for a hook the method does not define; nobody looks a hook up by hasattr, so a misspelt name
fails loudly (KeyError) instead of being skipped. tests/test_methods_contract.py checks every
registered method against these Protocols on a built tiny model.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Iterable, Optional, Protocol, runtime_checkable

from deepen_run.output import Output  # noqa: F401 (what forward returns: a base type, model/ uses it too)


@runtime_checkable
class MethodModel(Protocol):
    """What build() returns: an nn.Module the loop trains without knowing the method."""

    backbone: Any
    """The (possibly deepened) Hugging Face encoder; backbone.config gives the reported depth."""
    heads: Any
    """ModuleDict task name -> head; its parameters are counted as params/heads."""

    def forward(self, task: str, input_ids, attention_mask, token_type_ids=None) -> Output:
        """-> Output: logits (B, num_labels of task), float ((B, 1) for a regression task), extras."""

    def new_parameters(self) -> Iterable[Any]:
        """Every parameter this method created (heads included), wherever it sits: inside the
        backbone (an adapter) or outside it. These, and nothing else of the method, train at
        train.learning_rate x train.new_params_lr_scale (run/optim.py, optimizer_for); what the backbone
        brought trains at 1x. The runner checks that every parameter not loaded with the backbone
        (nor made by a backbone step) is declared here."""


@runtime_checkable
class MethodConfigModule(Protocol):
    """methods/<name>/config.py: imported to register the schema and for --help, so no torch."""

    Config: type
    """Dataclass of method.*: a `name` field defaulting to <name>, a docstring line `key: meaning`
    for every field (deepen_run/cli/usage.py), its defaults the only ones (conf/method/<name>.yaml just
    selects it)."""


@runtime_checkable
class MethodModule(Protocol):
    """methods/<name>/model.py: the model; imported only when a run builds it."""

    Config: type

    def build(self, backbone, cfg, tasks) -> MethodModel:
        """backbone: the loaded encoder (layers already duplicated if asked); cfg: the method's
        Config node; tasks: list of glue.TaskSpec. Sets requires_grad for what trains."""


def _check(cfg) -> None:
    """Pre-flight on the whole config (the options may depend on the backbone's config file), after
    the generic checks and before any weights load; raises errors.UserError naming the key."""


def _after_build(model, ctx) -> None:
    """Once the data is loaded, before training (ctx: deepen_run.run.context.RunState)."""


def _after_train(model, ctx) -> None:
    """After the final evaluation, on the unwrapped model: the method's own figures and tables."""


def _model_files(model, folder) -> Optional[str]:
    """Files of the method's own in a trained model's folder (a run's LoggedModel, a deepen-export),
    beside the weights, in a format other tools read (folder: a pathlib.Path, written into only under
    a subfolder named after the method). Returns a markdown paragraph for the export's model card on
    how to load them, or None when nothing was written."""


# name -> (the module it lives in, its no-op default, whose docstring is the hook's contract).
OPTIONAL_HOOKS: MappingProxyType = MappingProxyType({
    "check": ("config", _check),
    "after_build": ("model", _after_build),
    "after_train": ("model", _after_train),
    "model_files": ("model", _model_files),
})


def hook(module, name: str) -> Callable[..., Any]:
    """The method's hook `name`, or a no-op when it defines none. Only declared hooks exist."""
    if name not in OPTIONAL_HOOKS:
        raise KeyError(f"{name!r} is not a method hook; declared: {', '.join(OPTIONAL_HOOKS)}")
    fn = getattr(module, name, None)
    return fn if fn is not None else OPTIONAL_HOOKS[name][1]
