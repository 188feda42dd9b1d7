"""The training recipe, top to bottom, in two parts (as torchtune's recipes): setup fills the run's
state (run/context.py RunState) with data, loaders, the task sampler, optimizer, schedule, Accelerate's
placement and a resumed checkpoint; fit is the loop (single-task batches drawn by the schedule, one
train_step each, evaluation at eval_every / once an epoch / at the end), then final_record. The
counters around the steps are run/bookkeeping.py's. No trainer class and no callbacks; the method has
already decided what trains (requires_grad), and the loop never asks which method it runs.
"""
from __future__ import annotations

import sys
import time
from typing import Iterator

import torch

from deepen_run.model import backbone as bb
from deepen_run.run import checkpoint as ck
from deepen_run.data import loaders as gd
from deepen_run.model import steps as backbone_steps
from deepen_run.run import submission
from deepen_run.run.context import RunState
from deepen_run.errors import NonFiniteLoss
from deepen_run.run.evaluation import Evaluation, batch_inputs, evaluate, record, warn_undefined
from deepen_run.run.fast import use_dropout_masks, use_unpad
from deepen_run.run.bookkeeping import Bookkeeping, EarlyStop, log_run_records
from deepen_run.run.optim import optimizer_for, optimizer_impl, scheduler_for
from deepen_run.run.threads import set_threads
from deepen_run.run.stop import check
from deepen_run.methods import hook
from deepen_run.model.heads import task_loss
from deepen_run.data.sampling import TaskSampler, epoch_length, total_steps
from deepen_run.util import phase


def forever(loader) -> Iterator[dict]:
    """Cycle a loader; each pass reshuffles (its generator moves on)."""
    while True:
        yield from loader


def setup(r: RunState) -> RunState:
    """Data and loaders, the backbone steps' and the method's after_build records, the task sampler,
    optimizer and schedule, Accelerate's device placement, then the checkpoint of r.resume_home
    (a killed run's dir), if any: filled into r."""
    cfg, tcfg, accelerator = r.cfg, r.cfg.train, r.accelerator
    r.tokenizer = tok = bb.load_tokenizer(cfg.backbone)
    # Rank 0 tokenizes and fills the cache first; the other ranks then read it instead of racing.
    with accelerator.main_process_first():
        for t in r.tasks:  # a stop waits for the task being tokenized (minutes for QQP or MNLI, once)
            check()
            r.data[t.name] = gd.load_task(t, cfg.data, tok, cfg.seed, with_test=cfg.predict)
    loaders = {t: gd.make_loader(d.train, tok, tcfg.batch_size, True, cfg.seed + i, cfg.data.group_by_length,
                                 cfg.data.num_workers) for i, (t, d) in enumerate(r.data.items())}
    dev = {name: gd.eval_loader(ds, tok, tcfg.eval_batch_size)
           for d in r.data.values() for name, ds in d.dev.items()}
    r.eval_specs = {name: d.spec for d in r.data.values() for name in d.dev}
    backbone_steps.record(r.model.backbone, r)
    hook(r.method, "after_build")(r.model, r)

    per_pass = sum(len(dl) for dl in loaders.values()) // tcfg.gradient_accumulation_steps
    steps_per_epoch, r.total = epoch_length(tcfg, len(r.tasks), per_pass), total_steps(tcfg, len(r.tasks), per_pass)
    r.sampler = TaskSampler(cfg.schedule, {t: len(d.train) for t, d in r.data.items()}, steps_per_epoch, r.total,
                            cfg.seed)

    swapped = use_dropout_masks(r.model, r.compute)  # after the method's hooks: its own dropouts too
    unpadded = use_unpad(r.model, r.compute)
    optimizer = optimizer_for(r.model, tcfg, accelerator.device.type, r.new_params)
    kernel = optimizer_impl(tcfg.get("optimizer_impl", "auto"), accelerator.device.type)
    r.tracker.log_params(set_threads() | r.compute.params() | unpadded |  # the threads, compute choices and why
                         {"train/optimizer_impl": kernel, "train/dropout_masks_in": ",".join(swapped) or "-"})
    scheduler = scheduler_for(optimizer, tcfg, r.total, accelerator.num_processes)
    r.model, r.optimizer, r.scheduler = accelerator.prepare(r.model, optimizer, scheduler)
    loaders = {k: accelerator.prepare(v) for k, v in loaders.items()}
    r.saver = ck.Checkpointer(r.home, tcfg, accelerator, r.total, predict=cfg.predict)
    r.streams = r.saver.wrap(loaders, {t: cfg.seed + i for i, t in enumerate(r.data)})
    r.start = r.saver.restore(ck.usable(r.resume_home) if r.resume_home else None)
    r.dev = {k: accelerator.prepare(v) for k, v in dev.items()}
    return r


def fit(r: RunState) -> dict:
    """Steps [start, total), then the final record. Returns the final evaluation's eval/* metrics."""
    log_run_records(r)
    t0, gas = time.time(), r.cfg.train.gradient_accumulation_steps
    batches = {t: forever(s) for t, s in r.streams.items()}
    r.model.train()
    stopper = EarlyStop(r.cfg.train, r.saver)  # train.early_stopping_patience
    if stopper.stopped_at:  # resumed after it had stopped early: only the tail is left
        r.total = stopper.stopped_at
    book, last = Bookkeeping(r), None
    try:  # a stop (Stopped) or a lost store ends the run through RunRecord, which saves the last step
        if r.start and book.evaluates_at(r.start) and r.saver.evaluated != r.start:
            # Resumed from a checkpoint saved before its step's evaluation (the signal that stopped
            # the run came during that step, or a kill during the evaluation): make it now.
            last = evaluate_at(r, book, stopper, r.start)
        for step in range(r.start, r.total):
            started = book.begin(step)
            task = r.sampler.task(step)
            for _ in range(gas):
                book.add(task, train_step(r, task, next(batches[task]), step) / gas, 1 / gas)
            done = book.end(step, started)
            if book.evaluates_at(done):
                last = evaluate_at(r, book, stopper, done)
                if done == r.total:
                    break  # the last step, or early stopping ended the run here
        book.close()
        # A signal after the last step's check (the final evaluation's logging, the bar): stopped here, saved.
        check(r.accelerator)
        return final_record(r, last, t0)
    finally:
        book.join()


def evaluate_at(r: RunState, book: Bookkeeping, stopper: EarlyStop, step: int) -> Evaluation:
    """The loop's evaluation at `step`, counted by early stopping (which may end the run here: r.total
    becomes `step`), then marked done in the checkpoint of `step`."""
    book.join()  # the metric imports end first (glue_metrics.preload says why)
    last = evaluate_and_keep(r, step)
    score = last.flat.get("eval/score", float("nan"))
    book.bar.set_postfix(score=f"{score:.4f}")
    if stopper.update(score, step, r.total):
        r.total = stopper.record(r.tracker, r.total, lambda m: r.accelerator.is_main_process and
                                 book.bar.write(m, file=sys.stderr))
    r.saver.evaluated_at(step)
    return last


def final_record(r: RunState, last: Evaluation | None, t0: float) -> dict:
    """After the last step: its evaluation (made now if a resume starts at the last step), the best
    weights if model_selection=best, the record, the test-set submission, the after_train hook.
    The tail may be stopped too: the checkpoint of the last step saved on the way out lets
    resume=auto complete this same run."""
    ev = last or evaluate_and_keep(r, r.total)
    if r.cfg.train.model_selection == "best":
        ev = select_best(r, ev)
    phase("eval")
    r.tracker.log_metrics({"train/runtime_s": time.time() - t0}, r.total)
    record(r.tracker, r.data, ev, r.total)
    if r.cfg.predict:
        rows = submission.write(r.model, r.accelerator, r.tracker, r.data, r.tokenizer,
                                r.cfg.train.eval_batch_size)
        r.accelerator.print("submission/: " + "  ".join(f"{stem}.tsv {n} rows" for stem, n in rows.items()) +
                            f"; {submission.ZIP}: {submission.missing_line(rows)}")
    r.evaluation = ev  # what after_train reads
    backbone_steps.after_train(r.accelerator.unwrap_model(r.model).backbone, r)  # e.g. DWA's weights (#59)
    hook(r.method, "after_train")(r.accelerator.unwrap_model(r.model), r)
    phase("recorded")
    return ev.flat


def train_step(r: RunState, task: str, batch: dict, step: int) -> torch.Tensor:
    """One micro-batch: forward, loss, backward, and (once Accelerate's accumulation is complete)
    clipping and the optimizer and schedule steps. Returns the detached loss."""
    acc, tcfg = r.accelerator, r.cfg.train
    with acc.accumulate(r.model):
        logits = r.model(task, **batch_inputs(batch)).logits
        loss = task_loss(logits, batch["labels"], r.data[task].spec.is_regression)
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


def select_best(r: RunState, ev: Evaluation) -> Evaluation:
    """train.model_selection=best: the weights of the best evaluation back in the model and evaluated
    again; that evaluation is the run's result, logged at the last step after the final one (MLflow's
    latest value at a step is the last logged), as the Trainer's load_best_model_at_end then evaluate."""
    step = r.saver.best_step
    r.tracker.set_tags({"selected_step": str(step)})
    if step is None or step == r.total:
        return ev  # the last evaluation is the best: the model holds its weights
    r.saver.load_best(r.accelerator.unwrap_model(r.model))
    ev = evaluate(r.model, r.accelerator, r.dev, r.eval_specs)
    # again: a resumed run's killed attempt may have logged the last step's own evaluation already
    r.tracker.log_metrics(ev.flat | {"eval/best_score": r.saver.best}, r.total, again=True)
    return ev


def evaluate_and_keep(r: RunState, step: int) -> Evaluation:
    """The loop's evaluation at `step` (a stop acts between its batches): evaluate, keep the best
    weights, log eval/* (and warn once of an undefined metric)."""
    ev = evaluate(r.model, r.accelerator, r.dev, r.eval_specs)
    warn_undefined(ev.results, r.undefined, r.tracker, r.accelerator)
    r.saver.save_best(r.model, step, ev.flat["eval/score"])
    r.tracker.log_metrics(ev.flat | {"eval/best_score": r.saver.best}, step)
    return ev
