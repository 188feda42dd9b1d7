"""The job files in a sweep dir, the one channel every process of a sweep shares, and their tally.

Each job reads the sweep's identity from <sweep dir>/deepen_sweep.json and writes its start and its
outcome to deepen_jobs/<num>.start.json and <num>.json. The launching process watches them (a line
as each job starts and ends) and counts them into the parent's metrics (sweep/finished, ...: columns
of the runs table), each time a job ends and when the sweep ends.
"""
from __future__ import annotations

import json
import os
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Callable, Optional

from deepen_run.masking import mask_override
from deepen_run.run.clean import JOBS_DIR, SWEEP_FILE
from deepen_run.util import first_line


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)  # atomic: the watcher never reads half a file


def previous(sweep_dir: Path) -> Optional[dict]:
    """The sweep's identity (<sweep dir>/deepen_sweep.json), None where the dir holds no sweep."""
    f = sweep_dir / SWEEP_FILE
    return json.loads(f.read_text()) if f.is_file() else None


def read_jobs(sweep_dir: Path, suffix: str = ".json") -> dict[int, dict]:
    """Job number -> its outcome file (.json: how it ended) or its start file (.start.json, written
    in this attempt: its overrides, pid and run dir)."""
    out = {}
    for f in (sweep_dir / JOBS_DIR).glob(f"*{suffix}"):
        stem = f.name[:-len(suffix)]
        if stem.isdigit():
            out[int(stem)] = json.loads(f.read_text())
    return out


def start_line(num: int, n: Optional[int], overrides: list[str]) -> str:
    return f"[job {num + 1}/{n if n is not None else '?'}] started: {' '.join(map(mask_override, overrides))}"


class Counts:
    """How many jobs finished (those kept FINISHED from an earlier attempt of the sweep included), failed,
    were killed (by a signal, or in a process that died before the job ended), were kept, or are
    pending (neither started nor ended in this attempt), from the job files of `sweep_dir`."""

    def __init__(self, sweep_dir: Path, n: Optional[int], tracker, first_step: int = 0):
        self.dir, self.n_planned, self.tracker, self.step = sweep_dir, n, tracker, first_step
        self.update()

    def update(self, ended: bool = False) -> "Counts":
        """ended: the sweep is over, so a job that started and wrote no outcome died with its process."""
        self.outcomes = read_jobs(self.dir)
        self.unended = set(read_jobs(self.dir, ".start.json")) - set(self.outcomes) if ended else set()
        by = Counter(o["status"] for o in self.outcomes.values())
        self.finished, self.failed, self.killed = by["FINISHED"], by["FAILED"], by["KILLED"] + len(self.unended)
        self.kept = sum(bool(o.get("kept")) for o in self.outcomes.values())
        self.n = self.n_planned if self.n_planned is not None else len(self.outcomes) + len(self.unended)
        self.pending = max(0, self.n - self.finished - self.failed - self.killed)
        return self

    def metrics(self) -> dict[str, float]:
        scores = [o["score"] for o in self.outcomes.values() if o["status"] == "FINISHED" and o["score"] == o["score"]]
        return {"sweep/jobs": self.n, "sweep/finished": self.finished, "sweep/failed": self.failed,
                "sweep/killed": self.killed, "sweep/kept": self.kept, "sweep/pending": self.pending} \
            | ({"sweep/best_score": max(scores)} if scores else {})

    def log(self) -> None:
        """Each update at the next step: the runs table shows the latest, the history how it went."""
        self.tracker.log_metrics(self.metrics(), self.step)
        self.step += 1

    def line(self) -> str:
        kept = f" ({self.kept} kept from before)" if self.kept else ""
        return (f"{self.finished}/{self.n} jobs FINISHED{kept}, {self.failed} failed, {self.killed} killed, "
                f"{self.pending} not started")

    def which(self) -> str:
        out = [f"job {k + 1} ({o.get('error', o['status'])})" for k, o in sorted(self.outcomes.items())
               if o["status"] != "FINISHED"]
        return "; ".join(out + [f"job {k + 1} (its process died)" for k in sorted(self.unended)])

    def with_checkpoint(self) -> int:
        """Of the killed jobs, how many left a checkpoint to continue from (the rest start again)."""
        from deepen_run.run.checkpoint import latest

        starts = read_jobs(self.dir, ".start.json")
        killed = [k for k, o in self.outcomes.items() if o["status"] == "KILLED"] + sorted(self.unended)
        return sum(latest(Path(starts.get(k, {}).get("home") or self.dir / str(k))) is not None for k in killed)


def watch(counts: Counts, stop: threading.Event, on_end: Callable[[], object]) -> None:
    """Print '[job k/N] ...' when a job starts and when it ends, whichever process ran it; the parent's
    counts, then on_end() (the run note), follow each end. A job in this process (the basic launcher)
    prints its own start line: polled, it would come after the job's first lines."""
    sweep_dir, n, seen = counts.dir, counts.n_planned, set()
    total = n if n is not None else "?"
    while True:
        done = stop.is_set()
        ended = False
        for f in sorted((sweep_dir / JOBS_DIR).glob("*.json"), key=lambda p: p.stat().st_mtime):
            if f.name in seen:
                continue
            seen.add(f.name)
            num, _, kind = f.name.partition(".")
            d = json.loads(f.read_text())
            k = f"[job {int(num) + 1}/{total}]"
            ended = ended or kind == "json"
            if kind == "start.json":
                if d.get("pid") != os.getpid():
                    print(start_line(int(num), n, d["overrides"]), flush=True)
            elif d["status"] == "FINISHED":
                said = "a dry run: no eval/score" if d.get("dry_run") else f"eval/score={d['score']:.4f}"
                print(f"{k} kept: {d['name']} FINISHED before  {said}" if d.get("kept") else
                      f"{k} FINISHED {d['name']}  {said}  ({d['seconds']:.0f} s)", flush=True)
            else:
                print(f"{k} {d['status']} {d['name']}  {d['error']}  ({d['seconds']:.0f} s)", flush=True)
        if ended and not done:  # at the end, Launch.close writes both itself
            try:
                counts.update().log()
                on_end()
            except Exception as e:  # noqa: BLE001 (the store may be what failed; the note is a view: the sweep goes on)
                print(f"deepen-run: warning: the sweep's counts or run note were not updated: {first_line(e)}",
                      file=sys.stderr)
        if done:
            return
        stop.wait(0.5)
