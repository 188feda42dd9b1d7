"""Checkpoints (docs/reliability.md, sections Checkpoints and Resume): every train.save_every steps
checkpoints/step-<N>/ holds accelerator.save_state's files (loaded back with weights_only=True) and
trainer_state.json (step, batches consumed per task, best score, the evaluation it counts) and each
rank's loop_state_<rank>.json (its running loss); the last
train.save_total_limit are kept. checkpoints/best/ holds the best eval/score's weights (keeps_best).
Each is filled in a hidden temporary folder and renamed, so a crash never leaves half a checkpoint.

Exactness on resume: the task of step s is keyed by (seed, s) (data/sampling.py), each task's loader
reshuffles epoch e from (seed, e) and skips the batches already consumed (accelerate's
skip_first_batches: indices only), and accelerator.load_state brings back optimizer, scheduler and RNG.
"""
from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path
from typing import Optional

from deepen_run.data.stream import TaskStream
from deepen_run.errors import UserError
from deepen_run.safe_fs import shared_mode
from deepen_run.run.stop import check

STATE = "trainer_state.json"
# Accelerate's save_model logs "Model weights saved in .../.best.tmp/pytorch_model.bin": the wrong file
# name (it writes model.safetensors) in a folder renamed right after. Not worth a line.
logging.getLogger("accelerate.accelerator").addFilter(lambda r: "Model weights saved" not in r.getMessage())

LOCAL = "loop_state_{}.json"  # a rank's own state (its running loss)


def steps_of(folder: Path) -> list[tuple[int, Path]]:
    ckpts = folder / "checkpoints"
    found = [(int(p.name[5:]), p) for p in ckpts.glob("step-*") if p.name[5:].isdigit() and (p / STATE).is_file()]
    return sorted(found)


def latest(home: Path) -> Optional[Path]:
    return next((p for _, p in reversed(steps_of(home))), None)


def damage(ckpt: Path) -> Optional[str]:
    """Why this checkpoint cannot be loaded, or None if it looks whole. Cheap (safetensors reads the
    headers only, no tensor), so a resume checks before Accelerate loads it and crashes half-way."""
    names = {p.name for p in ckpt.iterdir()} if ckpt.is_dir() else set()
    weights = sorted(n for n in names if n.endswith(".safetensors"))
    if not weights:
        return "model.safetensors is missing"
    for need in ("optimizer.bin", "scheduler.bin"):
        if need not in names or (ckpt / need).stat().st_size == 0:
            return f"{need} is missing or empty"
    from safetensors import SafetensorError, safe_open

    for name in weights:
        try:  # safetensors checks the header and that its tensors cover the file exactly
            with safe_open(str(ckpt / name), "pt"):
                pass
        except (SafetensorError, OSError) as e:
            return f"{name} is truncated or damaged ({e})"
    return None


def usable(home: Path, report=None) -> Optional[Path]:
    """The latest whole checkpoint of a run dir; each damaged later one is passed to report(line)."""
    for _, ckpt in reversed(steps_of(home)):
        why = damage(ckpt)
        if why is None:
            return ckpt
        if report is not None:
            report(f"checkpoint {ckpt} is damaged ({why}); trying the one before")
    return None


def rotate(home: Path, step: int, limit: int) -> None:
    """After saving `step`: keep the newest `limit` checkpoints up to it. Any later one is left from
    before a resume (a damaged one the resume skipped, or one of an attempt that got further): this
    run trains those steps again, and counted among the newest it would push out the one saved now."""
    found = steps_of(home)
    kept = [p for s, p in found if s <= step][-limit:]
    for _, p in found:
        if p not in kept:
            shutil.rmtree(p, ignore_errors=True)


def recover_best(home: Path) -> None:
    """What a kill inside Checkpointer._write left: best/ caught between its two renames (.best.old)
    is put back; a half-filled .<name>.tmp and a step's superseded .step-N.old only hold disk."""
    ckpts = home / "checkpoints"
    if not (ckpts / "best").exists() and (ckpts / ".best.old").is_dir():
        (ckpts / ".best.old").rename(ckpts / "best")
    # Only the folders Checkpointer._write names (.step-N / .best, .tmp / .old): nothing else is ours.
    for p in [*ckpts.glob(".step-*.tmp"), *ckpts.glob(".step-*.old"), ckpts / ".best.tmp", ckpts / ".best.old"]:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)


def keeps_best(tcfg, total: int, predict: bool = False) -> bool:
    """train.save_best: true/false force it; null (auto) keeps the best weights (~90 MB for MiniLM,
    ~420 MB for BERT-base) only where they are worth the disk: a long run (more steps than
    save_every) or a predict=true run. Short runs and sweep jobs keep none: their record is in MLflow."""
    if tcfg.model_selection == "best":
        return True  # the final record is made from these weights
    if tcfg.save_best is not None:
        return bool(tcfg.save_best)
    return predict or 0 < tcfg.save_every < total


class Checkpointer:
    """Saves at save_every and the best weights; restores a resumed run. A stopped run's last step is
    saved by its record (run/record.py RunRecord), the one place that does it."""

    def __init__(self, home: Optional[Path], tcfg, accelerator, total: int, predict: bool = False):
        if home is None and tcfg.model_selection == "best":
            raise UserError("train.model_selection=best keeps the best weights in the run dir; this run has none")
        self.root = home / "checkpoints" if home is not None else None
        if self.root is not None and accelerator.num_processes > 1:  # rank 0's: the others run in scratch
            from accelerate.utils import broadcast_object_list  # dirs, and their RNG states belong here too

            self.root = broadcast_object_list([self.root])[0]
        self.every = tcfg.save_every if home is not None else 0
        self.keep_best = home is not None and keeps_best(tcfg, total, predict)
        self.limit, self.acc, self.total, self.step, self.saved_step = tcfg.save_total_limit, accelerator, total, 0, -1
        self.streams: dict[str, TaskStream] = {}
        self.evaluated = None  # the last step whose evaluation is in the state (a resume redoes a missing one)
        self.best, self.best_step = -math.inf, None
        # More of the loop's state to save and restore: a value, or a function that gives it when a
        # checkpoint is written; extra (early stopping's counter) in trainer_state.json, local (the
        # running loss) in each rank's own file, as Accelerate keeps each rank's RNG states.
        self.extra, self.local, self.restored_local = {}, {}, {}

    def wrap(self, loaders: dict, seeds: dict) -> dict:
        self.streams = {t: TaskStream(dl, seeds[t]) for t, dl in loaders.items()}
        return self.streams

    def restore(self, ckpt: Optional[Path]) -> int:
        """Load a checkpoint into the prepared model, optimizer and scheduler. -> its step."""
        if ckpt is None:
            return 0
        if self.acc.is_main_process:
            recover_best(ckpt.parent.parent)
        self.acc.wait_for_everyone()
        self.acc.load_state(str(ckpt))
        # A checkpoint is taken between steps, where the accumulation count starts afresh; one saved
        # before sync_with_dataloader was off may hold a count that a loader's end had shifted.
        self.acc.step = 0
        st = json.loads((ckpt / STATE).read_text())
        for t, n in st["consumed"].items():
            self.streams[t].consumed = n
        self.step = self.saved_step = st["step"]
        self.best, self.best_step = st.get("best_score", -math.inf), st.get("best_step")
        self.extra = st.get("extra", {})
        mine = ckpt / LOCAL.format(self.acc.process_index)  # older checkpoints kept the loss in extra
        self.restored_local = json.loads(mine.read_text()) if mine.is_file() else {"loss": self.extra.pop("loss", None)}
        # Older checkpoints lack the key: with early stopping on, their state was rewritten after the
        # evaluation (counted, not to be made again); without it, the evaluation is missing.
        self.evaluated = st.get("evaluated", self.step if "early_stop" in self.extra else None)
        return self.step

    def _state(self, step: int) -> dict:
        return {"step": step, "consumed": {t: s.consumed for t, s in self.streams.items()},
                "best_score": self.best, "best_step": self.best_step, "evaluated": self.evaluated,
                "extra": {k: v() if callable(v) else v for k, v in self.extra.items()}}

    def _write(self, final: Path, fill) -> None:
        # Hidden while it fills: a reader that globs checkpoints/step-* (a script, a test) never finds
        # a half-written one; the rename below is what makes it a checkpoint.
        tmp, old = (final.with_name(f".{final.name}.{kind}") for kind in ("tmp", "old"))
        if self.acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.acc.wait_for_everyone()
        fill(tmp)
        self.acc.wait_for_everyone()
        if self.acc.is_main_process:
            # best/ is replaced: moved aside first, so a kill between the renames leaves .best.old,
            # which `recover_best` puts back, never no best weights at all.
            shutil.rmtree(old, ignore_errors=True)
            if final.exists():
                final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)

    def save(self, step: int) -> None:
        if self.root is None or step == self.saved_step:
            return

        def fill(tmp: Path):
            self.acc.save_state(str(tmp), safe_serialization=True)
            (tmp / LOCAL.format(self.acc.process_index)).write_text(json.dumps({k: v() for k, v in self.local.items()}))
            if self.acc.is_main_process:
                (tmp / STATE).write_text(json.dumps(self._state(step)))

        self._write(self.root / f"step-{step}", fill)
        self.saved_step = step
        if self.acc.is_main_process:
            rotate(self.root.parent, step, self.limit)

    def evaluated_at(self, step: int) -> None:
        """The evaluation of `step` is recorded (metrics logged, best weights kept, early stopping
        counted). A checkpoint of `step` is saved before that evaluation: its state is rewritten
        to count it, so a resume neither loses it nor, once counted, makes it again."""
        self.evaluated = step
        path = self.root / f"step-{step}" / STATE if self.root is not None else None
        if step == self.saved_step and self.acc.is_main_process and path is not None and path.is_file():
            tmp = path.with_name(STATE + ".tmp")
            tmp.write_text(json.dumps(self._state(step)))
            tmp.replace(path)  # atomic: a kill leaves the old state or the new one

    def save_best(self, model, step: int, score: float) -> None:
        if score <= self.best:
            return
        self.best, self.best_step = score, step
        if not self.keep_best:
            return

        def fill(tmp: Path):
            self.acc.save_model(model, str(tmp), safe_serialization=True)
            if self.acc.is_main_process:  # rank 0 wrote the weights
                shared_mode(tmp)  # safetensors writes 0600: the kept weights are as readable as the rest
                (tmp / STATE).write_text(json.dumps(self._state(step)))

        self._write(self.root / "best", fill)

    def load_best(self, model) -> None:
        """The kept best weights into `model` (unwrapped; train.model_selection=best). safetensors'
        load_model: a tensor shared by several modules is stored once, under one of its names."""
        from safetensors.torch import load_model

        try:
            load_model(model, self.root / "best" / "model.safetensors", strict=True, device=str(self.acc.device))
        except RuntimeError as e:
            raise RuntimeError(f"checkpoints/best does not fit the model: {e}") from None

    def on_step(self, done: int) -> None:
        """After each step: periodic save, then a stop asked during the step raises Stopped here."""
        self.step = done
        if self.every and done % self.every == 0 and done < self.total:
            self.save(done)
        check(self.acc)

