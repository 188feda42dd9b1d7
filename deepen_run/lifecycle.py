"""A run's life: signals that end it KILLED at a clean step, what it records about where it ran,
and runs that a dead process left RUNNING.

SIGINT (Ctrl-C) and SIGTERM (kill, SLURM pre-emption) raise `Interrupted`, a KeyboardInterrupt, so
the runner ends the MLflow run KILLED. During training steps the signal is deferred to the end of
the current step, so the checkpoint saved on the way out is a consistent state (never half an
optimizer update); anywhere else (loading, evaluation) it raises at once. A second signal while
one is pending raises at once too: the user insists.
"""
from __future__ import annotations

import os
import platform
import signal
import socket
import sys
import threading
from contextlib import contextmanager
from importlib import metadata

LIBRARIES = ("torch", "transformers", "datasets", "accelerate", "mlflow", "hydra-core", "omegaconf", "safetensors")


class Interrupted(KeyboardInterrupt):
    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


class SignalGuard:
    def __init__(self):
        self.defer = False
        self.pending: int | None = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # a launcher running jobs in threads: signals stay with the launcher
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.defer and self.pending is None:
            self.pending = signum
            return
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

    def raise_pending(self) -> None:
        if self.pending is not None:
            signum, self.pending = self.pending, None
            raise Interrupted(signum)


GUARD = SignalGuard()


def provenance() -> dict[str, str]:
    """Tags that say what produced the numbers: library versions, git commit, host and process."""
    from deepen_run.redact import mask_string, secret_env_values
    from deepen_run.tracking import git_commit

    command = mask_string(" ".join(sys.argv), secret_env_values())[:4000]  # an override may hold a password
    tags = {"git_commit": git_commit(), "version/python": platform.python_version(),
            "host": socket.gethostname(), "pid": str(os.getpid()), "command": command}
    for lib in LIBRARIES:
        try:
            tags[f"version/{lib}"] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            pass
    return tags


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_orphans(tracker) -> list[str]:
    """End KILLED the runs of this experiment that are RUNNING but whose process (on this host) is
    gone: SIGKILL, OOM-kill or power loss leave no chance to end them from inside."""
    if not tracker.enabled:
        return []
    host = socket.gethostname()
    runs = tracker.client.search_runs([tracker.experiment_id], "attributes.status = 'RUNNING'", max_results=200)
    dead = []
    for r in runs:
        pid = r.data.tags.get("pid", "")
        if r.data.tags.get("host") == host and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            tracker.client.set_tag(r.info.run_id, "error", f"process {pid} exited without ending the run "
                                   "(SIGKILL, out of memory or power loss); resume=true continues it")
            tracker.client.set_terminated(r.info.run_id, status="KILLED")
            dead.append(r.info.run_id)
    return dead
