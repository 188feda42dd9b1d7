"""Opening an MLflow store: a SQLite file's schema, created once under a lock while parallel jobs
start; a server's health check (with its credentials sent properly, never printed); the
experiment, created once with its artifacts beside the database."""
from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Optional

import mlflow
from mlflow.tracking import MlflowClient

from deepen_run.util import sqlite_path


def _artifact_root(uri: str) -> Optional[str]:
    """For a local SQLite store, artifacts live in mlartifacts/ next to the database file."""
    db = sqlite_path(uri)
    return (db.parent / "mlartifacts").resolve().as_uri() if db else None


def prepare_store(uri: str) -> None:
    db = sqlite_path(uri)
    if db:
        db.parent.mkdir(parents=True, exist_ok=True)


def has_schema(db: Path) -> bool:
    """The file is a SQLite database MLflow has already set up (its alembic version table exists).
    A read-only look with the standard library (create_schema_once holds the lock around it)."""
    import sqlite3

    if not db.is_file():
        return False
    try:
        with closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=20)) as con:
            return con.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='alembic_version'"
                               ).fetchone() is not None
    except sqlite3.Error:
        return False  # not a database (yet): let MLflow create it, or say what is wrong


def create_schema_once(uri: str) -> None:
    """Create (or check) a SQLite store's schema under a file lock, once per database file.

    Several processes opening a fresh database at the same moment each run MLflow's alembic
    migrations and fail ("duplicate column", "table _alembic_tmp_params already exists"); the
    lock makes the first one create the schema while the others wait. Later writes from
    parallel jobs are safe on their own: MLflow sets SQLite's busy_timeout (20 s) on every session.
    A store that already has its schema gets no MLflow probe (seconds), only the lock (a syscall)
    and a read-only sqlite3 look (milliseconds); the look needs the lock, since alembic writes its
    version table at the first of its many migration steps. MLflow's client still checks the schema
    version when it opens the store.
    """
    db = sqlite_path(uri)
    if db is None:
        return
    import fcntl

    with open(f"{db}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not has_schema(db):
                MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def get_experiment_id(client: MlflowClient, uri: str, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    root = _artifact_root(uri)
    try:
        from deepen_run.tracking.ui import KIND  # the classic runs table, not MLflow 3's GenAI view

        from deepen_run.safe_fs import path_part  # the name is text: ../../x must not leave mlartifacts/

        return client.create_experiment(name, artifact_location=f"{root}/{path_part(name)}" if root else None,
                                        tags=dict([KIND]))
    except mlflow.exceptions.MlflowException:
        # Another process of the same sweep created it first.
        return client.get_experiment_by_name(name).experiment_id


def health(uri: str, timeout: float = 10) -> None:
    """GET <server>/health once. urllib takes no user:password@ in a URL: the URI is parsed
    (urllib.parse) and its credentials sent as HTTP basic auth, as MLflow's requests session does."""
    import base64
    from urllib.parse import unquote, urlsplit, urlunsplit
    from urllib.request import Request, urlopen

    u = urlsplit(uri)
    host = u.netloc.rpartition("@")[2]
    req = Request(urlunsplit(u._replace(netloc=host, path=u.path.rstrip("/") + "/health", query="", fragment="")))
    if u.username is not None:
        pair = f"{unquote(u.username)}:{unquote(u.password or '')}".encode()
        req.add_header("Authorization", "Basic " + base64.b64encode(pair).decode())
    urlopen(req, timeout=timeout).close()
