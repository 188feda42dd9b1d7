"""What a run records of its model and data in MLflow 3 (the runner calls these two):

  log_data    at the start of a new run: each GLUE file it reads as a dataset input (train, dev,
              test), its path the source, its SHA-256 (data/fingerprint.py) the digest; the tag
              data_fingerprint, one id of the train and dev files' contents (fingerprint.data_id)
  publish     at the end of a run that keeps weights (train.save_best, run/checkpoint.py): a
              LoggedModel holding the weights its eval/* scores were measured on, linked to those
              scores, tagged method/backbone/task; deepen_run.load reads it back

Stored once: the run's result weights are, in the common case, the kept best weights
(train.model_selection=best, or the last evaluation was the best), and the LoggedModel's file is then
a hard link of checkpoints/best/model.safetensors. Only a run whose last weights scored below an
earlier evaluation keeps two different sets: the best in the run dir, the result in the model.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from deepen_run.safe_fs import shared_mode
from deepen_run.serve import bundle
from deepen_run.tracking import models

DATA_TAG = "data_fingerprint"  # deepen_run/report/rows.py reads it (by this name: it imports no serve/)


def log_data(tracker, cfg, tasks, home: Optional[Path]) -> None:
    from deepen_run.data import fingerprint as fp

    if not tracker.enabled or not cfg.data.glue_dir or cfg.dry_run:
        return
    saved = home / fp.FILE if home is not None else None
    digests = json.loads(saved.read_text()) if saved is not None and saved.is_file() else fp.fingerprint(cfg, tasks)
    inputs = [models.dataset_input(name, context, path, digest) for name, context, path, digest in files(cfg, tasks, digests)]
    models.log_datasets(tracker, inputs)
    # deepen-report's row key for the data: what the files hold, not the spelling of their folder
    ident = fp.data_id(cfg, tasks, digests)
    if ident:
        tracker.set_tags({DATA_TAG: ident})


def files(cfg, tasks, digests: dict[str, str]) -> list[tuple[str, str, Path, str]]:
    """(dataset name, context, path, digest) of each fingerprinted GLUE file the run reads."""
    root, out = Path(cfg.data.glue_dir or "."), []
    for spec in tasks:
        splits = [("train", "train")] + [(s, "dev") for s, _ in spec.dev_splits] + \
                 ([(s, "test") for s, _ in spec.test_splits] if cfg.predict else [])
        for stem, context in splits:
            path = (root / spec.folder / f"{stem}.tsv").resolve()
            if str(path) in digests:
                out.append((f"{spec.name}/{stem}", context, path, digests[str(path)]))
    return out


def dev_datasets(cfg, tasks, home: Optional[Path]) -> dict[str, tuple[str, str]]:
    """eval name -> (dataset name, digest) of its dev file, as log_data logged it."""
    from deepen_run.data import fingerprint as fp

    saved = home / fp.FILE if home is not None else None
    if not cfg.data.glue_dir or saved is None or not saved.is_file():
        return {}
    found = {name: (name, digest) for name, _, _, digest in files(cfg, tasks, json.loads(saved.read_text()))}
    out = {}
    for spec in tasks:
        for eval_name, (stem, _) in zip(spec.eval_names, spec.dev_splits):
            if f"{spec.name}/{stem}" in found:
                name, digest = found[f"{spec.name}/{stem}"]
                out[eval_name] = (name, models.short_digest(digest))
    return out


def publish(cfg, tasks, model, tokenizer, tracker, saver, total: int, name: str, tags: dict[str, str],
            compute) -> Optional[str]:
    """The run's LoggedModel (None when the run keeps no weights). `model`: unwrapped, holding the
    weights of the run's result (train.fit's final record); name and tags: what tells it apart (an
    8-layer duplicated model is not the plain 6-layer one), run/names.py model_name, model_tags;
    compute: the run's resolved precision and attention (deepen_run/precision.py Compute)."""
    if not tracker.enabled or not saver.keep_best or saver.root is None:
        return None
    from deepen_run.config.redact import public_config
    from deepen_run.tracking.store import flatten

    best = saver.root / "best" / bundle.WEIGHTS
    same = best.is_file() and (cfg.train.model_selection == "best" or saver.best_step == total)
    metrics = tracker.client.get_run(tracker.run_id).data.metrics
    public, config = public_config(cfg), bundle.model_config(cfg)
    info = {"run_id": tracker.run_id, "method": cfg.method.name, "backbone": cfg.backbone.name,
            "tasks": list(cfg.task.names), "step": total, "weights_from": "checkpoints/best" if same else "final",
            "scores": {k: v for k, v in sorted(metrics.items()) if k.startswith("eval/")},
            # as this machine resolved train.mixed_precision=auto: a loaded model predicts as the run did
            "precision": compute.precision, "attention": compute.attention}
    backbone_config = bundle.pristine_backbone_config(cfg.backbone)

    def fill(folder: Path) -> None:
        bundle.write_meta(folder, config, info, backbone_config)
        tokenizer.save_pretrained(str(folder))
        if same:
            models.copy_or_link(best, folder / bundle.WEIGHTS)
        else:
            from safetensors.torch import save_model

            save_model(model, str(folder / bundle.WEIGHTS))
        method_files(cfg, model, folder)
        shared_mode(folder)  # safetensors writes 0600: a model meant to be shared loads for another account

    return models.log_model(tracker, name, tags,
                            flatten(public), fill, total, dev_datasets(cfg, tasks, saver.root.parent))


def method_files(cfg, model, folder: Path) -> Optional[str]:
    """The method's own files in the model folder, in formats other tools read (method=lora: PEFT's
    adapters under lora/); -> their paragraph for a model card, or None."""
    from deepen_run.methods import METHODS, hook

    return hook(METHODS[cfg.method.name], "model_files")(model, folder)
