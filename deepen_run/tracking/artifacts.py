"""Reading a run's artifacts back (the leaderboard zip gathers submission/ files from many runs)."""
from __future__ import annotations

from mlflow.tracking import MlflowClient


def files(uri: str, run_id: str, folder: str) -> list[str]:
    """Artifact paths directly under `folder` of a run (no recursion)."""
    return [f.path for f in MlflowClient(tracking_uri=uri).list_artifacts(run_id, folder) if not f.is_dir]


def read_text(uri: str, run_id: str, path: str, dst: str) -> str:
    """One artifact's text, downloaded into the folder `dst`."""
    import os
    from pathlib import Path

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per file: noise
    local = MlflowClient(tracking_uri=uri).download_artifacts(run_id, path, dst)
    return Path(local).read_text()
