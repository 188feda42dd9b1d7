"""A sweep's state at a glance: how many of its jobs finished, failed, were killed, were kept from
an earlier attempt, or are pending. Logged to the parent run as metrics (sweep/finished, ...), so
they are columns of the MLflow runs table, each time a job ends and when the sweep ends.

finished counts every FINISHED child, the kept ones included (kept: FINISHED by an earlier attempt
of the sweep, not trained again on resume=auto). killed: stopped by a signal, or started in a process
that died before the job ended. pending: neither started nor ended in this attempt.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable, Optional


class Counts:
    def __init__(self, n: Optional[int], tracker, first_step: int = 0):
        self.n_planned, self.tracker, self.step = n, tracker, first_step
        self.update({})

    def update(self, outcomes: dict[int, dict], unended: Iterable[int] = ()) -> "Counts":
        self.outcomes, self.unended = dict(outcomes), set(unended) - set(outcomes)
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
        """The jobs that did not finish, and why."""
        out = [f"job {k + 1} ({o.get('error', o['status'])})" for k, o in sorted(self.outcomes.items())
               if o["status"] != "FINISHED"]
        return "; ".join(out + [f"job {k + 1} (its process died)" for k in sorted(self.unended)])

    def with_checkpoint(self, sweep_dir: Path) -> int:
        """Of the killed jobs, how many left a checkpoint to continue from (the rest start again)."""
        from deepen_run.run.checkpoint import latest
        from deepen_run.sweep.outcomes import read_starts

        homes = {k: Path(s.get("home") or sweep_dir / str(k)) for k, s in read_starts(sweep_dir).items()}
        killed = [k for k, o in self.outcomes.items() if o["status"] == "KILLED"] + sorted(self.unended)
        return sum(latest(homes.get(k, sweep_dir / str(k))) is not None for k in killed)
