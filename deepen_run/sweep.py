"""A multirun as one MLflow parent run with one child run per job: the launching process's side.

`SweepCallback` (registered under hydra.callbacks in conf/config.yaml) runs in the launching
process. Before any job starts it checks every job's config and creates the parent run, which also
creates the store's schema there, so parallel jobs never race on it; it writes the sweep's identity
for the jobs (deepen_run/sweep_jobs.py, which also holds the job side), prints each job's start and
result as they happen, and closes the parent when the sweep ends: FINISHED only if every job
finished, else FAILED with the count (KILLED, with its jobs, when a signal stopped the sweep).
"""
from __future__ import annotations

import atexit
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from deepen_run import sweep_summary
from deepen_run.errors import UserError
from deepen_run.sweep_jobs import JOBS_DIR, SWEEP_FILE, read_outcomes, watch, write_json

# The launching process's open sweep. Module state, not callback attributes: launchers pickle
# the callback into every job, and a thread does not pickle.
_OPEN: dict[str, Any] = {}
_SIGNAL: dict[str, Any] = {}  # the signal that stopped the launching process, if one did


def count_jobs(config) -> Optional[int]:
    """How many jobs the sweeper will launch, or None when that cannot be known up front."""
    sweeper = str(OmegaConf.select(config, "hydra.sweeper._target_", default=""))
    if "optuna" in sweeper.lower():
        return int(config.hydra.sweeper.n_trials)
    from deepen_run.sweep_check import job_overrides

    jobs = job_overrides(config)
    return len(jobs) if jobs is not None else None


def sweep_params(config) -> dict[str, str]:
    """The sweep's overrides as params of the parent: `seed` = `1,2,3,4` sits in the seed column."""
    task = [str(o) for o in config.hydra.overrides.task]
    space = [f"{k}={v}" for k, v in (OmegaConf.select(config, "hydra.sweeper.params") or {}).items()]
    out = {}
    for o in task + space:
        key, _, value = o.partition("=")
        out[key.lstrip("+~")] = value
    out["sweep.overrides"] = " ".join(task)
    out["sweep.hydra_overrides"] = " ".join(str(o) for o in config.hydra.overrides.hydra)
    return out


class SweepCallback(Callback):
    def on_multirun_start(self, config, **kwargs) -> None:
        from deepen_run.tracking import Tracker

        from deepen_run.lifecycle import SIGNALS, provenance
        from deepen_run.sweep_check import check_jobs

        try:  # every job's config, before anything is launched or recorded
            checked = check_jobs(config)
        except UserError as e:
            print(f"deepen-run: error: {e}", file=sys.stderr)
            sys.exit(2)
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        (sweep_dir / JOBS_DIR).mkdir(parents=True, exist_ok=True)
        n = checked if checked is not None else count_jobs(config)
        sweep_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]
        uri, experiment = config.tracking.uri, config.tracking.experiment
        tracker = Tracker(uri, experiment)
        try:
            tracker.check()
        except UserError as e:
            print(f"deepen-run: error: {e}", file=sys.stderr)
            sys.exit(2)
        target = lambda key: str(OmegaConf.select(config, key, default="?")).rsplit(".", 1)[-1]  # noqa: E731
        parent = tracker.start(sweep_summary.parent_name(config, sweep_params(config)), {
            "sweep_id": sweep_id, "sweep_role": "parent", "sweep_dir": str(sweep_dir),
            "launcher": target("hydra.launcher._target_"), "sweeper": target("hydra.sweeper._target_")}
            # pid/host: a SIGKILLed launcher's parent is reaped like a run (lifecycle.reap_orphans)
            | {k: v for k, v in provenance().items() if k in ("pid", "host", "command", "git_commit")})
        tracker.log_params(sweep_params(config) | {"sweep.jobs": n if n is not None else "?"})
        info = {"sweep_id": sweep_id, "parent_run_id": parent, "uri": uri, "experiment": experiment,
                "n_jobs": n, "dir": str(sweep_dir), "params": sweep_params(config)}
        write_json(sweep_dir / SWEEP_FILE, info)
        print(f"[sweep {sweep_id}] {n if n is not None else '?'} jobs; parent run {parent} in experiment "
              f"{experiment!r} ({uri}); outputs in {sweep_dir}", flush=True)
        stop = threading.Event()
        watcher = threading.Thread(target=watch, args=(sweep_dir, n, stop), daemon=True)
        watcher.start()
        sweep_summary.start(info, tracker)  # the run note (results table), kept up to date
        _OPEN.update(info=info, tracker=tracker, stop=stop, watcher=watcher)
        atexit.register(_close, interrupted=True)
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                signal.signal(sig, _launcher_signal)

    def on_multirun_end(self, config, **kwargs) -> None:
        if _close(interrupted=False) > 0:
            sys.exit(1)  # the sweep's exit status says whether every job finished


def _launcher_signal(signum, frame) -> None:
    """Ctrl-C / SIGTERM of the launching process: remember which, then stop the launcher."""
    from deepen_run.lifecycle import Interrupted

    _SIGNAL.setdefault("signum", signum)
    raise Interrupted(signum)


def interrupted_sweep(e: BaseException) -> Optional[int]:
    """The signal that stopped this process's sweep (its parent and jobs then end KILLED), or None.
    Whatever the launcher raised on the way out (loky's BrokenProcessPool, a job's Interrupted),
    a sweep stopped by a signal exits 128 + signal number."""
    signum = _SIGNAL.get("signum")
    if signum is None and isinstance(e, KeyboardInterrupt) and (_OPEN or _SIGNAL.get("closed")):
        signum = getattr(e, "signum", 2)
    if signum is None:
        return None
    _SIGNAL.setdefault("signum", signum)
    _close(interrupted=True)
    from deepen_run.lifecycle import Interrupted

    print(f"deepen-run: sweep stopped by {Interrupted(signum)}; its parent and unfinished jobs are KILLED, "
          "their last checkpoints kept (continue a job with resume=auto)", file=sys.stderr)
    return signum


def _close(interrupted: bool) -> int:
    """End the parent run; returns the number of jobs that did not finish."""
    from deepen_run.lifecycle import Interrupted

    if not _OPEN:
        return 0
    info, tracker = _OPEN["info"], _OPEN["tracker"]
    _OPEN["stop"].set()
    _OPEN["watcher"].join()
    _OPEN.clear()
    _SIGNAL["closed"] = True
    sweep_dir = Path(info["dir"])
    reaped = []
    if interrupted:  # jobs whose process died before ending their run (loky kills its workers)
        from deepen_run.lifecycle import reap_orphans

        tracker.check()
        reaped = reap_orphans(tracker, f"tags.sweep_id = '{info['sweep_id']}'", wait_s=60)
    outcomes = read_outcomes(sweep_dir)
    n = info["n_jobs"] if info["n_jobs"] is not None else len(outcomes)
    finished = {k: o for k, o in outcomes.items() if o["status"] == "FINISHED"}
    failed = n - len(finished)  # a job that died without an outcome counts as failed
    status = "FINISHED" if failed == 0 and n > 0 else "KILLED" if interrupted else "FAILED"
    scores = [o["score"] for o in finished.values() if o["score"] == o["score"]]
    tracker.log_metrics({"sweep/jobs": n, "sweep/finished": len(finished), "sweep/failed": failed}
                        | ({"sweep/best_score": max(scores)} if scores else {}), 0)
    if interrupted:
        why = Interrupted(_SIGNAL["signum"]) if "signum" in _SIGNAL else "the launcher exited early"
        killed = sum(o["status"] == "KILLED" for o in outcomes.values()) + len(reaped)
        tracker.set_tags({"interrupted": f"{why}: {len(finished)} of {n} jobs finished, {killed} killed, "
                                         f"{max(0, n - len(outcomes) - len(reaped))} not started"})
    elif failed:
        which = [f"job {k + 1} ({o.get('error', o['status'])})" for k, o in sorted(outcomes.items())
                 if o["status"] != "FINISHED"]
        tracker.set_tags({"sweep_failed": f"{failed} of {n} jobs failed: " + "; ".join(which)})
    for name in ("multirun.yaml", "optimization_results.yaml"):
        if (sweep_dir / name).is_file():
            tracker.log_file(str(sweep_dir / name))
    tracker.end(status)
    print(f"[sweep {info['sweep_id']}] {len(finished)}/{n} jobs FINISHED, {failed} failed; parent run "
          f"{info['parent_run_id']} {status}", flush=True)
    # The final note, figure and table on the parent; the table and the UI links printed last.
    sweep_summary.finish(info, tracker, status, show_table=bool(finished) and not interrupted)
    return failed


