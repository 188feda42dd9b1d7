"""A run's life: signals that end it KILLED at a clean step, what it records about where it ran,
and runs that a dead process left RUNNING.

SIGINT (Ctrl-C), SIGTERM (kill, SLURM pre-emption), SIGHUP (a closed terminal) and SIGUSR1/SIGUSR2 (what schedulers send before
pre-emption or a time limit, e.g. sbatch --signal=USR1@120) raise `Interrupted`, a KeyboardInterrupt,
so the runner ends the MLflow run KILLED. During training steps the signal is deferred to the end of
the current step, so the checkpoint saved on the way out is a consistent state (never half an
optimizer update); while the run records how it ended (runner.run), it waits until MLflow and
run.json agree; anywhere else (loading, evaluation) it raises at once, except inside an MLflow call,
whose end it waits for (SignalGuard.atomic). A second signal while one is pending raises at once
too, the user insists, except inside an MLflow call: there it joins the first.
"""
from __future__ import annotations

import errno
import os
import platform
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from deepen_run.errors import UserError

LIBRARIES = ("torch", "transformers", "datasets", "accelerate", "mlflow", "hydra-core", "omegaconf", "safetensors")


# SIGHUP: the terminal or SSH session closed; treated as SIGTERM is (saved, KILLED, exit 129).
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


class Interrupted(KeyboardInterrupt):
    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    def __reduce__(self):
        # A sweep job's exception travels back to the launcher pickled (joblib/loky, submitit); the
        # default rebuilds from args ('SIGINT',), which is not a signal number.
        return (Interrupted, (self.signum,))


class SignalGuard:
    """The run's signal handlers, installed by the entry point for one run (cli.checked_run, or a
    sweep job from its start) and removed after it. No module-level instance: the entry point owns
    it and passes it on (runner -> the recipe, the checkpointer); one never installed is inert."""

    DUPLICATE_S = 0.5  # the same signal twice this close together is one event (group + forwarded)

    def __init__(self, repeats_are_copies: bool = False):
        # A sweep job in a worker of its launcher: the launcher passes on the signal the process group
        # already gave the worker, and on a loaded machine that copy may come seconds later, while the
        # run is saving its checkpoint or ending KILLED. There every repeat of a signal is that copy:
        # a user's second Ctrl-C stops the launcher itself, whose end stops the workers (SIGTERM).
        self.repeats_are_copies = repeats_are_copies
        self.defer = False
        self.pending: int | None = None
        self.raised: int | None = None  # the pending signal was raised into running code (not only deferred)
        self.calls = 0  # MLflow calls under way (atomic): a signal is never raised inside one
        self.received = 0  # signals handled so far (copies not counted)
        self.last: tuple[int, float] = (0, -1e9)  # the last signal and when it came
        self.previous: dict[int, object] = {}  # the handlers we replaced (submitit's requeue on SIGUSR2)

    def install(self) -> "SignalGuard":
        if threading.current_thread() is not threading.main_thread():
            return self  # a launcher running jobs in threads: signals stay with the launcher
        for sig in SIGNALS:
            before = signal.signal(sig, self._handle)
            owner = getattr(before, "__self__", None)
            # An earlier run's guard left installed (a crash before uninstall): keep what it replaced.
            self.previous[sig] = owner.previous.get(sig) if isinstance(owner, SignalGuard) else before
        return self

    def uninstall(self) -> None:
        """Give the handlers back (a sweep worker idles between jobs with its own handlers again)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, before in self.previous.items():
            if getattr(signal.getsignal(sig), "__self__", None) is self:
                signal.signal(sig, before if before is not None else signal.SIG_DFL)

    def _handle(self, signum, frame) -> None:
        now = time.monotonic()
        if self.last[0] == signum and (self.repeats_are_copies or now - self.last[1] < self.DUPLICATE_S):
            return  # the sweep's launcher forwarded the Ctrl-C the process group already got
        self.last = (signum, now)
        self.received += 1
        if self.calls or (self.defer and self.pending is None):
            self.pending = self.pending or signum  # a call's end (atomic) or a step's end acts on it
            return
        # Raised here, in whatever code the main thread is running, and kept pending as well: library
        # code that catches everything (datasets' fingerprint hashing has a bare `except:`) can swallow
        # the KeyboardInterrupt, and in a sweep worker the launcher's copy is then dropped as a repeat.
        # A pending signal stops the run at its next check (a step's end), saved.
        self.pending = self.raised = signum
        raise Interrupted(signum)

    @contextmanager
    def deferred(self, on: bool = True):
        """Within: signals wait for `raise_pending` (the end of a step); on=False: they raise at once."""
        before = self.defer
        self.defer = on
        try:
            if not on:
                self.raise_pending()
            yield
        finally:
            self.defer = before

    @contextmanager
    def atomic(self):
        """Within (an MLflow call, tracking/store.py): a signal is never raised; at the block's end it
        acts as it would have: raised where signals raise at once, left for the step's end inside a
        step. Raised inside SQLAlchemy, it could leave this process holding SQLite's lock (the
        exception's traceback kept a statement alive): the run's next write, ending it KILLED, then
        waited 20 s and failed "database is locked", and the run stayed RUNNING."""
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only
            return
        before, seen = self.defer, self.received
        self.calls += 1
        try:
            yield
        finally:
            self.calls -= 1
            if not before and not self.calls and self.received > seen:
                self.raised = self.pending
                raise Interrupted(self.pending)  # kept pending too, as a signal raised at once is

    def surfaced(self, error: BaseException) -> "Interrupted | None":
        """The signal that `error` stands for: one raised at once into running code, which library code
        turned into another exception (CPython's import machinery made one a TypeError), or None."""
        return Interrupted(self.raised) if self.raised is not None and isinstance(error, Exception) else None

    def raise_pending(self) -> None:
        if self.pending is not None:
            signum, self.pending, self.raised = self.pending, None, None
            raise Interrupted(signum)


def provenance() -> dict[str, str]:
    """Tags that say what produced the numbers: library versions, git commit, host and process."""
    from deepen_run.masking import mask_string, secret_env_values
    from deepen_run.tracking.store import git_commit

    command = mask_string(" ".join(sys.argv), secret_env_values())[:4000]  # an override may hold a password
    tags = {"git_commit": git_commit(), "version/python": platform.python_version(),
            "host": socket.gethostname(), "pid": str(os.getpid()), "command": command}
    for lib in LIBRARIES:
        try:
            tags[f"version/{lib}"] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            pass
    return tags


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_orphans(tracker, where: str = "", wait_s: float = 0.0, note=None) -> list[str]:
    """End KILLED the runs of this experiment that are RUNNING but whose process (on this host) is
    gone: SIGKILL, OOM-kill or power loss leave no chance to end them from inside. Sweep parents
    carry pid/host tags too, so a SIGKILLed launcher's parent is reaped like a run.

    where: an extra search clause (a sweep's own children); wait_s: give live processes that long
    to end their runs themselves first (an interrupted sweep's jobs are saving a checkpoint); note(run_id,
    tags): what the dead run left to continue from (runfile.orphan_note), for its error tag."""
    if not tracker.enabled:
        return []
    host = socket.gethostname()
    query = "attributes.status = 'RUNNING'" + (f" and {where}" if where else "")
    runs = tracker.client.search_runs([tracker.experiment_id], query, max_results=200)
    mine = {r.info.run_id: int(r.data.tags["pid"]) for r in runs
            if r.data.tags.get("host") == host and r.data.tags.get("pid", "").isdigit()}
    deadline = time.time() + wait_s
    while time.time() < deadline and any(alive(p) and p != os.getpid() for p in mine.values()):
        time.sleep(0.5)
    dead = []
    for r in runs:
        pid = r.data.tags.get("pid", "")
        if r.info.run_id in mine and int(pid) != os.getpid() and not alive(int(pid)) \
                and tracker.client.get_run(r.info.run_id).info.status == "RUNNING":
            tracker.client.set_tag(r.info.run_id, "error", f"process {pid} exited without ending the run "
                                   f"(SIGKILL, out of memory or power loss); "
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
    import fcntl

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
    except BaseException:  # a full disk, a signal: the lock goes with the file
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
    never blocks a resume. The file is removed when the run ends."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    try:
        f = exclusive(folder / LOCK)
    except BlockingIOError:
        raise DirInUse.for_dir(folder, resuming) from None
    try:
        yield
    finally:
        try:
            os.unlink(folder / LOCK)  # while still held: no other process can hold it yet
        except FileNotFoundError:
            pass
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def in_use(folder: Path) -> bool:
    """Is a live process holding this run dir's lock (so resume must not pick it)?"""
    import fcntl

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
