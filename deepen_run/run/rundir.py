"""The run dir (docs/reliability.md: deepen-run deletes only files it created; one run per run dir).

`RunDirGuard`, a Hydra callback (conf/config.yaml), refuses a folder holding files we did not make, a
dir held by a live run and another run's dir before Hydra rewrites its `.hydra/` and log, and after a
pre-flight error removes what this attempt created (judged by a listing taken before Hydra made
anything). run.json, the run's record, is run/resume.py's; `make clean` is run/clean.py (the standard
library only).
"""
from __future__ import annotations

import contextlib
import fcntl
import io
import os
import sys
from pathlib import Path
from typing import Any, Optional

from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from deepen_run.errors import UserError, fail, fail_with
from deepen_run.run.clean import OURS, RUN_FILE, RUN_RECORDS, SWEEP_RECORDS
from deepen_run.run.lifecycle import DirInUse, in_use
from deepen_run.safe_fs import remove  # one rule for every cleanup: no link followed


def foreign_entries(folder: Path, records: tuple[str, ...]) -> list[str]:
    """The entries of `folder` that say it is not ours: [] when it is missing, empty, or carries one
    of our records (then every entry is ours, the user's additions included: we never clean it)."""
    try:
        names = sorted(p.name for p in folder.iterdir())
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        return [folder.name]
    if any(n in names for n in records):
        return []
    jobs = records == SWEEP_RECORDS  # a sweep dir's numbered folders are its jobs'; in a run dir they are not ours
    return [n for n in names if n not in OURS and not n.endswith(".log") and not (jobs and n.isdigit())]


def _refuse(key: str, folder: Path, names: list[str], prog: str) -> None:
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    fail(f"{key}={folder} already holds files deepen-run did not make ({shown}); deepen-run writes "
         "only into a new or empty folder, or one it made: pick another " + key, 2, prog=prog)


class Listing:
    """What existed before an attempt: the first missing folder on the way to the run dir (None if
    the dir existed) and the dir's entries at that time."""

    def __init__(self, folder: Path):
        self.folder = folder
        missing = [p for p in (folder, *folder.parents) if not p.exists()]
        self.created_from: Optional[Path] = missing[-1] if missing else None
        self.entries = set() if missing else {p.name for p in folder.iterdir()}

    def remove_created(self) -> None:
        if self.created_from is not None:
            why = remove(self.folder, self.created_from.parent)
            if why:
                print(f"deepen-run: kept {why}", file=sys.stderr)
                return
            for p in self.folder.parents:  # parents we made, emptied: rmdir never removes content
                if not p.is_relative_to(self.created_from) or any(p.iterdir()):
                    break
                p.rmdir()
            return
        for p in self.folder.iterdir():
            if p.name not in self.entries and p.suffix != ".log" and p.name != ".lock":
                why = remove(p, self.folder)
                if why:
                    print(f"deepen-run: kept {why}", file=sys.stderr)


def failure(job_return) -> Optional[BaseException]:
    """The exception a failed job raised, by Hydra's public JobReturn: `return_value` raises it. Its
    "Error executing job" line is not printed: Hydra prints it again itself if the error goes on."""
    if job_return is None or job_return.status != JobStatus.FAILED:
        return None
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            _ = job_return.return_value  # raises what the job raised
    except BaseException as e:  # noqa: BLE001 (whatever the job raised is the answer)
        return e
    return None


class RunDirGuard(Callback):
    def __init__(self, prog: str = "deepen-run") -> None:
        self.prog = prog  # the command its error lines name (conf/probe.yaml: deepen-probe)
        self.listing: Optional[Listing] = None
        self.sweep: Optional[Listing] = None  # the sweep dir before this attempt (-m)

    def on_run_start(self, config, **kwargs: Any) -> None:
        if os.environ.get("RANK", "0") != "0":
            return  # the other ranks of a multi-process run use a private scratch dir
        folder = Path(str(OmegaConf.select(config, "hydra.run.dir"))).resolve()
        listing = Listing(folder)  # before this process makes anything there
        self._claim(folder)
        names = foreign_entries(folder, RUN_RECORDS)
        if names:
            _refuse("hydra.run.dir", folder, names, self.prog)
        if in_use(folder):
            fail(str(DirInUse.for_dir(folder)), 2, prog=self.prog)
        from deepen_run.run.resume import check_dir

        try:  # another run's dir: refused before Hydra rewrites that run's .hydra/ and log
            check_dir(OmegaConf.masked_copy(config, [k for k in config if k != "hydra"]), folder)
        except UserError as e:
            fail_with(e, self.prog)
        self.listing = listing

    def _claim(self, folder: Path) -> None:
        """Hold the run dir itself (a flock on the folder, apart from the run's .lock, which the runner
        takes later) from these checks until the process ends: of two runs started at the same instant
        on one dir, the second is refused here, before Hydra writes its .hydra/ and log line there."""
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return  # a file in the way, no permission: foreign_entries and Hydra say so next
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            fail(str(DirInUse.for_dir(folder)), 2, prog=self.prog)
        self.claim = fd  # released when the process exits (or at on_run_end)

    def on_run_end(self, config, job_return=None, **kwargs: Any) -> None:
        error = failure(job_return)
        if getattr(self, "claim", None) is not None:
            os.close(self.claim)
            self.claim = None
        if not isinstance(error, UserError):
            return
        folder = self.listing.folder if self.listing is not None else None
        # Not ours to clean: another live run owns the dir (it may have made it as we started), or an
        # MLflow run exists (run.json): its dir is a record.
        if folder is not None and not (isinstance(error, DirInUse) and error.folder == folder) and not in_use(folder) \
                and not (folder / RUN_FILE).exists():
            self.listing.remove_created()
        fail_with(error, self.prog)  # one line and the exit code now: Hydra would add a line of its own

    def on_multirun_start(self, config, **kwargs: Any) -> None:
        folder = Path(str(OmegaConf.select(config, "hydra.sweep.dir"))).resolve()
        names = foreign_entries(folder, SWEEP_RECORDS)
        if names:
            _refuse("hydra.sweep.dir", folder, names, self.prog)
        self.sweep = Listing(folder)

    def on_job_end(self, config, job_return=None, **kwargs: Any) -> None:
        """A job's bad input (deepen-probe -m; deepen-run's sweep jobs never raise, sweep/jobs.py) stops
        the sweep at once, in one line: Hydra would run every job of the batch first, each refused the
        same way, then print a line of its own. What this attempt made is removed, as for one run: a job
        dir that holds a record (run.json) or was there before stays, and so does the sweep dir then."""
        error = failure(job_return)
        if not isinstance(error, UserError) or self.sweep is None:
            return
        job = Path(str(config.hydra.runtime.output_dir)).resolve()
        sweep = self.sweep.folder
        if job.parent == sweep and job.name not in self.sweep.entries and not (job / RUN_FILE).exists():
            remove(job, sweep)
        if not any(p.is_dir() and p.name not in self.sweep.entries for p in sweep.iterdir()):
            self.sweep.remove_created()  # multirun.yaml and the dir itself, when no other job left files
        fail_with(error, self.prog)
