"""deepen_run.load: find the model's files (locate.py), read its config, rebuild it (bundle.py), wrap
it for prediction (predictor.py). open_model is the cheap half, so the commands can refuse bad
input before any weights load."""
from __future__ import annotations

from pathlib import Path
from typing import Optional


def open_model(source, tracking_uri: Optional[str] = None):
    """The cheap half of load: where the files are, the run's config and what the model is (no
    weights read). -> (folder, config, info)."""
    from deepen_run.serve import bundle, locate

    folder, cfg_file = locate.model_folder(source, tracking_uri)
    cfg = bundle.load_config(folder, cfg_file)
    info = bundle.read_info(folder) if (folder / bundle.INFO).is_file() else {
        "method": cfg.method.name, "backbone": cfg.backbone.name, "tasks": list(cfg.task.names), "weights": "deepen"}
    return Path(folder), cfg, info


def load(source, tracking_uri: Optional[str] = None, device: Optional[str] = None):
    """deepen_run.load: a run id, a run folder, a models:/ URI or a model folder -> a TrainedModel
    (model, tokenizer, tasks, heads, predict()). Nothing is repeated from the training command."""
    return build(*open_model(source, tracking_uri), device=device)


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
    if (folder / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder))
    from deepen_run.model import backbone as bb

    return bb.load_tokenizer(cfg.backbone)
