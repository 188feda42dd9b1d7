"""A sweep's job, wherever the launcher runs it (this process, loky workers, submitit, SLURM nodes).

Files in the sweep dir are the one channel all of them share (sweep/outcomes.py). A job that did not
finish returns None (NO_SCORE) instead of raising: Hydra's sweepers stop at the first exception, and
the other jobs must go on. Not NaN: Optuna's study.tell raises on NaN; a value that is no float is an
Optuna FAIL trial, and the search goes on.
"""
from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from deepen_run.errors import UserError
from deepen_run.masking import mask_override, mask_string, secret_env_values
from deepen_run.run.clean import JOBS_DIR
from deepen_run.run.names import run_name
from deepen_run.run.progress import job_num
from deepen_run.run.stop import Stopped, StopFlag, check
from deepen_run.signals import catch
from deepen_run.sweep import summary
from deepen_run.sweep.outcomes import previous, start_line, write_json
from deepen_run.util import first_line as _one_line

NO_SCORE = None  # what a job returns that has no score (failed, killed, never started)
STOP_FILE = "STOP"  # written by a launcher stopped by a signal: jobs not started yet do not start


class SweepJob:
    """One job of a sweep, on whichever machine runs it."""

    def __init__(self, info: dict, num: int, overrides: list[str]):
        self.info, self.num, self.overrides = info, num, overrides
        self.jobs = Path(info["dir"]) / JOBS_DIR

    def tags(self) -> dict[str, str]:
        """The sweep's, and the swept values: the runs table's columns."""
        return {"mlflow.parentRunId": self.info["parent_run_id"], "sweep_id": self.info["sweep_id"],
                "sweep_role": "child", "sweep_job": str(self.num)} | summary.child_tags(self.info, self.overrides)

    def run(self, cfg, run_fn: Callable[..., float]) -> Optional[float]:
        from deepen_run.run.resume import current_dir

        t0 = time.time()
        launcher = self.info.get("launcher_pid")
        worker = bool(launcher) and os.getppid() == launcher  # a loky or submitit_local worker of the launcher
        if worker:  # leaves Ctrl-C to its launcher, which stops the sweep; the job's flag below replaces this
            catch([signal.SIGINT], lambda signum, frame: None)  # (not SIG_IGN, which the flag would keep)
        if (self.jobs / STOP_FILE).exists():
            return NO_SCORE  # the sweep was stopped by a signal before this job began: it stays pending
        if not cfg.tracking.run_name:  # short, the swept values first
            # the child's own config, named: the job's config (Hydra's) stays as it was given
            named = summary.child_name(cfg, cfg.seed, self.info, self.overrides)
            cfg = OmegaConf.merge(cfg, {"tracking": {"run_name": named}})
        name = run_name(cfg)
        kept = self._kept(cfg, current_dir())
        if kept is not None:  # FINISHED by an earlier attempt of this sweep: counted, not trained again
            write_json(self.jobs / f"{self.num}.json", kept | {"name": name})
            return scored(kept["score"])
        # From the job's start: a signal while it loads ends it KILLED too, and so does the launcher's
        # STOP file (a launcher stopped by a signal of its own, or on another machine).
        flag = StopFlag(self.jobs / STOP_FILE, parent=launcher if worker else None).install()
        write_json(self.jobs / f"{self.num}.start.json", {"overrides": [mask_override(o) for o in self.overrides],
                                                           "pid": os.getpid(),
                                                           "home": str(current_dir())})
        if launcher == os.getpid():  # the launcher's watcher leaves this process's jobs to say it
            print(start_line(self.num, self.info["n_jobs"], self.overrides), flush=True)
        stopped = None
        try:
            check()  # a stop that landed between the first look at the STOP file and the start file
            score = float(run_fn(cfg, tags=self.tags()))
            outcome = {"status": "FINISHED", "name": name, "score": score} | ({"dry_run": True} if cfg.dry_run else {})
        except Stopped as e:  # the run ended KILLED (with a checkpoint if one was saved)
            stopped, ckpt = e, e.checkpoint
            saved = f"checkpoint {ckpt.name} kept" if ckpt is not None else "no checkpoint saved"
            outcome = {"status": "KILLED", "name": name, "error": f"{e}; {saved}"}
        except Exception as e:  # noqa: BLE001 (any failure: record it, let the other jobs go on)
            line = mask_string(_one_line(e), secret_env_values())  # a URI's password in the error: *** here too
            if not isinstance(e, UserError):
                traceback.print_exc()
            print(f"deepen-run: error: job {self.num + 1}: {line}", file=sys.stderr)
            self._failed_child(cfg, name, line)
            score, outcome = NO_SCORE, {"status": "FAILED", "name": name, "error": line}
        finally:
            flag.uninstall()
        write_json(self.jobs / f"{self.num}.json", outcome | {"seconds": time.time() - t0})
        signum = stopped.signum if stopped is not None else flag.signum
        # A worker whose launcher lives leaves the stop to the STOP file; one orphaned (launcher SIGKILLed) ends itself.
        if signum is not None and not (launcher and os.getppid() == launcher):
            pass_on(signum)  # submitit: requeue; the basic launcher: stop the sweep (launch.Launch.on_signal)
            if stopped is not None and launcher and launcher != os.getpid():
                # A scheduler's job (SLURM: SIGTERM of `scontrol requeue`, which submitit's handler only
                # logs): end as the signal does, so submitit writes no result and its launcher waits for
                # the requeued attempt, which resumes this run.
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
        return NO_SCORE if stopped is not None else scored(score)

    def _kept(self, cfg, home: Optional[Path]) -> Optional[dict]:
        """resume=auto: this job's run dir holds its FINISHED child of this sweep -> its outcome."""
        from deepen_run.run.resume import read_run_file, wanted
        from deepen_run.tracking.store import find_runs

        info = read_run_file(home) if home is not None and wanted(cfg.resume) else {}
        if info.get("status") != "FINISHED":
            return None
        runs = find_runs(cfg.tracking.uri, cfg.tracking.experiment,
                         {"sweep_id": self.info["sweep_id"], "sweep_job": str(self.num)}, status="FINISHED")
        run = next((r for r in runs if r["run_id"] == info["run_id"]), None)
        if run is None:
            return None
        return {"status": "FINISHED", "kept": True, "score": run["metrics"].get("eval/score", float("nan")),
                "seconds": 0.0, "run_id": run["run_id"]} | ({"dry_run": True} if cfg.dry_run else {})

    def _failed_child(self, cfg, name: str, error: str) -> None:
        """A job that failed before its run existed (bad input) still gets a FAILED child, so the
        MLflow UI shows every job of the sweep and why it failed."""
        from deepen_run.run.names import tags_for
        from deepen_run.tracking.store import Tracker, find_runs

        try:
            if find_runs(cfg.tracking.uri, cfg.tracking.experiment, {"sweep_id": self.info["sweep_id"],
                                                                     "sweep_job": str(self.num)}):
                return
            t = Tracker(cfg.tracking.uri, cfg.tracking.experiment)
            t.start(name, tags_for(cfg) | self.tags() | {"error": error})
            t.log_params(dict(mask_override(o).partition("=")[::2] for o in self.overrides))
            t.end("FAILED")
        except Exception as e:  # noqa: BLE001 (the store may be what failed; the outcome file still counts it)
            print(f"deepen-run: warning: could not record job {self.num + 1} in MLflow: {_one_line(e)}",
                  file=sys.stderr)


def scored(score: Optional[float]) -> Optional[float]:
    """A job's return value: its eval/score, or NO_SCORE for none (failed) or NaN (undefined)."""
    return score if score is not None and score == score else NO_SCORE


def pass_on(signum: int) -> None:
    """After a job's run ended KILLED (its own flag is gone), let the process's handler act, as
    Lightning composes handlers: the launcher's (basic launcher: stop the sweep) or submitit's
    (SIGUSR2: requeue the job)."""
    handler = signal.getsignal(signum)
    if callable(handler) and handler is not signal.default_int_handler:
        handler(signum, None)


def current_job() -> Optional[SweepJob]:
    """The sweep job this process runs, or None for a single run (or a sweep without the callback)."""
    num = job_num()
    info = previous(Path(str(HydraConfig.get().sweep.dir)).resolve()) if num is not None else None
    return SweepJob(info, num, [str(o) for o in HydraConfig.get().overrides.task]) if info is not None else None
