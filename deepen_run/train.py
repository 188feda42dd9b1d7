"""The training loop: single-task batches drawn by the schedule, Accelerate for the device work.

No trainer class: one function that steps, logs at `log_every`, evaluates at `eval_every` and at
the end. The method has already decided what trains (requires_grad); the loop never asks which
method it runs.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator

import torch
from tqdm.auto import tqdm
from transformers import get_scheduler

from deepen_run import metrics as glue_metrics
from deepen_run.errors import NonFiniteLoss
from deepen_run.fast import fused_adamw_ok
from deepen_run.model import task_loss
from deepen_run.predict import batch_inputs, predict


def optimizer_for(model: torch.nn.Module, tcfg, device_type: str) -> torch.optim.Optimizer:
    """AdamW; no weight decay on biases and LayerNorm weights (every 1-D tensor). Fused kernel
    where torch has one (CUDA and CPU): one pass over all tensors instead of many small ops.

    One rule for every method, so a comparison between methods treats their new weights alike:
    every trainable parameter outside `model.backbone` (task heads, HIRE's GRUs and scorer, PALs)
    starts from scratch and trains at train.new_params_lr_scale x train.learning_rate; the
    backbone (its pretrained pooler and duplicated layers included) at 1x. The schedule then
    scales every group alike.
    """
    scale = tcfg.new_params_lr_scale
    pretrained = {id(p) for p in model.backbone.parameters()}
    groups: dict[tuple, list] = {}
    for p in model.parameters():
        if p.requires_grad:
            groups.setdefault((p.ndim >= 2, 1.0 if id(p) in pretrained else scale), []).append(p)
    params = [{"params": ps, "weight_decay": tcfg.weight_decay if decay else 0.0, "lr": tcfg.learning_rate * k}
              for (decay, k), ps in groups.items()]
    return torch.optim.AdamW(params, lr=tcfg.learning_rate, fused=fused_adamw_ok(device_type))


def scheduler_for(optimizer, tcfg, total_steps: int):
    warmup = int(round(tcfg.warmup_ratio * total_steps))
    return get_scheduler(tcfg.lr_scheduler, optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)


def forever(loader) -> Iterator[dict]:
    """Cycle a loader; each pass reshuffles (its generator moves on)."""
    while True:
        yield from loader


@torch.no_grad()
def evaluate(model, accelerator, dev_loaders: dict, specs: dict) -> tuple[dict, dict]:
    """dev_loaders: eval name -> loader; specs: eval name -> TaskSpec.

    Returns ({eval name: {metric: value}}, {eval name: predictions in dev order}).
    """
    model.eval()
    results, preds = {}, {}
    for name, loader in dev_loaders.items():
        preds[name], refs = predict(model, accelerator, loader, specs[name], labels=True, desc=f"eval {name}")
        results[name] = glue_metrics.compute(name, preds[name], refs)
    model.train()
    return results, preds


def eval_metrics(results: dict, task_of: dict) -> dict[str, float]:
    flat = {f"eval/{n}/{m}": v for n, ms in results.items() for m, v in ms.items()}
    flat["eval/score"] = glue_metrics.glue_score(results, task_of)
    return flat


def train(model, optimizer, scheduler, accelerator, loaders: dict, specs: dict, sampler, total_steps: int, tcfg,
          log: Callable[[dict, int], None], run_eval: Callable[[int], dict], start_step: int = 0,
          on_step: Callable[[int], None] | None = None) -> dict:
    """Run steps [start_step, total_steps). loaders/specs: task name -> train loader / TaskSpec.

    Returns the last evaluation's flat metrics. Logs train/step_time_s at the end: the mean
    seconds of a training step (forward, backward, update) without logging and evaluation.
    """
    iters = {t: forever(dl) for t, dl in loaders.items()}
    regression = {t: specs[t].is_regression for t in loaders}
    model.train()
    running = torch.zeros((), device=accelerator.device)
    # A resumed run logs the sampling probabilities of its epoch only if it starts a new one.
    seen, last_eval, epoch = 0, {}, sampler.epoch_of(start_step - 1) if start_step else None
    bar = tqdm(total=total_steps, initial=start_step, desc="train", disable=not accelerator.is_main_process,
               dynamic_ncols=True)
    step_time = 0.0
    for step in range(start_step, total_steps):
        t_step = time.perf_counter()
        task = sampler.task(step)
        if sampler.epoch_of(step) != epoch and len(loaders) > 1:
            epoch = sampler.epoch_of(step)
            log({f"sampling/p/{t}": p for t, p in sampler.probs(epoch).items()}, step)
        for _ in range(tcfg.gradient_accumulation_steps):
            batch = next(iters[task])
            with accelerator.accumulate(model):
                logits = model(task, **batch_inputs(batch))
                loss = task_loss(logits, batch["labels"], regression[task])
                # Stop before a NaN/inf reaches the weights (and a checkpoint). One host sync per
                # micro-batch: free on CPU, ~µs against a step of an encoder on GPU (HF Trainer's
                # nan filter pays the same).
                if not torch.isfinite(loss):
                    raise NonFiniteLoss(f"training loss is {loss.item()} at step {step + 1} (task {task}); "
                                        "lower train.learning_rate or check the data; the weights were not updated")
                accelerator.backward(loss)
                if accelerator.sync_gradients and tcfg.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), tcfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            running += loss.detach() / tcfg.gradient_accumulation_steps
        step_time += time.perf_counter() - t_step
        seen += 1
        done = step + 1
        bar.update(1)
        if done % tcfg.log_every == 0 or done == total_steps:
            # Averaged on the device; read back (a host sync) only at logging cadence. With several
            # processes, the mean over all of them (every rank reaches this line at the same step).
            mean = accelerator.reduce(running / seen, reduction="mean").item()
            log({"train/loss": mean, "train/lr": scheduler.get_last_lr()[0],
                 "train/epoch": sampler.epoch_of(step)}, done)
            bar.set_postfix(loss=f"{mean:.4f}", task=task)
            running.zero_()
            seen = 0
        if on_step is not None:
            on_step(done)
        if (tcfg.eval_every > 0 and done % tcfg.eval_every == 0) or done == total_steps or \
                (tcfg.eval_per_epoch and done % sampler.steps_per_epoch == 0):  # once per epoch, any length
            last_eval = run_eval(done)
            bar.set_postfix(score=f"{last_eval.get('eval/score', float('nan')):.4f}")
    bar.close()
    if total_steps > start_step:
        log({"train/step_time_s": step_time / (total_steps - start_step)}, total_steps)
    return last_eval
