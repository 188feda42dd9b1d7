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
from accelerate.utils import set_seed
from omegaconf import OmegaConf

from deepen_run import backbone as bb
from deepen_run import checkpoint as ck
from deepen_run import data as gd
from deepen_run import duplication
from deepen_run import metrics as glue_metrics
from deepen_run import submission, summary
from deepen_run.context import RunContext
from deepen_run.fast import make_accelerator
from deepen_run.figures import sampling_plot
from deepen_run.lifecycle import GUARD, provenance, reap_orphans
from deepen_run.methods import METHODS, hook
from deepen_run.model import count, param_report
from deepen_run.sampling import TaskSampler, epoch_length
from deepen_run.preflight import check  # noqa: F401 (the pre-flight, also for callers of runner)
from deepen_run.redact import public_config
from deepen_run.resume import current_dir, save_run_config
from deepen_run.tracking import Tracker, flatten
from deepen_run.train import evaluate, eval_metrics, optimizer_for, scheduler_for, train
from deepen_run.util import first_line


def run_name(cfg) -> str:
    if cfg.tracking.run_name:
        return cfg.tracking.run_name
    tasks = "+".join(cfg.task.names)
    sched = f"-{cfg.schedule.name}" if len(cfg.task.names) > 1 else ""
    return f"{cfg.backbone.name}-{cfg.method.name}-{tasks}{sched}-s{cfg.seed}"


def tags_for(cfg) -> dict[str, str]:
    return {"backbone": cfg.backbone.name, "method": cfg.method.name, "task": "+".join(cfg.task.names),
            "schedule": cfg.schedule.name, "seed": str(cfg.seed), "dry_run": str(bool(cfg.dry_run)).lower()}


def run(cfg, tasks=None, resume_home=None, tags: dict[str, str] | None = None) -> float:
    """resume_home: the run dir of a killed run to continue (deepen_run/resume.py), or None;
    tags: extra run tags (a sweep job's parent run and sweep id)."""
    tasks = tasks or check(cfg)
    home = resume_home or current_dir()
    accelerator = make_accelerator(cfg.train)
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment, enabled=accelerator.is_main_process)
    tracker.check()
    reap_orphans(tracker)
    run_id = ck.read_run_file(resume_home).get("run_id") if resume_home else None
    set_seed(cfg.seed)
    method = METHODS[cfg.method.name]

    backbone = bb.load_model(cfg.backbone)
    backbone_config = backbone.config.to_dict()
    backbone_params = count(backbone)
    duplication.apply(backbone, cfg)  # before any method builds: every method sees the deeper encoder
    model = method.build(backbone, cfg.method, tasks)
    sizes = param_report(model, backbone_params, count(backbone) - backbone_params)
    sizes["model/num_layers"] = getattr(model.backbone.config, "num_hidden_layers", 0)

    before = tracker.status(run_id) if run_id else ""
    tracker.start(run_name(cfg) + ("-dry" if cfg.dry_run else ""), tags_for(cfg) | provenance() | (tags or {}), run_id=run_id)
    ck.write_run_file(home, tracker.run_id, cfg.tracking.uri, cfg.tracking.experiment)
    if not run_id:
        save_run_config(home, cfg)
    status = "FAILED"
    progress = {"restored": not run_id}  # a resume that fails before its checkpoint is back keeps its status
    try:
        if run_id:  # a resume: same run, RUNNING again; nothing it already logged is logged twice
            tracker.resume()
        public = public_config(cfg)
        tracker.log_params(flatten(public))
        tracker.log_text(OmegaConf.to_yaml(public), "config.yaml")
        tracker.log_metrics(sizes, 0)
        tracker.set_tags({"num_processes": str(accelerator.num_processes)})
        accelerator.print(size_summary(sizes))
        if cfg.dry_run:
            status = "FINISHED"
            return float("nan")
        score = fit(cfg, tasks, model, method, accelerator, tracker, backbone_config, home, resume_home, progress)
        status = "FINISHED"
        return score
    except KeyboardInterrupt as e:
        status = "KILLED"
        tracker.set_tags({"interrupted": str(e) or "KeyboardInterrupt"})
        raise
    except Exception as e:
        line = first_line(e, 5000)
        if not progress["restored"]:
            status = before or "KILLED"
        tracker.set_tags({"error" if progress["restored"] else "resume_error": line})
        raise
    finally:
        tracker.end(status)
        if accelerator.is_main_process:
            ck.finish(home, status)
            if status == "FINISHED":
                summary.show(tracker, home, status)


def size_summary(s: dict) -> str:
    dup = f"  duplicated {s['params/duplicated']:,}" if s.get("params/duplicated") else ""
    return (f"params: backbone {s['params/backbone']:,}{dup}  method {s['params/method']:,}  heads "
            f"{s['params/heads']:,}  total {s['params/total']:,}  trainable {s['params/trainable']:,}  "
            f"ratio {s['params/ratio']:.4f}x  layers {s['model/num_layers']}")


def fit(cfg, tasks, model, method, accelerator, tracker, backbone_config, home=None, resume_home=None,
        progress=None) -> float:
    tok = bb.load_tokenizer(cfg.backbone)
    # Rank 0 tokenizes and fills the cache first; the other ranks then read it instead of racing.
    with accelerator.main_process_first():
        data = {t.name: gd.load_task(t, cfg.data, tok, cfg.seed, with_test=cfg.predict) for t in tasks}
    tcfg = cfg.train
    loaders = {t: gd.make_loader(d.train, tok, tcfg.batch_size, True, cfg.seed + i, cfg.data.group_by_length,
                                 cfg.data.num_workers) for i, (t, d) in enumerate(data.items())}
    dev = {name: gd.make_loader(ds, tok, tcfg.eval_batch_size, False, cfg.seed)
           for d in data.values() for name, ds in d.dev.items()}
    eval_specs = {name: d.spec for d in data.values() for name in d.dev}
    task_of = {name: s.name for name, s in eval_specs.items()}
    ctx = RunContext(cfg, tasks, data, tok, tracker, accelerator, backbone_config)
    duplication.record(model.backbone, ctx)
    hook(method, "after_build")(model, ctx)

    per_pass = sum(len(dl) for dl in loaders.values()) // tcfg.gradient_accumulation_steps
    steps_per_epoch = epoch_length(tcfg, len(tasks), per_pass)
    total = tcfg.max_steps if tcfg.max_steps > 0 else math.ceil(tcfg.num_epochs * steps_per_epoch)
    sampler = TaskSampler(cfg.schedule, {t: len(d.train) for t, d in data.items()}, steps_per_epoch, total, cfg.seed)

    optimizer = optimizer_for(model, tcfg, accelerator.device.type)
    scheduler = scheduler_for(optimizer, tcfg, total)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    loaders = {k: accelerator.prepare(v) for k, v in loaders.items()}
    saver = ck.Checkpointer(home, tcfg, accelerator, total, predict=cfg.predict)
    loaders = saver.wrap(loaders, {t: cfg.seed + i for i, t in enumerate(data)})
    start = saver.restore(ck.usable(resume_home) if resume_home else None)
    if progress is not None:
        progress["restored"] = True
    dev = {k: accelerator.prepare(v) for k, v in dev.items()}
    if start == 0:  # the N_i the sampler uses: what is trained on, after train_fraction / max_train_samples
        tracker.log_metrics({f"data/train_examples/{t}": len(d.train) for t, d in data.items()}, 0)
    if len(tasks) > 1:
        table = sampler.table()
        tracker.log_csv(table, "sampling/probabilities.csv")
        tracker.log_figure(sampling_plot(table, list(data)), "sampling/probabilities.png")

    state = {"preds": {}, "results": {}, "undefined": []}

    def run_eval(step: int) -> dict:
        with GUARD.deferred(False):  # a signal during evaluation stops it at once
            results, preds = evaluate(model, accelerator, dev, eval_specs)
        flat = eval_metrics(results, task_of)
        warn_undefined(results, state, tracker, accelerator)
        saver.save_best(model, step, flat["eval/score"])
        tracker.log_metrics(flat | {"eval/best_score": saver.best}, step)
        state.update(preds=preds, results=results)
        return flat

    t0 = time.time()
    try:
        with GUARD.deferred():  # signals wait for the end of the step, then save and stop
            final = train(model, optimizer, scheduler, accelerator, loaders, {t.name: t for t in tasks}, sampler,
                          total, tcfg, tracker.log_metrics, run_eval, start_step=start, on_step=saver.on_step)
        final = final or run_eval(total)  # resumed from a checkpoint at the last step
    except KeyboardInterrupt:
        saver.on_interrupt()
        raise
    tracker.log_metrics({"train/runtime_s": time.time() - t0}, total)
    record(cfg, tracker, data, state, final, total)
    if cfg.predict:
        rows = submission.write(model, accelerator, tracker, data, tok, tcfg.eval_batch_size, cfg.seed)
        accelerator.print("submission/: " + "  ".join(f"{stem}.tsv {n} rows" for stem, n in rows.items()))
    hook(method, "after_train")(accelerator.unwrap_model(model), ctx)
    return final["eval/score"]


def warn_undefined(results, state, tracker, accelerator) -> None:
    """An undefined metric counts as 0 in eval/score (deepen_run/metrics): say so once per metric, and
    tag the run `undefined_metrics=stsb/pearson,...` so the score is never read as a clean one."""
    new = [m for m in glue_metrics.undefined(results) if m not in state["undefined"]]
    if new:
        state["undefined"] += new
        accelerator.print(f"deepen-run: warning: {', '.join(new)} undefined (NaN; a constant prediction?), "
                          f"counted as {glue_metrics.UNDEFINED_VALUE:g} in eval/score")
        tracker.set_tags({"undefined_metrics": ",".join(state["undefined"])})


def record(cfg, tracker, data, state, final, total) -> None:
    """metrics.json and dev predictions (idx, prediction, label) per eval set, as artifacts."""
    tracker.log_dict({"step": total, **final, "per_task": state["results"]}, "metrics.json")
    for d in data.values():
        for name, ds in d.dev.items():
            pred = state["preds"].get(name, [])
            lines = ["idx\tprediction\tlabel"] + [f"{i}\t{p:.4f}\t{y}" if d.spec.is_regression else f"{i}\t{p}\t{y}"
                                                 for i, p, y in zip(ds["idx"], pred, ds["label"])]
            tracker.log_text("\n".join(lines) + "\n", f"predictions/{name}.tsv")
