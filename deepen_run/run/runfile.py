"""run.json, a run dir's record of its MLflow run: the run id, the store (password masked), the
experiment and the status. A resume continues that run, not a new one; the run-dir guard and the
orphan reaper read it too. Written whole (a temporary file, then renamed), never half."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

from deepen_run.run.checkpoint import latest, steps_of
from deepen_run.run.clean import RUN_FILE


def read_run_file(home: Path) -> dict:
    f = home / RUN_FILE
    return json.loads(f.read_text()) if f.is_file() else {}


def write_run_file(home: Optional[Path], run_id: str, uri: str, experiment: str, status: str = "RUNNING") -> None:
    from deepen_run.masking import mask_uri

    if home is not None and run_id:  # a record on disk: no user:password@'s password
        tmp = home / f".{RUN_FILE}.tmp"  # then renamed: a full disk leaves the old run.json, never half of one
        tmp.write_text(json.dumps({"run_id": run_id, "tracking_uri": mask_uri(uri), "experiment": experiment,
                                   "status": status}))
        tmp.replace(home / RUN_FILE)


def finish(home: Optional[Path], status: str) -> None:
    """Record how the run ended; a FINISHED run drops its full-state checkpoints (optimizer state is
    twice the model, and a finished schedule cannot be continued) and keeps checkpoints/best."""
    info = read_run_file(home) if home is not None else {}
    if not info:
        return
    write_run_file(home, info["run_id"], info["tracking_uri"], info["experiment"], status)
    if status == "FINISHED":
        for _, p in steps_of(home):
            shutil.rmtree(p, ignore_errors=True)


def orphan_note(run_id: str, tags: dict) -> str:
    """What a dead run left to continue from, said truthfully; its run.json is marked KILLED too."""
    if tags.get("sweep_role") == "parent":
        return "rerun the sweep's command with resume=auto to continue it"
    home = Path(tags["run_dir"]) if tags.get("run_dir") else None
    if home is None or read_run_file(home).get("run_id") != run_id:
        return "resume=auto in its run dir continues it"
    finish(home, "KILLED")
    last = latest(home)
    if last is None:
        return f"no checkpoint was saved; resume=auto in {home} runs it again from step 0 as the same run"
    return f"resume=auto in {home} continues it from its checkpoint {last.name}"
