"""A sweep's jobs, and the files they share with the launching process (deepen_run/sweep.py).

Jobs run wherever the launcher puts them (this process, joblib's loky workers, submitit processes,
SLURM nodes). A file in the sweep dir is the one channel all of them share: each job reads the
sweep's identity from <sweep dir>/deepen_sweep.json and writes its start and its outcome to
<sweep dir>/deepen_jobs/<num>.start.json and <num>.json, which the launching process watches
(progress lines) and counts when it closes the parent run. A failing job returns NaN instead of
raising: Hydra's sweepers stop at the first exception, and the other jobs must go on (Optuna
counts a NaN as a failed trial).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from deepen_run.errors import UserError
from deepen_run.util import first_line as _one_line

SWEEP_FILE = "deepen_sweep.json"
JOBS_DIR = "deepen_jobs"


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)  # atomic: the watcher never reads half a file


def read_outcomes(sweep_dir: Path) -> dict[int, dict]:
    out = {}
    for f in (sweep_dir / JOBS_DIR).glob("*.json"):
        stem = f.name[:-len(".json")]
        if stem.isdigit():
            out[int(stem)] = json.loads(f.read_text())
    return out


def watch(sweep_dir: Path, n: Optional[int], stop: threading.Event) -> None:
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
        from deepen_run.sweep_summary import child_tags  # the swept values: the runs table's columns

        return {"mlflow.parentRunId": self.info["parent_run_id"], "sweep_id": self.info["sweep_id"],
                "sweep_role": "child", "sweep_job": str(self.num)} | child_tags(self.info, self.overrides)

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
        write_json(self.jobs / f"{self.num}.start.json", {"overrides": self.overrides})
        if not cfg.tracking.run_name:
            from deepen_run.sweep_summary import child_name  # short, the swept values first

            cfg.tracking.run_name = child_name(run_name(cfg), cfg.seed, self.info, self.overrides)
        name = run_name(cfg)
        try:
            score = float(run_fn(cfg, tags=self.tags()))
        except KeyboardInterrupt as e:  # the run ended KILLED with a checkpoint
            write_json(self.jobs / f"{self.num}.json", {"status": "KILLED", "name": name, "error": str(e),
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
            write_json(self.jobs / f"{self.num}.json", {"status": "FAILED", "name": name, "error": line,
                                                         "seconds": time.time() - t0})
            return float("nan")
        write_json(self.jobs / f"{self.num}.json", {"status": "FINISHED", "name": name, "score": score,
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
