"""Opening an MLflow store: a SQLite file's schema, created once under a lock while parallel jobs
start; a server's health check (its credentials sent properly, never printed); the experiment,
created once with its artifacts beside the database."""
from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit, urlunsplit

import mlflow
import requests
from mlflow.tracking import MlflowClient

from deepen_run.safe_fs import path_part
from deepen_run.tracking.ui import KIND
from deepen_run.util import sqlite_path


def _artifact_root(uri: str) -> Optional[str]:
    """For a local SQLite store, artifacts live in mlartifacts/ next to the database file."""
    db = sqlite_path(uri)
    return (db.parent / "mlartifacts").resolve().as_uri() if db else None


def schema_version(db: Path) -> Optional[str]:
    """The alembic revision of a SQLite file MLflow has set up (its version table), else None: a
    read-only look with the standard library, milliseconds where MLflow's own probe takes seconds."""
    if not db.is_file():
        return None
    try:
        with closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=20)) as con:
            row = con.execute("SELECT version_num FROM alembic_version").fetchone()
            return row[0] if row else None
    except sqlite3.Error:
        return None  # not a database (yet), or no version table: let MLflow create it, or say what is wrong


def _build_aside(uri: str, db: Path) -> bool:
    """Create a fresh store's schema in a temporary file beside `db`, then link it into place: a
    client of another program (`mlflow ui`, a notebook) that opens the path meanwhile finds no file or
    a whole store, never one halfway through MLflow's migrations (which it would then run too: "no such
    column: spans.dimension_attributes"). False: such a client created the file first."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    tmp = db.with_name(f".{db.name}.{os.getpid()}.creating")
    tmp_uri = f"sqlite:///{tmp}"
    try:
        SqlAlchemyStore(tmp_uri, _artifact_root(uri))  # the schema, and MLflow's default experiment
        engine = SqlAlchemyStore._engine_map.pop(tmp_uri, None)  # a cached engine on a name about to go
        if engine is not None:
            engine.dispose()
        try:
            os.link(tmp, db)  # unlike rename, never replaces a file that appeared meanwhile
            return True
        except FileExistsError:
            return False
        except OSError:  # a filesystem without hard links: a rename, unless the file appeared meanwhile
            if db.exists():
                return False
            os.replace(tmp, db)
            return True
    finally:
        tmp.unlink(missing_ok=True)


def _wait_for_other(db: Path, head: str, quiet_s: float = 5.0) -> None:
    """Another program may be migrating a fresh store: wait while its schema version moves, until it
    is MLflow's head (or stands still for quiet_s: an old store, which MLflow's own check then names)."""
    seen, since = object(), time.monotonic()
    while (version := schema_version(db)) != head and time.monotonic() - since < quiet_s:
        if version != seen:
            seen, since = version, time.monotonic()
        time.sleep(0.2)


def create_schema_once(uri: str) -> None:
    """Create (or check) a SQLite store's schema under a file lock, once per database file.

    Processes opening a fresh database at the same moment would each run MLflow's migrations and fail
    ("duplicate column"): under the lock the first creates it and the others find it done. The lock
    covers the look too, since alembic writes its version table at the first of many steps. Later
    writes of parallel jobs are safe on their own: MLflow sets SQLite's busy_timeout (20 s).
    """
    db = sqlite_path(uri)
    if db is None:
        return
    from mlflow.store.db.utils import _get_latest_schema_revision

    db.parent.mkdir(parents=True, exist_ok=True)
    head = _get_latest_schema_revision()
    with open(f"{db}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if schema_version(db) == head:
                return
            if not db.exists() and _build_aside(uri, db):
                return
            _wait_for_other(db, head)  # a file that is there but not (yet) a whole store
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def get_experiment_id(client: MlflowClient, uri: str, name: str) -> str:
    """The experiment's id; a new one opens as the classic runs table (not MLflow 3's GenAI view),
    its artifacts in one folder under mlartifacts/ (its name is text: ../../x must not leave it)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    root = _artifact_root(uri)
    try:
        return client.create_experiment(name, artifact_location=f"{root}/{path_part(name)}" if root else None,
                                        tags=dict([KIND]))
    except mlflow.exceptions.MlflowException:
        # Another process of the same sweep created it first.
        return client.get_experiment_by_name(name).experiment_id


def health(uri: str, timeout: float = 10) -> None:
    """GET <server>/health once, no retry; requests (MLflow's HTTP client) sends a user:password@ in
    the URI as basic auth. An error's URL may hold the password: callers print it through hide()."""
    u = urlsplit(uri)
    requests.get(urlunsplit(u._replace(path=u.path.rstrip("/") + "/health", query="", fragment="")),
                 timeout=timeout).raise_for_status()
