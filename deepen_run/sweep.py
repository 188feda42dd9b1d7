"""A multirun as one MLflow parent run with one child run per job.

`SweepCallback` (registered under hydra.callbacks in conf/config.yaml) runs in the launching
process. Before any job starts it creates the parent run, which also creates the store's schema
there, so parallel jobs never race on it; it writes the sweep's identity to
<sweep dir>/deepen_sweep.json, prints each job's start and result as they happen, and closes the
parent when the sweep ends: FINISHED only if every job finished, else FAILED with the count.

Jobs run wherever the launcher puts them (this process, joblib's loky workers, submitit processes,
SLURM nodes). A file in the sweep dir is the one channel all of them share, so each job reads
the sweep file and writes its outcome to <sweep dir>/deepen_jobs/<num>.json. A failing job
returns NaN instead of raising: Hydra's sweepers stop at the first exception, and the other jobs
must go on (Optuna counts a NaN as a failed trial).
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import OmegaConf

from deepen_run.errors import UserError
from deepen_run.util import first_line as _one_line

SWEEP_FILE = "deepen_sweep.json"
JOBS_DIR = "deepen_jobs"
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


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)  # atomic: the watcher never reads half a file


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
        parent = tracker.start(f"sweep-{sweep_id}", {
            "sweep_id": sweep_id, "sweep_role": "parent", "sweep_dir": str(sweep_dir),
            "launcher": target("hydra.launcher._target_"), "sweeper": target("hydra.sweeper._target_")}
            # pid/host: a SIGKILLed launcher's parent is reaped like a run (lifecycle.reap_orphans)
            | {k: v for k, v in provenance().items() if k in ("pid", "host", "command", "git_commit")})
        tracker.log_params(sweep_params(config) | {"sweep.jobs": n if n is not None else "?"})
        info = {"sweep_id": sweep_id, "parent_run_id": parent, "uri": uri, "experiment": experiment,
                "n_jobs": n, "dir": str(sweep_dir), "params": sweep_params(config)}
        _write_json(sweep_dir / SWEEP_FILE, info)
        print(f"[sweep {sweep_id}] {n if n is not None else '?'} jobs; parent run {parent} in experiment "
              f"{experiment!r} ({uri}); outputs in {sweep_dir}", flush=True)
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(sweep_dir, n, stop), daemon=True)
        watcher.start()
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

def _outcomes(sweep_dir: Path) -> dict[int, dict]:
    out = {}
    for f in (sweep_dir / JOBS_DIR).glob("*.json"):
        stem = f.name[:-len(".json")]
        if stem.isdigit():
            out[int(stem)] = json.loads(f.read_text())
    return out


def _watch(sweep_dir: Path, n: Optional[int], stop: threading.Event) -> None:
    """Print '[job k/N] ...' when a job starts and when it ends, whichever process ran it."""
    seen: set[str] = set()
    total = n if n is not None else "?"
    while True:
        done = stop.is_set()
        for f in sorted((sweep_dir / JOBS_DIR).glob("*.json"), key=lambda p: p.stat().st_mtime):
            if f.name in seen:
                continue
            seen.add(f.name)
            num, _, kind = f.name.partition(".")
            d = json.loads(f.read_text())
            k = f"[job {int(num) + 1}/{total}]"
            if kind == "start.json":
                print(f"{k} started: {' '.join(d['overrides'])}", flush=True)
            elif d["status"] == "FINISHED":
                print(f"{k} FINISHED {d['name']}  eval/score={d['score']:.4f}  ({d['seconds']:.0f} s)", flush=True)
            else:
                print(f"{k} {d['status']} {d['name']}  {d['error']}  ({d['seconds']:.0f} s)", flush=True)
        if done:
            return
        stop.wait(0.5)


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
    outcomes = _outcomes(sweep_dir)
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
    if finished and not interrupted:
        _report(info, tracker)
    return failed


def _report(info: dict, tracker) -> None:
    """The sweep's results table, printed and logged to the parent run."""
    from deepen_run import report

    try:
        runs = report.load_runs(info["uri"], info["experiment"], {"sweep_id": info["sweep_id"]})
        table = report.build(runs)
        print(report.to_markdown(table), flush=True)
        report.log_to_run(table, tracker)
    except Exception as e:  # noqa: BLE001 (the sweep itself is recorded; a report bug must not hide that)
        print(f"deepen-run: warning: the sweep's report failed: {_one_line(e)}", file=sys.stderr)


def _is_sweep(value: str) -> bool:
    """`1,2,3`, `[1],[2]`, range(...), choice(...), interval(...): not a plain value or list `[2,3]`."""
    if value.startswith(("range(", "choice(", "interval(", "glob(", "tag(")):
        return True
    depth = 0
    for ch in value:
        depth += ch in "[({"
        depth -= ch in "])}"
        if ch == "," and depth == 0:
            return True
    return False


class SweepJob:
    """One job of a sweep, on whichever machine runs it."""

    def __init__(self, info: dict, num: int, overrides: list[str]):
        self.info, self.num, self.overrides = info, num, overrides
        self.jobs = Path(info["dir"]) / JOBS_DIR

    def tags(self) -> dict[str, str]:
        return {"mlflow.parentRunId": self.info["parent_run_id"], "sweep_id": self.info["sweep_id"],
                "sweep_role": "child", "sweep_job": str(self.num)}

    def swept(self) -> list[str]:
        """This job's values of the swept keys the default run name does not already say, so the
        children of `method.gru_layers=1,2,3` are told apart in the MLflow UI."""
        named = {"backbone", "method", "task", "task.names", "schedule", "seed"}
        sweep = self.info.get("params", {})
        out = []
        for o in self.overrides:
            key, _, value = o.partition("=")
            key = key.lstrip("+~")
            if key not in named and _is_sweep(sweep.get(key, "")):
                out.append(f"{key.rsplit('.', 1)[-1]}={value}")
        return out

    def run(self, cfg, run_fn: Callable[..., float]) -> float:
        from deepen_run.runner import run_name

        t0 = time.time()
        _write_json(self.jobs / f"{self.num}.start.json", {"overrides": self.overrides})
        if not cfg.tracking.run_name:
            cfg.tracking.run_name = " ".join([run_name(cfg), *self.swept()])
        name = run_name(cfg)
        try:
            score = float(run_fn(cfg, tags=self.tags()))
        except KeyboardInterrupt as e:  # the run ended KILLED with a checkpoint
            _write_json(self.jobs / f"{self.num}.json", {"status": "KILLED", "name": name, "error": str(e),
                                                         "seconds": time.time() - t0})
            from deepen_run.lifecycle import GUARD

            GUARD.chain(getattr(e, "signum", 2))  # submitit: requeue the job (it resumes with resume=auto)
            raise
        except Exception as e:  # noqa: BLE001 (any failure: record it, let the other jobs go on)
            line = _one_line(e)
            if not isinstance(e, UserError):
                traceback.print_exc()
            print(f"deepen-run: error: job {self.num + 1}: {line}", file=sys.stderr)
            self._failed_child(cfg, name, line)
            _write_json(self.jobs / f"{self.num}.json", {"status": "FAILED", "name": name, "error": line,
                                                         "seconds": time.time() - t0})
            return float("nan")
        _write_json(self.jobs / f"{self.num}.json", {"status": "FINISHED", "name": name, "score": score,
                                                     "seconds": time.time() - t0})
        return score

    def _failed_child(self, cfg, name: str, error: str) -> None:
        """A job that failed before its run existed (bad input) still gets a FAILED child, so the
        MLflow UI shows every job of the sweep and why it failed."""
        from deepen_run.runner import tags_for
        from deepen_run.tracking import Tracker, find_runs

        try:
            if find_runs(cfg.tracking.uri, cfg.tracking.experiment, {"sweep_id": self.info["sweep_id"],
                                                                     "sweep_job": str(self.num)}):
                return
            t = Tracker(cfg.tracking.uri, cfg.tracking.experiment)
            t.start(name, tags_for(cfg) | self.tags() | {"error": error})
            t.log_params(dict(o.partition("=")[::2] for o in self.overrides))
            t.end("FAILED")
        except Exception as e:  # noqa: BLE001 (the store may be what failed; the outcome file still counts it)
            print(f"deepen-run: warning: could not record job {self.num + 1} in MLflow: {_one_line(e)}",
                  file=sys.stderr)


def current_job() -> Optional[SweepJob]:
    """The sweep job this process runs, or None for a single run (or a sweep without the callback)."""
    try:
        hc = HydraConfig.get()
    except ValueError:
        return None
    if hc.mode != RunMode.MULTIRUN:
        return None
    f = Path(str(hc.sweep.dir)).resolve() / SWEEP_FILE
    if not f.is_file():
        return None
    return SweepJob(json.loads(f.read_text()), int(hc.job.num), [str(o) for o in hc.overrides.task])
