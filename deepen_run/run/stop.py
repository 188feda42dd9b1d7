"""Stopping by agreement (docs/reliability.md, Statuses and signals): `StopFlag`'s handler only
records SIGINT, SIGTERM, SIGHUP, SIGUSR1 or SIGUSR2, so no MLflow write, import or library call is ever
cut in half; the run calls `check()` where stopping is clean, which raises `Stopped` there. A second
signal of the same kind restores the default disposition and re-raises it: the process ends at once
(the orphan reaper later closes its run KILLED).
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Optional

from deepen_run.signals import catch

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


class Stopped(Exception):
    """A signal asked the run to stop, raised at a point the run chose. Not a KeyboardInterrupt: code
    that catches everything (datasets' bare `except:`) never sees it. recorded: the run is ended
    KILLED (run.record.RunRecord), leaving `checkpoint` (None: none saved)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.recorded, self.checkpoint = signum, False, None


class StopFlag:
    """The process's handler for SIGNALS while a run (or a sweep job) is going. stop_file: a sweep's
    STOP file, written by its launcher when the launcher was stopped (jobs on other machines). parent:
    a worker's launcher (loky, submitit_local); if it dies alone (SIGKILL), the job stops as on SIGTERM
    and the worker then ends (sweep/jobs.py) instead of idling on."""

    def __init__(self, stop_file: Optional[Path] = None, parent: Optional[int] = None):
        self.signum, self.stop_file, self.parent = None, stop_file, parent  # signum: the first signal recorded
        self.previous: dict = {}  # the handlers replaced: given back by uninstall (a launcher's, submitit's)

    def install(self) -> "StopFlag":
        self.previous = catch(SIGNALS, self._record)
        return self

    def uninstall(self) -> None:
        for sig, before in self.previous.items():
            signal.signal(sig, before if before is not None else signal.SIG_DFL)
        self.previous = {}

    def _record(self, signum, frame) -> None:
        if signum == self.signum:  # the user insists: stop now, the default way
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
        self.signum = self.signum or signum

    def requested(self) -> Optional[int]:
        """The signal that asked to stop, from this process or the sweep's launcher, or None."""
        if self.signum is None and self.parent is not None and os.getppid() != self.parent:
            print(f"deepen-run: the sweep's launcher (pid {self.parent}) is gone; stopping this job", file=sys.stderr)
            self.signum = signal.SIGTERM
        if self.signum is None and self.stop_file is not None and self.stop_file.exists():
            name = self.stop_file.read_text().strip()
            self.signum = getattr(signal.Signals, name, signal.SIGTERM).value
        return self.signum


def installed(kind: Optional[type] = None):
    """The StopFlag (or other handler owner of `kind`) whose handler the process has now (the OS's
    handler table is where it lives)."""
    owners = (getattr(signal.getsignal(sig), "__self__", None) for sig in SIGNALS)
    return next((o for o in owners if isinstance(o, kind or StopFlag)), None)


def check(accelerator=None) -> None:
    """Raise Stopped if a stop was asked. With several processes every rank calls it at the same
    point and they agree through Accelerate's trigger: one rank's signal stops them all."""
    flag = installed()
    signum = flag.requested() if flag is not None else None
    if accelerator is not None and accelerator.num_processes > 1:
        if signum is not None:
            accelerator.set_trigger()
        if accelerator.check_trigger():
            raise Stopped(signum or signal.SIGTERM)
    elif signum is not None:
        raise Stopped(signum)
