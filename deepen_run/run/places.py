"""Pre-flight of the places a run writes: the tracking store and the run's folders, checked with the
cheap checks (deepen_run/run/preflight.py): MLflow would find an unusable or read-only store only at
its first write, and a run an unwritable folder only at its first checkpoint."""
from __future__ import annotations

import os
from pathlib import Path

from deepen_run.errors import UserError
from deepen_run.util import sqlite_path

# MLflow's tracking stores: a database (SQLAlchemy's dialects, with or without +driver) or a server.
# Not a plain path or file: URI: MLflow 3 keeps its folder store in maintenance mode and refuses it.
STORE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")


def tracking_store(t) -> None:
    """A local store's permissions, before the run: MLflow would find a read-only database only at
    its first write, after the model loaded, with tracebacks. os.access is what the process may do
    (for root, write access to anything not on a read-only mount)."""
    if not str(t.experiment or "").strip():
        raise UserError("tracking.experiment is empty; name the MLflow experiment (default: deepen-run)")
    scheme, sep, _ = str(t.uri).partition("://")
    if not sep or scheme.split("+")[0] not in STORE_SCHEMES:
        raise UserError(f"tracking.uri={t.uri} is not an MLflow tracking store deepen-run can use: give "
                        "sqlite:///<absolute path of a .db file>, a database URI or http(s)://<server>")
    db = sqlite_path(t.uri)
    if db is None:
        return  # a server: Tracker.check reaches it before the run
    if db.is_dir():
        raise UserError(f"tracking.uri={t.uri}: {db} is a folder, not a database file")
    if db.exists() and not os.access(db, os.R_OK | os.W_OK):
        raise UserError(f"tracking.uri={t.uri}: the database {db} is read-only; chmod u+rw it or use another store")
    why = writable(db.parent)  # SQLite writes its journal next to the database, MLflow its lock file and mlartifacts/
    if why:
        raise UserError(f"tracking.uri={t.uri}: {why}; use another store")
    for extra in (Path(f"{db}.lock"), db.parent / "mlartifacts"):
        if extra.exists() and not os.access(extra, os.W_OK):
            raise UserError(f"tracking.uri={t.uri}: {extra} is read-only; chmod u+rw it or use another store")


def writable(folder: Path) -> str | None:
    """Why `folder` (made on first use, so its nearest existing ancestor is what counts) cannot take
    our files, or None. os.access says what the permission bits allow; root passes it everywhere,
    so a real probe file is written too (a read-only mount, a full or flaky disk refuse it)."""
    import tempfile

    here = folder
    while not here.exists() and not here.is_symlink() and here != here.parent:
        here = here.parent
    if here.is_symlink() and not here.exists():
        return f"{here} is a broken link"
    if not here.is_dir():
        return f"{here} is a file, not a folder"
    if not os.access(here, os.W_OK | os.X_OK):
        return f"the folder {here} is not writable (chmod u+rwx it)"
    try:
        fd, probe = tempfile.mkstemp(prefix=".deepen-probe-", dir=here)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f"cannot write in {here} ({e.strerror or e})"
    return None


def writable_dirs(cfg) -> None:
    """data.cache_dir and the run dir, before any weights load: a run would find them unwritable only
    after tokenizing or at its first checkpoint, with a PermissionError traceback and a FAILED run."""
    from hydra.core.hydra_config import HydraConfig

    where = [("data.cache_dir", cfg.data.cache_dir)] if cfg.data.cache_dir else []
    if HydraConfig.initialized():  # the run dir Hydra made (a sweep's launcher: its own, checked alike)
        where.append(("hydra.run.dir", HydraConfig.get().runtime.output_dir))
    for key, folder in where:
        why = writable(Path(str(folder)).expanduser())
        if why:
            raise UserError(f"{key}={folder}: {why}; pass another {key}")
