"""Where a trained model's files are, from what the user names: a run id, a run folder, a models:/
URI (a LoggedModel id, or a registered name with @alias or /version) or a model folder (an export,
or a LoggedModel's artifacts). Every refusal is one line (errors.UserError) before any weights load.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from deepen_run.errors import UserError
from deepen_run.serve import bundle
from deepen_run.util import sqlite_path

RUN_FILE = "run.json"  # run/resume.py writes it: the run id and store of a run folder
RUN_CONFIG = "run_config.yaml"  # run/resume.py: the config the run started with
BEST = Path("checkpoints") / "best"


def _store(uri: Optional[str]) -> str:
    from deepen_run.config.schema import default_store

    uri = uri or default_store()
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        raise UserError(f"no MLflow database at {uri}; pass --tracking-uri, the store the run was logged to")
    return uri


def _from_run(run_id: str, uri: str, folder: Optional[Path] = None) -> Path:
    from deepen_run.tracking import models

    if not models.run_exists(uri, run_id):
        raise UserError(f"no run {run_id!r} in {uri}; give a run id, a run folder, a models:/ URI or an export folder")
    model_id = models.model_of_run(uri, run_id)
    if model_id is not None:
        return models.model_files(uri, model_id)
    raise UserError(f"run {run_id} kept no weights (a short run keeps none; rerun it with train.save_best=true)")


def model_folder(source, tracking_uri: Optional[str] = None) -> tuple[Path, Optional[Path]]:
    """-> (a folder of bundle files, or a run folder's checkpoints/best; the config file to read
    when that folder has none: a run folder from before LoggedModels)."""
    text = str(source)
    if text.startswith("models:/"):
        from deepen_run.tracking import models

        uri = _store(tracking_uri)
        return models.model_files(uri, models.resolve_models_uri(uri, text)), None
    path = Path(text).expanduser()
    if path.is_dir():
        if bundle.is_bundle(path):
            return path, None
        if (path / RUN_FILE).is_file():
            info = json.loads((path / RUN_FILE).read_text())
            uri = tracking_uri or info.get("tracking_uri")
            try:
                return _from_run(info["run_id"], _store(uri)), None
            except UserError:
                if (path / BEST / bundle.WEIGHTS).is_file() and (path / RUN_CONFIG).is_file():
                    return path / BEST, path / RUN_CONFIG  # its kept best weights and its config
                raise
        raise UserError(f"{path} is neither a run folder (no {RUN_FILE}) nor a model folder (no {bundle.INFO})")
    if "/" in text or text.startswith("."):
        raise UserError(f"{text}: no such folder")
    return _from_run(text, _store(tracking_uri)), None
