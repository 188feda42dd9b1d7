"""The training recipe, top to bottom, in two parts (as torchtune's recipes: setup, then train):

  setup  tokenizer and data, loaders, the task sampler, optimizer and schedule, Accelerate's device
         placement, a resumed checkpoint -> a Recipe (the run's pieces)
  fit    the loop: single-task batches drawn by the schedule, one train_step each (its micro-batches),
         the loss logged at log_every, evaluation at eval_every / once an epoch / at the end, checkpoints
         at save_every; then the final record, the test-set submission, the method's after_train hook

No trainer class and no callbacks: the loop is in fit. The method has already decided what trains
(requires_grad); the loop never asks which method it runs.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any, Iterator

import torch

from deepen_run.model import backbone as bb
from deepen_run.run import checkpoint as ck
from deepen_run.data import loaders as gd
from deepen_run.data import metrics as glue_metrics
from deepen_run.model import steps as backbone_steps
from deepen_run.run import submission
from deepen_run.run.context import Run, RunContext
from deepen_run.run.early_stop import EarlyStop
from deepen_run.errors import NonFiniteLoss
from deepen_run.tracking.store import TrackingLost
from deepen_run.run.evaluation import Evaluation, eval_metrics, evaluate, record, warn_undefined
from deepen_run.run.fast import run_params
from deepen_run.run.lifecycle import guard
from deepen_run.run.optim import optimizer_for, scheduler_for  # noqa: F401 (part of this module's API)
from deepen_run.methods import hook
from deepen_run.model.heads import task_loss
from deepen_run.run.predict import batch_inputs
from deepen_run.run.progress import TaskLosses, progress, quiet_libraries
from deepen_run.data.sampling import TaskSampler, epoch_length
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


def forever(loader) -> Iterator[dict]:
    """Cycle a loader; each pass reshuffles (its generator moves on)."""
    while True:
        yield from loader


@dataclass
class Recipe:
    """A run's pieces, built once by setup(); fit() works on them."""
    cfg: Any  # the resolved config
    ctx: RunContext  # what the method's hooks read: tasks, data, tokenizer, tracker, accelerator
    method: ModuleType  # the method's model module (its optional after_train hook)
    model: torch.nn.Module  # prepared by Accelerate, as are optimizer and scheduler
    optimizer: torch.optim.Optimizer
    scheduler: Any
    accelerator: Any
    tracker: Any
    sampler: TaskSampler
    streams: dict  # task -> its endless, resumable batches (checkpoint.TaskStream)
    regression: dict  # task -> is it a regression task (the loss to use)
    dev: dict  # eval name -> prepared dev loader
    eval_specs: dict  # eval name -> TaskSpec
    saver: ck.Checkpointer
    total: int  # steps of the whole run
    start: int  # the first step to run: 0, or a resumed checkpoint's step
    undefined: list = field(default_factory=list)  # metrics already reported undefined (warned once)


def setup(cfg, run: Run) -> Recipe:
    """Data and loaders, the backbone steps' and the method's after_build records, the task sampler,
    optimizer and schedule, Accelerate's device placement, then the checkpoint of run.resume_home
    (a killed run's dir), if any."""
    tcfg, tasks, model, accelerator, tracker = cfg.train, run.tasks, run.model, run.accelerator, run.tracker
    tok = bb.load_tokenizer(cfg.backbone)
    quiet_libraries()
    # Rank 0 tokenizes and fills the cache first; the other ranks then read it instead of racing.
    with accelerator.main_process_first():
        data = {t.name: gd.load_task(t, cfg.data, tok, cfg.seed, with_test=cfg.predict) for t in tasks}
    loaders = {t: gd.make_loader(d.train, tok, tcfg.batch_size, True, cfg.seed + i, cfg.data.group_by_length,
                                 cfg.data.num_workers) for i, (t, d) in enumerate(data.items())}
    dev = {name: gd.eval_loader(ds, tok, tcfg.eval_batch_size)
           for d in data.values() for name, ds in d.dev.items()}
    ctx = RunContext(cfg, tasks, data, tok, tracker, accelerator)
    backbone_steps.record(model.backbone, ctx)
    hook(run.method, "after_build")(model, ctx)

    per_pass = sum(len(dl) for dl in loaders.values()) // tcfg.gradient_accumulation_steps
    steps_per_epoch = epoch_length(tcfg, len(tasks), per_pass)
    total = tcfg.max_steps if tcfg.max_steps > 0 else math.ceil(tcfg.num_epochs * steps_per_epoch)
    sampler = TaskSampler(cfg.schedule, {t: len(d.train) for t, d in data.items()}, steps_per_epoch, total, cfg.seed)

    optimizer = optimizer_for(model, tcfg, accelerator.device.type, run.new_params)
    tracker.log_params(run_params(tcfg, accelerator.device.type))
    scheduler = scheduler_for(optimizer, tcfg, total)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    loaders = {k: accelerator.prepare(v) for k, v in loaders.items()}
    saver = ck.Checkpointer(run.home, tcfg, accelerator, total, predict=cfg.predict)
    streams = saver.wrap(loaders, {t: cfg.seed + i for i, t in enumerate(data)})
    start = saver.restore(ck.usable(run.resume_home) if run.resume_home else None)
    dev = {k: accelerator.prepare(v) for k, v in dev.items()}
    return Recipe(cfg, ctx, run.method, model, optimizer, scheduler, accelerator, tracker, sampler, streams,
                  regression={t.name: t.is_regression for t in tasks}, dev=dev,
                  eval_specs={name: d.spec for d in data.values() for name in d.dev}, saver=saver, total=total,
                  start=start)


def fit(r: Recipe) -> float:
    """Steps [start, total), then the final record. Returns the final eval/score."""
    tcfg, acc, tracker, data = r.cfg.train, r.accelerator, r.tracker, r.ctx.data
    if r.start == 0:  # the N_i the sampler uses: what is trained on, after train_fraction / max_train_samples
        tracker.log_metrics({f"data/train_examples/{t}": len(d.train) for t, d in data.items()}, 0)
    if len(data) > 1:
        from deepen_run.figures import sampling_plot  # matplotlib: 0.5 s of imports a single-task run skips

        table = r.sampler.table()
        tracker.log_csv(table, "sampling/probabilities.csv")
        tracker.log_figure(sampling_plot(table, list(data)), "sampling/probabilities.png")

    t0 = time.time()
    batches = {t: forever(s) for t, s in r.streams.items()}
    r.model.train()
    running = torch.zeros((), device=acc.device)
    # A resumed run logs the sampling probabilities of its epoch only if it starts a new one.
    seen, last, epoch = 0, None, r.sampler.epoch_of(r.start - 1) if r.start else None
    stopper = EarlyStop(tcfg, r.saver)  # train.early_stopping_patience (deepen_run/run/early_stop.py)
    if stopper.stopped_at:  # resumed after it had stopped early: only the tail is left
        r.total = stopper.stopped_at
    bar = progress(r.total, r.start, disable=not acc.is_main_process)
    by_task = TaskLosses()
    step_time = 0.0  # seconds in training steps (forward, backward, update), without logging and evaluation
    imports = None  # the metric imports' thread, started after the first step
    signals = guard()
    try:
        with signals.deferred():  # signals wait for the end of the step, then save and stop
            for step in range(r.start, r.total):
                t_step = time.perf_counter()
                task = r.sampler.task(step)
                if r.sampler.epoch_of(step) != epoch and len(r.streams) > 1:
                    epoch = r.sampler.epoch_of(step)
                    tracker.log_metrics({f"sampling/p/{t}": p for t, p in r.sampler.probs(epoch).items()}, step)
                for _ in range(tcfg.gradient_accumulation_steps):
                    part = train_step(r, task, next(batches[task]), step) / tcfg.gradient_accumulation_steps
                    running += part
                    by_task.add(task, part, 1 / tcfg.gradient_accumulation_steps)
                step_time += time.perf_counter() - t_step
                seen += 1
                done = step + 1
                r.saver.step = done  # the state is now step `done`'s, whatever fails before on_step
                bar.update(1)
                if done == r.start + 1:
                    phase("first_step")
                    imports = glue_metrics.preload()  # ready for the first evaluation
                    t_timed = time.perf_counter()
                elif done == r.start + 1 + TIMED_STEPS and acc.is_main_process:
                    warn = long_run_warning((time.perf_counter() - t_timed) / TIMED_STEPS, r.total - done)
                    if warn:
                        bar.write(warn, file=sys.stderr)  # above the bar in a terminal
                if done % tcfg.log_every == 0 or done == r.total:
                    # Averaged on the device; read back (a host sync) only at logging cadence. With several
                    # processes, the mean over all of them (every rank reaches this line at the same step).
                    mean = acc.reduce(running / seen, reduction="mean").item()
                    tracker.log_metrics({"train/loss": mean, "train/lr": r.scheduler.get_last_lr()[0],
                                         "train/epoch": r.sampler.epoch_of(step)}, done)
                    shown = by_task.line()  # each task's own mean (the console only)
                    bar.set_postfix(loss=shown if len(r.streams) > 1 else f"{mean:.4f}")
                    running.zero_()
                    seen = 0
                r.saver.on_step(done)  # a periodic checkpoint; a deferred signal stops the run here, saved
                if done == r.total:
                    phase("steps")
                if (tcfg.eval_every > 0 and done % tcfg.eval_every == 0) or done == r.total or \
                        (tcfg.eval_per_epoch and done % r.sampler.steps_per_epoch == 0):  # once per epoch, any length
                    last = evaluate_and_keep(r, done)
                    bar.set_postfix(score=f"{last[0].get('eval/score', float('nan')):.4f}")
                    if stopper.update(last[0].get("eval/score", float("nan")), done, r.total):
                        # The run ends at this step: what follows records, selects and predicts here.
                        r.total = stopper.record(tracker, r.total, lambda m: acc.is_main_process and
                                                 bar.write(m, file=sys.stderr))
                        break
            bar.close()
            if r.total > r.start:
                tracker.log_metrics({"train/step_time_s": step_time / (r.total - r.start)}, r.total)
        # A signal after the last step's check (during the final evaluation's logging, the bar) waited
        # for a step end that will not come: it stops the run here, the last step saved.
        signals.raise_pending()
        final, ev = last or evaluate_and_keep(r, r.total)  # resumed from a checkpoint at the last step
        if tcfg.model_selection == "best":
            final, ev = select_best(r, final, ev)
        phase("eval")
        tracker.log_metrics({"train/runtime_s": time.time() - t0}, r.total)
        # The tail (final record, predictions, after_train) may be stopped too: the checkpoint of the
        # last step saved on the way out lets resume=auto complete this same run.
        record(tracker, data, ev, final, r.total)
        if r.cfg.predict:
            rows = submission.write(r.model, acc, tracker, data, r.ctx.tokenizer, tcfg.eval_batch_size)
            acc.print("submission/: " + "  ".join(f"{stem}.tsv {n} rows" for stem, n in rows.items()) +
                      f"; {submission.ZIP}: {submission.missing_line(rows)}")
        # after_train's context is built with the final evaluation it reads (the run's own stays as set up)
        hook(r.method, "after_train")(acc.unwrap_model(r.model), replace(r.ctx, evaluation=ev))
        phase("recorded")
    except (KeyboardInterrupt, TrackingLost):  # a signal, or the store gone: keep what resume=auto needs
        r.saver.on_interrupt()
        raise
    finally:
        if imports is not None:  # a run that fails right after its first step: no import left running
            imports.join()
    return final["eval/score"]


def train_step(r: Recipe, task: str, batch: dict, step: int) -> torch.Tensor:
    """One micro-batch: forward, loss, backward, and (once Accelerate's accumulation is complete)
    clipping and the optimizer and schedule steps. Returns the detached loss."""
    acc, tcfg = r.accelerator, r.cfg.train
    with acc.accumulate(r.model):
        logits = r.model(task, **batch_inputs(batch)).logits
        loss = task_loss(logits, batch["labels"], r.regression[task])
        # Stop before a NaN/inf reaches the weights (and a checkpoint). One host sync per
        # micro-batch: free on CPU, ~µs against a step of an encoder on GPU (HF Trainer's
        # nan filter pays the same).
        if not torch.isfinite(loss):
            raise NonFiniteLoss(f"training loss is {loss.item()} at step {step + 1} (task {task}); "
                                "lower train.learning_rate or check the data; the weights were not updated")
        acc.backward(loss)
        if acc.sync_gradients and tcfg.max_grad_norm > 0:
            acc.clip_grad_norm_(r.model.parameters(), tcfg.max_grad_norm)
        r.optimizer.step()
        r.scheduler.step()
        r.optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def evaluate_dev(r: Recipe) -> tuple[dict, Evaluation]:
    """Every dev set through the model: -> (flat eval/* metrics, the evaluation). Nothing else."""
    with guard().deferred(False):  # a signal during evaluation stops it at once
        ev = evaluate(r.model, r.accelerator, r.dev, r.eval_specs)
    return eval_metrics(ev.results, {name: s.name for name, s in r.eval_specs.items()}), ev


def select_best(r: Recipe, final: dict, ev: Evaluation) -> tuple[dict, Evaluation]:
    """train.model_selection=best: the weights of the best evaluation back in the model and evaluated
    again; that evaluation is the run's result, logged at the last step after the final one (MLflow's
    latest value at a step is the last logged), as the Trainer's load_best_model_at_end then evaluate."""
    step = r.saver.best_step
    r.tracker.set_tags({"selected_step": str(step)})
    if step is None or step == r.total:
        return final, ev  # the last evaluation is the best: the model holds its weights
    r.saver.load_best(r.accelerator.unwrap_model(r.model))
    flat, ev = evaluate_dev(r)
    # again: a resumed run's killed attempt may have logged the last step's own evaluation already
    r.tracker.log_metrics(flat | {"eval/best_score": r.saver.best}, r.total, again=True)
    return flat, ev


def evaluate_and_keep(r: Recipe, step: int) -> tuple[dict, Evaluation]:
    """The loop's evaluation at `step`: evaluate, keep the best weights, log eval/* (and warn once
    of an undefined metric). -> (flat metrics, evaluation)."""
    flat, ev = evaluate_dev(r)
    warn_undefined(ev.results, r.undefined, r.tracker, r.accelerator)
    r.saver.save_best(r.model, step, flat["eval/score"])
    r.tracker.log_metrics(flat | {"eval/best_score": r.saver.best}, step)
    return flat, ev
