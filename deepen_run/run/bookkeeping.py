"""What the training loop keeps track of around its steps, so that fit (deepen_run/run/train.py)
reads as the recipe: the running loss logged at log_every, the progress bar, the step-rate warning
of a long run, the sampling probabilities of a new epoch, the evaluation cadence, the periodic
checkpoint, and early stopping on the dev score (EarlyStop, train.early_stopping_patience, as the
Trainer's EarlyStoppingCallback; docs/configuration.md says what the run records). Its counter lives
in the checkpoint's trainer_state.json (the Checkpointer's `extra`), so a resumed run counts on where
it was, and a run killed after it stopped resumes to its tail, not to more training."""
from __future__ import annotations

import math
import sys
import time

import torch

from deepen_run.data import metrics as glue_metrics
from deepen_run.run.progress import TaskLosses, progress
from deepen_run.util import phase

LONG_RUN_S = 3600  # a run the measured step rate puts past this gets a warning with ways to cut it
TIMED_STEPS = 5  # steps timed for that estimate, after the first (which pays for warm-up)


def long_run_warning(seconds_per_step: float, steps_left: int) -> str | None:
    """The line a long run prints after its first steps, or None for a run of under an hour."""
    left = seconds_per_step * steps_left
    if left < LONG_RUN_S:
        return None
    h, m = divmod(round(left / 60), 60)
    return (f"deepen-run: this run needs about {h} h {m:02d} min more at {seconds_per_step:.2f} s/step "
            f"({steps_left:,} steps to go, evaluation not counted); to cut it, train on a subset "
            "(data.max_train_samples=2000) or fewer steps (train.max_steps=300)")


def log_run_records(r) -> None:
    """Before the first step: the N_i the sampler uses (what is trained on, after train_fraction /
    max_train_samples) on a fresh run, and a multi-task run's sampling probabilities as a table and
    a figure."""
    data, tracker = r.data, r.tracker
    if r.start == 0:
        tracker.log_metrics({f"data/train_examples/{t}": len(d.train) for t, d in data.items()}, 0)
    if len(data) > 1:
        from deepen_run.figures import sampling_plot  # matplotlib: 0.5 s of imports a single-task run skips

        table = r.sampler.table()
        tracker.log_csv(table, "sampling/probabilities.csv")
        tracker.log_figure(sampling_plot(table, list(data)), "sampling/probabilities.png")


class Bookkeeping:
    """One fit's counters: built after early stopping has set the run's last step (r.total)."""

    def __init__(self, r):
        self.r, self.tcfg, self.acc = r, r.cfg.train, r.accelerator
        # The loss since the last log line, on the device; a checkpoint keeps each rank's (loss_state),
        # so a run resumed from a step between two log lines logs the loss an uninterrupted run logs.
        saved = r.saver.restored_local.get("loss") or {"sum": 0.0, "seen": 0}
        self.running = torch.tensor(saved["sum"], dtype=torch.float32, device=self.acc.device)
        self.seen = saved["seen"]
        r.saver.local["loss"] = self.loss_state
        self.by_task = TaskLosses()
        # A resumed run logs the sampling probabilities of its epoch only if it starts a new one.
        self.epoch = r.sampler.epoch_of(r.start - 1) if r.start else None
        self.bar = progress(r.total, r.start, disable=not self.acc.is_main_process)
        self.step_time = 0.0  # seconds in training steps (forward, backward, update), without logging and evaluation
        self.imports = None  # the metric imports' thread, started after the first step
        self.t_timed = 0.0

    def loss_state(self) -> dict:
        """What a checkpoint keeps of the running loss (read when one is saved: a host sync then only)."""
        return {"sum": float(self.running), "seen": self.seen}

    def begin(self, step: int) -> float:
        """Before a step: a new epoch's sampling probabilities (multi-task). -> the step's start time."""
        started, r = time.perf_counter(), self.r
        if r.sampler.epoch_of(step) != self.epoch and len(r.streams) > 1:
            self.epoch = r.sampler.epoch_of(step)
            r.tracker.log_metrics({f"sampling/p/{t}": p for t, p in r.sampler.probs(self.epoch).items()}, step)
        return started

    def add(self, task: str, part: torch.Tensor, weight: float) -> None:
        """One micro-batch's loss (already divided by the accumulation steps)."""
        self.running += part
        self.by_task.add(task, part, weight)

    def end(self, step: int, started: float) -> int:
        """After a step: the bar, the phases, the loss at log_every, the checkpoint. -> the steps done."""
        r, acc = self.r, self.acc
        self.step_time += time.perf_counter() - started
        self.seen += 1
        done = step + 1
        r.saver.step = done  # the state is now step `done`'s, whatever fails before on_step
        self.bar.update(1)
        if done == r.start + 1:
            phase("first_step")
            self.imports = glue_metrics.preload()  # ready for the first evaluation
            self.t_timed = time.perf_counter()
        elif done == r.start + 1 + TIMED_STEPS and acc.is_main_process:
            warn = long_run_warning((time.perf_counter() - self.t_timed) / TIMED_STEPS, r.total - done)
            if warn:
                self.bar.write(warn, file=sys.stderr)  # above the bar in a terminal
        if done % self.tcfg.log_every == 0 or done == r.total:
            self.log_loss(step, done)
        r.saver.on_step(done)  # a periodic checkpoint; a stop asked during the step acts here, saved
        if done == r.total:
            phase("steps")
        return done

    def log_loss(self, step: int, done: int) -> None:
        r = self.r
        # Averaged on the device; read back (a host sync) only at logging cadence. With several
        # processes, the mean over all of them (every rank reaches this line at the same step).
        mean = self.acc.reduce(self.running / self.seen, reduction="mean").item()
        r.tracker.log_metrics({"train/loss": mean, "train/lr": r.scheduler.get_last_lr()[0],
                               "train/epoch": r.sampler.epoch_of(step)}, done)
        shown = self.by_task.line()  # each task's own mean (the console only)
        self.bar.set_postfix(loss=shown if len(r.streams) > 1 else f"{mean:.4f}")
        self.running.zero_()
        self.seen = 0

    def evaluates_at(self, done: int) -> bool:
        """eval_every, once an epoch (train.eval_per_epoch, any length), and the last step."""
        t = self.tcfg
        return (t.eval_every > 0 and done % t.eval_every == 0) or done == self.r.total or \
            (t.eval_per_epoch and done % self.r.sampler.steps_per_epoch == 0)

    def close(self) -> None:
        r = self.r
        self.bar.close()
        if r.total > r.start:
            r.tracker.log_metrics({"train/step_time_s": self.step_time / (r.total - r.start)}, r.total)

    def join(self) -> None:
        if self.imports is not None:  # a run that fails right after its first step: no import left running
            self.imports.join()


class EarlyStop:
    def __init__(self, tcfg, saver):
        self.patience = tcfg.get("early_stopping_patience")
        self.threshold = float(tcfg.get("early_stopping_threshold") or 0.0)
        self.saver = saver
        # The checkpoint's dict, filled in place: saved with every checkpoint, restored on resume.
        fresh = {"best": -math.inf, "best_step": None, "waited": 0, "stopped_at": None}
        self.state = saver.extra.setdefault("early_stop", fresh) if self.patience is not None else fresh

    @property
    def stopped_at(self):
        return self.state["stopped_at"]

    def update(self, score: float, step: int, total: int) -> bool:
        """After the evaluation at `step`: True when the run should end here (never at its last step).
        A checkpoint of this step, saved just before the evaluation, gets the new count when the
        evaluation is done (Checkpointer.evaluated_at)."""
        s = self.state
        if self.patience is None:
            return False
        if score == score and score > s["best"] + self.threshold:  # NaN never improves
            s.update(best=score, best_step=step, waited=0)
            return False
        s["waited"] += 1
        if s["waited"] < self.patience or step >= total:
            return False
        s["stopped_at"] = step
        return True

    def record(self, tracker, total: int, write) -> int:
        """Say so (write: the progress bar's write) and record the stopped step; -> the run's new last step."""
        s = self.state
        best = f"{s['best']:.4f} (step {s['best_step']})" if s["best_step"] is not None else "none yet"
        write(f"deepen-run: early stopping at step {s['stopped_at']} of {total}: eval/score has not improved "
              f"on its best, {best}, for {s['waited']} evaluations (train.early_stopping_patience={self.patience})")
        tracker.set_tags({"early_stopped_step": str(self.stopped_at)})
        tracker.log_metrics({"train/early_stopped_step": self.stopped_at}, self.stopped_at)
        return self.stopped_at
