"""A run's life: what it records about where it ran, the lock that makes a run dir one run's, and
runs that a dead process left RUNNING. Signals are run/stop.py's.
"""
from __future__ import annotations

import errno
import fcntl
import os
import platform
import socket
import sys
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from psutil import pid_exists  # another user's live process counts too

from deepen_run.errors import UserError
from deepen_run.masking import mask_string, secret_env_values

LIBRARIES = ("torch", "transformers", "datasets", "accelerate", "mlflow", "hydra-core", "omegaconf", "safetensors")


def provenance() -> dict[str, str]:
    """Tags that say what produced the numbers: library versions, git commit, host and process."""
    from deepen_run.tracking.store import git_commit  # mlflow: only once a run starts

    command = mask_string(" ".join(sys.argv), secret_env_values())[:4000]  # an override may hold a password
    tags = {"git_commit": git_commit(), "version/python": platform.python_version(),
            "host": socket.gethostname(), "pid": str(os.getpid()), "command": command}
    for lib in LIBRARIES:
        try:
            tags[f"version/{lib}"] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            pass
    return tags


def reap_orphans(tracker, where: str = "", wait_s: float = 0.0, note=None) -> list[str]:
    """End KILLED this experiment's RUNNING runs (sweep parents too) whose process on this host is gone
    (SIGKILL, a second signal, OOM, power loss). where: an extra search clause (a sweep's own children);
    wait_s: how long live processes may take to end their runs first (a stopped sweep's jobs are saving);
    note(run_id, tags): what the dead run left to continue from (resume.orphan_note), for its error tag."""
    if not tracker.enabled:
        return []
    host = socket.gethostname()
    query = "attributes.status = 'RUNNING'" + (f" and {where}" if where else "")
    runs = tracker.client.search_runs([tracker.experiment_id], query, max_results=200)
    mine = {r.info.run_id: int(r.data.tags["pid"]) for r in runs
            if r.data.tags.get("host") == host and r.data.tags.get("pid", "").isdigit()}
    deadline = time.time() + wait_s
    while time.time() < deadline and any(pid_exists(p) and p != os.getpid() for p in mine.values()):
        time.sleep(0.5)
    dead = []
    for r in runs:
        pid = r.data.tags.get("pid", "")
        if r.info.run_id in mine and int(pid) != os.getpid() and not pid_exists(int(pid)) \
                and tracker.client.get_run(r.info.run_id).info.status == "RUNNING":
            tracker.client.set_tag(r.info.run_id, "error", f"process {pid} exited without ending the run "
                                   f"(SIGKILL, a second Ctrl-C or signal, out of memory or power loss); "
                                   f"{note(r.info.run_id, r.data.tags) if note else 'resume=auto continues it'}")
            tracker.client.set_terminated(r.info.run_id, status="KILLED")
            dead.append(r.info.run_id)
    return dead


LOCK = ".lock"


def holder(lock: Path) -> str:
    """'pid host' of the process that holds a lock file (exclusive), '?' if unreadable."""
    try:
        return lock.read_text().strip() or "?"
    except OSError:
        return "?"


def exclusive(lock: Path):
    """An exclusive flock on `lock`, with 'pid host' written in it -> the open file (closing it, or the
    process dying however it dies, lets it go). BlockingIOError: a live process holds it. A holder
    may remove the file as we lock it, and a lock on an unlinked file holds nothing: it counts only
    while the path still names the locked file."""
    while True:
        try:  # no link followed: a lock file that is a link would have its target emptied
            f = os.fdopen(os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644), "r+")
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise UserError(f"{lock} is a link; deepen-run keeps its lock there as a file of its own: remove "
                            "the link") from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise
        try:
            if os.stat(lock).st_ino == os.fstat(f.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()  # the holder removed it as we locked: take the new one
    try:
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()} {socket.gethostname()}\n")
        f.flush()
    except OSError:  # a full disk: the lock goes with the file
        f.close()
        raise
    return f


class DirInUse(UserError):
    """Another live process holds this run dir (its files must not be touched)."""

    @classmethod
    def for_dir(cls, folder: Path, resuming: bool = False) -> "DirInUse":
        fix = "wait for that run to end" if resuming else "pass another hydra.run.dir, or wait for that run to end"
        error = cls(f"run dir {folder} is in use by another run (pid host: {holder(folder / LOCK)}); one run dir "
                    f"holds one run: {fix}")
        error.folder = folder  # whose dir it is: the command's own is not cleaned up (rundir.RunDirGuard)
        return error


@contextmanager
def run_dir_lock(folder: Path, resuming: bool = False):
    """One run dir holds one run: an exclusive flock on <dir>/.lock for the run's life, so a stale lock
    never blocks a resume. The file is removed when the run ends (while still held: no other process
    can hold it yet), and closing it lets the lock go."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        f = exclusive(folder / LOCK)
    except BlockingIOError:
        raise DirInUse.for_dir(folder, resuming) from None
    try:
        yield
    finally:
        (folder / LOCK).unlink(missing_ok=True)
        f.close()


def in_use(folder: Path) -> bool:
    """Is a live process holding this run dir's lock (so resume must not pick it)?"""
    try:
        f = open(folder / LOCK)
    except (FileNotFoundError, IsADirectoryError):
        return False
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False
