"""The launching process's open sweep: its parent run, the watcher of its jobs, its signals, its end.

One `Launch` a sweep, held by SweepCallback (dropped when a launcher pickles the callback into a
job), by the signal handler and by atexit; no module state. Ctrl-C / SIGTERM of the launcher is only
recorded, as the STOP file: jobs not yet started do not start, running ones save and end KILLED at
their next check, then the parent ends KILLED and the launcher exits 128 + signal. A second signal of
the same kind stops at once.
"""
from __future__ import annotations

import atexit
import contextlib
import signal
import sys
import threading
from pathlib import Path

from deepen_run.run.clean import JOBS_DIR, SWEEP_FILE
from deepen_run.run.lifecycle import reap_orphans
from deepen_run.run.resume import orphan_note
from deepen_run.run.stop import SIGNALS
from deepen_run.signals import catch
from deepen_run.sweep import summary as sweep_summary
from deepen_run.sweep.jobs import STOP_FILE
from deepen_run.sweep.outcomes import Counts, watch
from deepen_run.sweep.resume import LOCK


class Launch:
    def __init__(self, info: dict, tracker, first_step: int = 0, lock=None):
        self.info, self.tracker = info, tracker
        self.dir = Path(info["dir"])
        self.counts = Counts(self.dir, info["n_jobs"], tracker, first_step)
        self.signum: int | None = None
        self.lock = lock  # the sweep dir's launcher lock (resume.hold), held for the launcher's life
        self.closed = False
        self.stop = threading.Event()
        refresh = lambda: sweep_summary.update(info, tracker)  # noqa: E731 (the run note, as each job ends)
        self.watcher = threading.Thread(target=watch, args=(self.counts, self.stop, refresh), daemon=True)

    def begin(self, flag) -> "Launch":
        catch(SIGNALS, self.on_signal)  # first: flag (open_sweep's) records no more, and what it has is acted on
        if flag.signum is not None:  # while the parent was made: the sweep stops before any job starts
            self.on_signal(flag.signum, None)
        self.counts.log()  # every job pending (or kept) before the first one starts
        self.watcher.start()
        atexit.register(self.at_exit)
        return self

    def on_signal(self, signum, frame) -> None:
        """Only records the stop: the STOP file, which every job reads at its next check (a job in a
        worker also has the signal from its process group). A second signal of the same kind stops
        the launcher at once; a later run's orphan reaper then ends its parent KILLED."""
        if signum == self.signum:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
        if self.signum is None and not self.closed:  # not while the parent is being ended: its jobs did
            (self.dir / JOBS_DIR / STOP_FILE).write_text(f"{signal.Signals(signum).name}\n")
            print(f"[sweep {self.info['sweep_id']}] stopping: running jobs save a checkpoint and end KILLED (a "
                  f"second {signal.Signals(signum).name} stops at once)", file=sys.stderr, flush=True)
        self.signum = self.signum or signum

    def end(self) -> None:
        """Every job has returned (on_multirun_end): a stopped sweep's parent ends KILLED, exit 128 +
        signal; otherwise the exit status says whether every job finished."""
        if self.signum is not None:
            self.close(interrupted=True)
            raise SystemExit(128 + self.signum)
        if self.close(interrupted=False) > 0:
            raise SystemExit(1)

    def at_exit(self) -> None:
        """The process ends without on_multirun_end (the sweeper raised): KILLED, to be resumed, unless
        every job had ended (Optuna's end when every trial failed). A new sweep whose sweeper failed
        before any job started (a bad value behind glob(), which check.py cannot enumerate) leaves
        nothing: the error line says why."""
        if self.closed:
            return
        c = self.counts.update(ended=True)
        if self.signum is None and self.info.get("attempt", 1) == 1 and not c.outcomes and not c.unended:
            return self.discard()
        self.close(interrupted=self.signum is not None or c.n == 0 or c.pending > 0 or c.killed > 0)

    def discard(self) -> None:
        """No parent run (deleted) and no sweep record: the same command, fixed, runs in this sweep dir."""
        self.closed = True
        self.stop.set()
        self.watcher.join()
        self.tracker.client.delete_run(self.info["parent_run_id"])
        (self.dir / SWEEP_FILE).unlink(missing_ok=True)
        jobs = self.dir / JOBS_DIR  # only the files this launcher writes there, then the folder if empty
        for name in (LOCK, STOP_FILE):
            (jobs / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            jobs.rmdir()
        # The start line named the parent run: say it is gone, or a reader goes looking for it.
        print(f"[sweep {self.info['sweep_id']}] no job started; parent run {self.info['parent_run_id']} deleted",
              flush=True)

    def close(self, interrupted: bool) -> int:
        """End the parent run with its counts, why and status -> the number of jobs that did not finish."""
        if self.closed:
            return 0
        self.closed = True
        self.stop.set()
        self.watcher.join()
        tracker, why = self.tracker, signal.Signals(self.signum).name if self.signum else "the launcher exited early"
        if interrupted:  # jobs whose process died before ending their run
            reap_orphans(tracker, f"tags.sweep_id = '{self.info['sweep_id']}'", wait_s=60, note=orphan_note)
        c = self.counts.update(ended=True)
        c.log()
        status = "FINISHED" if c.finished == c.n and c.n > 0 else "KILLED" if interrupted else "FAILED"
        if interrupted:
            tracker.set_tags({"interrupted": f"{why}: {c.finished} of {c.n} jobs finished, {c.killed} killed, "
                                             f"{c.pending} not started"})
        elif c.finished < c.n:
            tracker.set_tags({"sweep_failed": f"{c.n - c.finished} of {c.n} jobs failed: " + c.which()})
        for name in ("multirun.yaml", "optimization_results.yaml"):
            if (self.dir / name).is_file():
                tracker.log_text(scrubbed_yaml(self.dir / name), name)
        tracker.end(status)
        print(f"[sweep {self.info['sweep_id']}] {c.line()}; parent run {self.info['parent_run_id']} {status}",
              flush=True)
        if interrupted:
            print(f"deepen-run: sweep stopped by {why}; its parent and {c.killed} unfinished job(s) are KILLED "
                  f"({c.with_checkpoint()} with a checkpoint), {c.pending} not started; continue the sweep with "
                  f"the same command plus resume=auto hydra.sweep.dir={self.dir}", file=sys.stderr, flush=True)
        # The final note, figure and table on the parent; the table and the UI links printed last.
        sweep_summary.finish(self.info, tracker, status, show_table=bool(c.finished) and not interrupted)
        return c.n - c.finished


def scrubbed_yaml(path: Path) -> str:
    """Hydra's record of the sweep with its secrets masked: it holds the config and every override (a
    password in tracking.uri too)."""
    from omegaconf import OmegaConf

    from deepen_run.config.redact import scrub
    from deepen_run.masking import mask_override, secret_env_values

    plain = scrub(OmegaConf.to_container(OmegaConf.load(path), resolve=False), secret_env_values())
    overrides = (plain.get("hydra") or {}).get("overrides") or {}
    for kind, given in overrides.items():  # `key=value` strings: masked by their key too
        if isinstance(given, list):
            overrides[kind] = [mask_override(str(o)) for o in given]
    return OmegaConf.to_yaml(OmegaConf.create(plain))
