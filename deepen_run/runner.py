"""One run, top to bottom: check -> model -> data -> train -> evaluate -> record.

Cheap checks (tasks, numbers, files, backbone, tracking store) come first so bad input fails in
seconds; the MLflow run is created only once they pass, and always ends FINISHED, FAILED or KILLED.
"""
from __future__ import annotations

import json
import math
import os
import time

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from omegaconf import OmegaConf

from deepen_run import backbone as bb
from deepen_run import data as gd
from deepen_run.context import RunContext
from deepen_run.errors import UserError
from deepen_run.figures import sampling_plot
from deepen_run.glue import get_tasks
from deepen_run.methods import METHODS
from deepen_run.model import count, param_report
from deepen_run.sampling import TaskSampler
from deepen_run.tracking import Tracker, flatten
from deepen_run.train import evaluate, eval_metrics, optimizer_for, scheduler_for, train


def check(cfg) -> list:
    """Everything that can be checked without loading a model; returns the TaskSpecs."""
    tasks = get_tasks(list(cfg.task.names))
    if cfg.method.name not in METHODS:
        raise UserError(f"unknown method {cfg.method.name!r}; choose from {', '.join(METHODS)}")
    for key in ("learning_rate", "batch_size", "eval_batch_size", "gradient_accumulation_steps", "log_every"):
        if not getattr(cfg.train, key) > 0:
            raise UserError(f"train.{key}={getattr(cfg.train, key)} must be positive")
    if cfg.train.max_steps <= 0 and not cfg.train.num_epochs > 0:
        raise UserError("set train.max_steps or train.num_epochs to a positive number")
    for key in ("max_train_samples", "max_eval_samples"):
        if getattr(cfg.data, key) is not None and getattr(cfg.data, key) <= 0:
            raise UserError(f"data.{key}={getattr(cfg.data, key)} must be positive (or null for all)")
    if not cfg.dry_run:
        gd.check_glue_dir(cfg.data.glue_dir, tasks)
    bb.preflight(cfg.backbone)
    return tasks


def run_name(cfg) -> str:
    if cfg.tracking.run_name:
        return cfg.tracking.run_name
    tasks = "+".join(cfg.task.names)
    sched = f"-{cfg.schedule.name}" if len(cfg.task.names) > 1 else ""
    return f"{cfg.backbone.name}-{cfg.method.name}-{tasks}{sched}-s{cfg.seed}"


def tags_for(cfg) -> dict[str, str]:
    return {"backbone": cfg.backbone.name, "method": cfg.method.name, "task": "+".join(cfg.task.names),
            "schedule": cfg.schedule.name, "seed": str(cfg.seed)}


def run(cfg) -> float:
    tasks = check(cfg)
    accelerator = Accelerator(mixed_precision=cfg.train.mixed_precision,
                              gradient_accumulation_steps=cfg.train.gradient_accumulation_steps)
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment, enabled=accelerator.is_main_process)
    tracker.check()
    set_seed(cfg.seed)
    method = METHODS[cfg.method.name]

    backbone = bb.load_model(cfg.backbone)
    backbone_config = backbone.config.to_dict()
    backbone_params = count(backbone)
    model = method.build(backbone, cfg.method, tasks)
    sizes = param_report(model, backbone_params)
    sizes["model/num_layers"] = getattr(model.backbone.config, "num_hidden_layers", 0)

    tracker.start(run_name(cfg), tags_for(cfg))
    status = "FAILED"
    try:
        resolved = OmegaConf.to_container(cfg, resolve=True)
        tracker.log_params(flatten(resolved))
        tracker.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
        tracker.log_metrics(sizes, 0)
        print(size_summary(sizes))
        if cfg.dry_run:
            status = "FINISHED"
            return float("nan")
        score = fit(cfg, tasks, model, method, accelerator, tracker, backbone_config)
        status = "FINISHED"
        return score
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except Exception as e:
        tracker.set_tags({"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"})
        raise
    finally:
        tracker.end(status)


def size_summary(s: dict) -> str:
    return (f"params: backbone {s['params/backbone']:,}  method {s['params/method']:,}  heads "
            f"{s['params/heads']:,}  total {s['params/total']:,}  trainable {s['params/trainable']:,}  "
            f"ratio {s['params/ratio']:.4f}x  layers {s['model/num_layers']}")


def fit(cfg, tasks, model, method, accelerator, tracker, backbone_config) -> float:
    tok = bb.load_tokenizer(cfg.backbone)
    data = {t.name: gd.load_task(t, cfg.data, tok, cfg.seed, with_test=cfg.predict) for t in tasks}
    tcfg = cfg.train
    loaders = {t: gd.make_loader(d.train, tok, tcfg.batch_size, True, cfg.seed + i, cfg.data.group_by_length,
                                 cfg.data.num_workers) for i, (t, d) in enumerate(data.items())}
    dev = {name: gd.make_loader(ds, tok, tcfg.eval_batch_size, False, cfg.seed)
           for d in data.values() for name, ds in d.dev.items()}
    eval_specs = {name: d.spec for d in data.values() for name in d.dev}
    task_of = {name: s.name for name, s in eval_specs.items()}
    ctx = RunContext(cfg, tasks, data, tok, tracker, accelerator, backbone_config)
    if hasattr(method, "after_build"):
        method.after_build(model, ctx)

    per_pass = sum(len(dl) for dl in loaders.values()) // tcfg.gradient_accumulation_steps
    steps_per_epoch = max(1, per_pass if len(tasks) == 1 else (tcfg.steps_per_epoch or per_pass))
    total = tcfg.max_steps if tcfg.max_steps > 0 else math.ceil(tcfg.num_epochs * steps_per_epoch)
    sampler = TaskSampler(cfg.schedule, {t: len(d.train) for t, d in data.items()}, steps_per_epoch, total, cfg.seed)

    optimizer = optimizer_for(model, tcfg, accelerator.device.type)
    scheduler = scheduler_for(optimizer, tcfg, total)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    loaders = {k: accelerator.prepare(v) for k, v in loaders.items()}
    dev = {k: accelerator.prepare(v) for k, v in dev.items()}
    if len(tasks) > 1:
        table = sampler.table()
        tracker.log_csv(table, "sampling/probabilities.csv")
        tracker.log_figure(sampling_plot(table, list(data)), "sampling/probabilities.png")

    best = {"eval/score": -math.inf}
    state = {"preds": {}, "results": {}}

    def run_eval(step: int) -> dict:
        results, preds = evaluate(model, accelerator, dev, eval_specs)
        flat = eval_metrics(results, task_of)
        if flat["eval/score"] > best["eval/score"]:
            best.update(flat)
        tracker.log_metrics(flat | {"eval/best_score": best["eval/score"]}, step)
        state.update(preds=preds, results=results)
        return flat

    t0 = time.time()
    final = train(model, optimizer, scheduler, accelerator, loaders, {t.name: t for t in tasks}, sampler, total,
                  tcfg, tracker.log_metrics, run_eval)
    tracker.log_metrics({"train/runtime_s": time.time() - t0}, total)
    record(cfg, tracker, data, state, final, total)
    if hasattr(method, "after_train"):
        method.after_train(accelerator.unwrap_model(model), ctx)
    print(" ".join(f"{k}={v:.4f}" for k, v in final.items()))
    return final["eval/score"]


def record(cfg, tracker, data, state, final, total) -> None:
    """metrics.json and dev predictions (idx, prediction, label) per eval set, as artifacts."""
    tracker.log_dict({"step": total, **final, "per_task": state["results"]}, "metrics.json")
    for d in data.values():
        for name, ds in d.dev.items():
            pred = state["preds"].get(name, [])
            lines = ["idx\tprediction\tlabel"] + [f"{i}\t{p:.4f}\t{y}" if d.spec.is_regression else f"{i}\t{p}\t{y}"
                                                 for i, p, y in zip(ds["idx"], pred, ds["label"])]
            tracker.log_text("\n".join(lines) + "\n", f"predictions/{name}.tsv")
