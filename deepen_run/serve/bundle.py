"""A trained model's folder, the one format behind a run's LoggedModel and `deepen-export`:

  deepen_run.json        what it is: format, source run, method, backbone, tasks, the step and the
                         dev scores the weights were evaluated at, the precision and attention kernel
                         the run resolved, and which file holds the weights
  config.yaml            the run's resolved config (secrets masked): everything the model is rebuilt from
  backbone_config.json   the backbone's config as loaded, before any backbone step (layer copies):
                         the architecture is rebuilt from it without the pretrained weights
  model.safetensors      the weights: our model's state dict ("deepen"), or, in an export of a plain
                         classifier, the HF classifier's ("hf", with its config.json beside them)
  tokenizer files        (exports; a LoggedModel's tokenizer is the backbone's, named in config.yaml)

rebuild() makes the model from these files: the backbone from its config, the backbone steps, the
method's build(), then the weights; what the user gave at training time is all in config.yaml.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from deepen_run.errors import UserError

INFO = "deepen_run.json"
CONFIG = "config.yaml"
BACKBONE = "backbone_config.json"
WEIGHTS = "model.safetensors"
FORMAT = 1


def is_bundle(folder: Path) -> bool:
    return (folder / INFO).is_file() and (folder / CONFIG).is_file()


def read_info(folder: Path) -> dict:
    return json.loads((folder / INFO).read_text())


def pristine_backbone_config(bcfg):
    """The backbone's config before any backbone step, from its config file (no weights load)."""
    from transformers import AutoConfig

    from deepen_run.model import backbone as bb

    if not bcfg.pretrained:
        return bb.architecture(bcfg)
    kw = dict(revision=bcfg.revision, trust_remote_code=bcfg.trust_remote_code)
    try:  # the run found it, so a Hub backbone is cached: read without asking the Hub (as bb.depth)
        return AutoConfig.from_pretrained(bb.resolve(bcfg.path), local_files_only=True, **kw)
    except (OSError, ValueError):
        return AutoConfig.from_pretrained(bb.resolve(bcfg.path), **kw)


def backbone_config_from(path: Path):
    """A config class transformers itself ships, chosen by model_type: never code named by the file."""
    from transformers import CONFIG_MAPPING

    try:
        d = json.loads(path.read_text())
        family = d.get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise UserError(f"{path} is not a backbone config (JSON with a model_type): {e}") from None
    if family not in CONFIG_MAPPING:
        raise UserError(f"{path}: model_type {family!r} is not a family transformers knows; the folder is damaged "
                        "or from a newer transformers")
    return CONFIG_MAPPING[family].from_dict(d)


def model_config(cfg) -> dict:
    """The run's resolved config as the model folder keeps it: without tracking.* and resume (where
    outputs went), secrets' values masked in every string. Not redact.public_config: it masks by key
    name, and backbone.pad_token_id is a number the model is rebuilt from, not a token."""
    from deepen_run.masking import mask_string, secret_env_values

    secrets = secret_env_values()

    def walk(v):
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return mask_string(v, secrets) if isinstance(v, str) else v

    resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    for key in ("tracking", "resume"):
        resolved.pop(key, None)
    return walk(resolved)


def write_meta(folder: Path, config: dict, info: dict, backbone_config) -> None:
    """Everything but the weights (and tokenizer)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG).write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    (folder / BACKBONE).write_text(backbone_config.to_json_string())
    (folder / INFO).write_text(json.dumps({"format": FORMAT, "weights": "deepen", **info}, indent=1))


def load_config(folder: Path, cfg_file: Optional[Path] = None):
    """The run's config, checked against the schema again (its choices become the enums they were)."""
    from deepen_run.config.schema import Config

    saved = OmegaConf.load(cfg_file or folder / CONFIG)
    return OmegaConf.merge(OmegaConf.structured(Config), saved)


def load_state(path: Path) -> dict:
    """The weights, through safetensors alone (no pickle is ever read); a missing, truncated or foreign
    file is one line."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise UserError(f"{path.parent} has no {path.name}: its weights are missing (weights load only from "
                        "safetensors, never from a pickle such as pytorch_model.bin)")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise UserError(f"{path} is not a readable safetensors file (damaged, truncated or another format): "
                        f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def fit_state(model, state: dict) -> None:
    """Load `state` into `model`; safetensors keeps a tensor shared by several modules under one of
    its names (as checkpoints/best does), so only names missing without a shared twin are errors."""
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a tensor of the wrong shape: the folder's weights are not this model's
        raise UserError("the weights do not fit the model rebuilt from its config: "
                        f"{' '.join(str(e).split())[:300]}") from None
    now = model.state_dict()
    shared = {now[k].data_ptr() for k in state if k in now}
    lost = [k for k in missing if now[k].data_ptr() not in shared]
    if lost or unexpected:
        raise UserError(f"the weights do not fit the model rebuilt from its config: missing {lost[:3]}, "
                        f"unexpected {unexpected[:3]}")


def run_choices(cfg, info: dict) -> tuple[str, Optional[str]]:
    """(precision, attention kernel) the run trained and evaluated with: the kernels round differently
    in bf16, and a prediction must be the run's own. Recorded in the model's info by the run (its
    machine resolved train.mixed_precision=auto); a model saved before that: as this machine would
    resolve the run's config."""
    if "precision" in info:
        return info["precision"], info.get("attention")
    from deepen_run.precision import resolve

    if "train" not in cfg:
        return "no", None
    compute = resolve(cfg.train)
    return compute.precision, compute.attention


def rebuild(cfg, backbone_config, weights: Optional[Path], hf_task: Optional[str] = None,
            attention: Optional[str] = None):
    """The trained model: backbone from its config, the backbone steps, the method, its weights.
    hf_task: the weights are an HF classifier's for this task (an export of a plain classifier);
    attention: the run's attention kernel (run_choices), None for transformers' default."""
    import torch
    from transformers import AutoModel

    from deepen_run.data.glue import get_tasks
    from deepen_run.methods import METHODS
    from deepen_run.model import backbone as bb
    from deepen_run.model import steps as backbone_steps

    tasks = get_tasks(list(cfg.task.names))
    torch.manual_seed(0)  # the random init is overwritten; seeded so that a missing weight shows alike
    backbone = AutoModel.from_config(backbone_config, attn_implementation=attention, dtype=bb.DTYPE)
    backbone_steps.apply(backbone, cfg)
    model = METHODS[cfg.method.name].build(backbone, cfg.method, tasks)
    if weights is not None:
        state = load_state(weights)
        if hf_task is not None:
            from deepen_run.serve import hf

            state = hf.from_hf(state, model.backbone.config.model_type, hf_task)
        fit_state(model, state)
    model.eval()
    return model, tasks

