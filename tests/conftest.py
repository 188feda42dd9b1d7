"""Shared fixtures: the real GLUE folder, a throwaway MLflow store, config composition, the CLI."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient

from deepen_run.config import ROOT, register

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
register()


@pytest.fixture(scope="session")
def glue_dir() -> str:
    path = os.environ.get("DEEPEN_GLUE_DIR") or str(ROOT.parent / "shared" / "glue")
    assert Path(path, "SST-2", "train.tsv").is_file(), f"GLUE files not found at {path}; set DEEPEN_GLUE_DIR"
    return path


@pytest.fixture
def mlflow_uri(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/mlflow.db"


def make_cfg(*overrides: str):
    """Compose the real config (conf/) with overrides, as the CLI would."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def runs_of(uri: str, experiment: str = "deepen-run"):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r} in {uri}"
    return client, client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def cli(*args: str, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `deepen-run` as a user would, in a fresh process."""
    e = {**os.environ, **(env or {})}
    exe = Path(sys.executable).with_name("deepen-run")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout, env=e)
