"""Early stopping on the dev score (train.early_stopping_patience), as the Trainer's
EarlyStoppingCallback; docs/configuration.md, section Training, says what the run records. The
counter lives in the checkpoint's trainer_state.json (the Checkpointer's `extra`), so a resumed run
counts on where it was, and a run killed after it stopped resumes to its tail, not to more training.
"""
from __future__ import annotations

import math


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
