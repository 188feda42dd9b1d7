"""deepen_run.load: find the model's files (locate.py), read its config, rebuild it (bundle.py), wrap
it for prediction (predictor.py). open_model is the cheap half, so the commands can refuse bad
input before any weights load.

A model folder is data, never code: whatever its config.yaml says, nothing shipped with it (or named
by it on the Hub) runs unless the user's own command asks (trust_remote_code=True, the commands'
--trust-remote-code), and then it says so on stderr."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from deepen_run.errors import UserError


def open_model(source, tracking_uri: Optional[str] = None, trust_remote_code: bool = False):
    """The cheap half of load: where the files are, the run's config and what the model is (no
    weights read). -> (folder, config, info)."""
    from deepen_run.serve import bundle, locate

    folder, cfg_file = locate.model_folder(source, tracking_uri)
    cfg = bundle.load_config(folder, cfg_file)
    # The folder's own backbone.trust_remote_code is not the user's word: a copied or downloaded folder
    # could switch it on and run its tokenizer's Python. Only the caller's argument counts.
    cfg.backbone.trust_remote_code = bool(trust_remote_code)
    if trust_remote_code:
        print(f"trusting code shipped with the model of {source} (--trust-remote-code): it may run", file=sys.stderr)
    info = bundle.read_info(folder) if (folder / bundle.INFO).is_file() else {
        "method": cfg.method.name, "backbone": cfg.backbone.name, "tasks": list(cfg.task.names), "weights": "deepen"}
    return Path(folder), cfg, info


def load(source, tracking_uri: Optional[str] = None, device: Optional[str] = None, trust_remote_code: bool = False):
    """deepen_run.load: a run id, a run folder, a models:/ URI or a model folder -> a TrainedModel
    (model, tokenizer, tasks, heads, predict()). Nothing is repeated from the training command.
    trust_remote_code: let code shipped with the model's tokenizer or config run (never the folder's say)."""
    return build(*open_model(source, tracking_uri, trust_remote_code), device=device)


def build(folder: Path, cfg, info: dict, device: Optional[str] = None):
    from deepen_run.serve import bundle
    from deepen_run.serve.predictor import TrainedModel

    conf_file = folder / bundle.BACKBONE
    backbone_config = bundle.backbone_config_from(conf_file) if conf_file.is_file() \
        else bundle.pristine_backbone_config(cfg.backbone)
    hf_task = info["tasks"][0] if info.get("weights") == "hf" else None
    precision, attention = bundle.run_choices(cfg, info)
    model, tasks = bundle.rebuild(cfg, backbone_config, folder / bundle.WEIGHTS, hf_task, attention)
    return TrainedModel(model, _tokenizer(folder, cfg), tasks, cfg, info, folder, device, precision)


def _tokenizer(folder: Path, cfg):
    trust = bool(cfg.backbone.trust_remote_code)  # open_model set it from the caller, not from the folder
    try:
        if (folder / "tokenizer_config.json").is_file():
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust)
        from deepen_run.model import backbone as bb

        return bb.load_tokenizer(cfg.backbone)
    except ValueError as e:  # transformers: code shipped with the tokenizer that may not run
        if trust or "trust_remote_code" not in str(e):
            raise
        src = folder if (folder / "tokenizer_config.json").is_file() else cfg.backbone.tokenizer or cfg.backbone.path
        raise UserError(f"the tokenizer of {folder} ({src}) needs Python code shipped with it; a model folder "
                        "cannot switch that on: pass --trust-remote-code (deepen_run.load(..., "
                        "trust_remote_code=True)) only if you trust that code") from None
