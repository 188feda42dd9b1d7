"""MLflow behind one small class (deepen_run/tracking/ holds every module that imports mlflow).

The default store is a SQLite file under outputs/, its artifacts beside it in outputs/mlartifacts
(absolute paths: runs started from any directory land where `make ui` shows them). Off the main
process a Tracker is disabled and its writes do nothing, so only rank 0 writes.
"""
from __future__ import annotations

import csv
import functools
import io
import logging
import os
import time
from pathlib import Path
from typing import Any, Optional

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from mlflow.utils.git_utils import get_git_commit
from mlflow.utils.validation import MAX_TAG_VAL_LENGTH as TAG_LIMIT  # the longest tag value MLflow stores
from sqlalchemy.exc import NoSuchModuleError

from deepen_run.masking import mask_string, mask_uri, secret_env_values
from deepen_run.errors import UserError
from deepen_run.tracking.connect import create_schema_once, get_experiment_id, health
from deepen_run.util import first_line, sqlite_path


class TrackingLost(UserError):
    """The store stopped taking writes mid-run (database deleted or made read-only, server gone)."""

    exit_code = 1


def _recorded(method):
    """A write: nothing off the main process; a store that fails is one TrackingLost line instead of
    MLflow's tracebacks."""
    @functools.wraps(method)
    def write(self, *args, **kwargs):
        if not self.enabled:
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 (sqlite, HTTP and artifact errors alike: the record is lost)
            root = e
            while root.__cause__ is not None:  # sqlite3's "attempt to write a readonly database", not the wrappers
                root = root.__cause__
            raise TrackingLost(f"the MLflow store {self.shown} failed mid-run ({hide(first_line(root, 300))}); fix or restore "
                               "it, then continue the run with resume=auto") from e
    return write


def missing_driver(e: BaseException) -> bool:
    """Did opening a store fail for want of a Python package (psycopg2, pymysql, a dialect)?"""
    while e is not None:
        if isinstance(e, (ImportError, NoSuchModuleError)):
            return True
        e = e.__cause__ or e.__context__
    return False


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def hide(text: str) -> str:
    """A message as it may be printed: URL passwords and secret environment values masked."""
    return mask_string(text, secret_env_values())


def git_commit() -> str:
    return get_git_commit(str(Path(__file__).parent)) or "unknown"  # MLflow's own (GitPython)


class Tracker:
    def __init__(self, uri: str, experiment: str, enabled: bool = True, run_id: Optional[str] = None):
        self.uri, self.experiment, self.enabled = uri, experiment, enabled
        self.shown = mask_uri(uri)  # what a message may print: never a user:password@'s password
        if enabled and self.shown != uri:
            # MLflow's client prints "View run ... at: <uri with the password>" as a run ends; the
            # run's summary gives the same link, masked (run/summary.py).
            os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        self.run_id = run_id  # given: writes go to that existing run (a sweep's parent), its status untouched
        self.logged: dict[str, set[int]] = {}  # (metric, step) pairs a resumed run already has
        self.params_logged: set[str] = set()  # params are write-once: a resume logs only new keys
        self.inputs_linked = False  # a resumed run's dataset inputs are there (resume() reads it)
        if enabled:
            # Its ERROR logs print whole tracebacks for what _recorded reports as one line.
            logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
            try:
                create_schema_once(uri)  # before MlflowClient(), which opens (and migrates) the store
                self.client = MlflowClient(tracking_uri=uri)
            except Exception as e:  # noqa: BLE001 (a database URI whose driver is not installed, say)
                hint = "install its database driver" if missing_driver(e) else "check it (or mlflow db upgrade it)"
                raise UserError(f"tracking.uri={self.shown}: cannot open the store ({hide(first_line(e, 200))}); "
                                f"{hint}, or use the default local store") from e

    def check(self) -> None:
        """Reach the store now, not after an hour of training. MLflow retries an absent server for
        minutes: a server is asked for its /health once (10 s, no retry), and MLflow's own calls keep
        their retries for a blip mid-run."""
        if not self.enabled:
            return
        try:
            if self.uri.startswith(("http://", "https://")):
                health(self.uri)
            self.experiment_id = get_experiment_id(self.client, self.uri, self.experiment)
        except Exception as e:  # noqa: BLE001 (any failure here means: no store)
            first = hide(first_line(e, 200))
            raise UserError(f"tracking.uri={self.shown} is not reachable ({first}); start the server "
                            "or use the default local store") from e

    def start(self, run_name: str, tags: dict[str, str], run_id: Optional[str] = None) -> str:
        if not self.enabled:
            return ""
        if not hasattr(self, "experiment_id"):
            self.check()
        if run_id:
            # Tags first: pid/host/command name this process before the run is RUNNING again, so a
            # concurrent run's orphan reaping never sees the dead process of the last attempt.
            self.run_id = run_id
            self.set_tags(tags)
            self.client.update_run(run_id, status="RUNNING")
        else:
            self.run_id = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags).info.run_id
        return self.run_id

    def resume(self) -> None:
        """Continuing a killed run: remember every (metric, step) it has, so none is logged twice
        (MLflow keeps each logged value as history), and drop the last attempt's end-of-run tags."""
        if not self.enabled:
            return
        run = self.client.get_run(self.run_id)
        self.logged = {k: {m.step for m in self.client.get_metric_history(self.run_id, k)} for k in run.data.metrics}
        self.params_logged = set(run.data.params)
        self.inputs_linked = bool(run.inputs.dataset_inputs)  # a run stopped before it linked its GLUE files
        for tag in ("error", "interrupted", "resume_error", "sweep_failed", "stopped_before_first_step"):
            if tag in run.data.tags:
                self.client.delete_tag(self.run_id, tag)

    @_recorded
    def log_params(self, params: dict[str, Any]) -> None:
        # MlflowClient.log_batch splits into the server's batch limits (100 params, 1000 metrics) itself.
        items = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in self.params_logged]
        if items:
            self.client.log_batch(self.run_id, params=items)

    @_recorded
    def log_metrics(self, metrics: dict[str, float], step: int, again: bool = False) -> None:
        """again=True: log even at a step the resumed run already has. The final record of
        train.model_selection=best re-evaluates at the last step, which the killed attempt may have
        logged already; MLflow's latest value at a step is the last logged, so it becomes the result."""
        ts = int(time.time() * 1000)
        items = [Metric(k, float(v), ts, step) for k, v in metrics.items()
                 if again or step not in self.logged.get(k, ())]
        if items:
            self.client.log_batch(self.run_id, metrics=items)

    @_recorded
    def set_tags(self, tags: dict[str, str]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v)[:TAG_LIMIT])

    @_recorded
    def log_text(self, text: str, path: str) -> None:
        self.client.log_text(self.run_id, text, path)

    @_recorded
    def log_dict(self, d: dict, path: str) -> None:
        self.client.log_dict(self.run_id, d, path)

    @_recorded
    def log_figure(self, fig, path: str) -> None:
        self.client.log_figure(self.run_id, fig, path)

    @_recorded
    def log_file(self, local: str, folder: Optional[str] = None) -> None:
        self.client.log_artifact(self.run_id, local, folder)

    def log_csv(self, rows: list[dict], path: str) -> None:
        if not rows:
            return
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
        self.log_text(buf.getvalue(), path)

    @_recorded
    def end(self, status: str = "FINISHED") -> None:
        if self.run_id:
            self.client.set_terminated(self.run_id, status=status)


def _quote(v: str) -> str:
    return "'" + str(v).replace("'", "\\'") + "'"


def find_runs(uri: str, experiment: str, tags: Optional[dict[str, str]] = None,
              status: Optional[str] = None) -> list[dict[str, Any]]:
    """Runs of an experiment whose tags equal `tags`, as plain dicts (run_id, name, status,
    tags, params, metrics), oldest first. The report and the sweep read MLflow only through this."""
    db = sqlite_path(uri)
    if db and not db.is_file():
        raise UserError(f"no MLflow database at {mask_uri(uri)}; pass the tracking URI the runs were logged to")
    if uri.startswith(("http://", "https://")):
        try:  # once, 10 s: MLflow's own client retries an absent server for minutes
            health(uri)
        except Exception as e:  # noqa: BLE001 (refused, timed out, not a server: no store)
            raise UserError(f"{mask_uri(uri)} is not reachable ({hide(first_line(e, 200))}); start the server "
                            "or pass the tracking URI the runs were logged to") from None
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise UserError(f"no experiment {experiment!r} in {uri}; pass the experiment the runs were logged to")
    clauses = [f"tags.`{k}` = {_quote(v)}" for k, v in (tags or {}).items()]
    if status:
        clauses.append(f"attributes.status = {_quote(status)}")
    runs = client.search_runs([exp.experiment_id], " and ".join(clauses), max_results=50000,
                              order_by=["attributes.start_time ASC"])
    return [{"run_id": r.info.run_id, "name": r.info.run_name, "status": r.info.status, "tags": r.data.tags,
             "params": r.data.params, "metrics": r.data.metrics} for r in runs]


def artifact_files(uri: str, run_id: str, folder: str) -> list[str]:
    """Artifact paths directly under `folder` of a run (the leaderboard zip gathers many runs')."""
    return [f.path for f in MlflowClient(tracking_uri=uri).list_artifacts(run_id, folder) if not f.is_dir]


def artifact_text(uri: str, run_id: str, path: str, dst: str) -> str:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per file: noise
    return Path(MlflowClient(tracking_uri=uri).download_artifacts(run_id, path, dst)).read_text()
