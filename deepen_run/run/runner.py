"""One run's life: check -> model -> MLflow run -> the training recipe (deepen_run/run/train.py) -> summary.

Cheap checks (tasks, numbers, files, backbone, tracking store) come first so bad input fails in
seconds; the MLflow run is created only once they pass, and always ends FINISHED, FAILED or KILLED.
A dry run stops after recording the model's sizes: it imports nothing of data, metrics or figures.
"""
from __future__ import annotations

from accelerate.utils import set_seed
from omegaconf import OmegaConf

from deepen_run.run import checkpoint as ck
from deepen_run.model import steps as backbone_steps
from deepen_run.run import summary
from deepen_run.run.context import Run
from deepen_run.run.fast import make_accelerator
from deepen_run.run.lifecycle import guard, provenance, reap_orphans
from deepen_run.methods import METHODS
from deepen_run.model.heads import new_parameters, param_report
from deepen_run.run.preflight import check  # noqa: F401 (the pre-flight, also for callers of runner)
from deepen_run.config.redact import public_config
from deepen_run.run.resume import current_dir, save_run_config
from deepen_run.data.fingerprint import save_fingerprint
from deepen_run.tracking.store import Tracker, TrackingLost, flatten
from deepen_run.util import first_line, phase


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
    """resume_home: the run dir of a killed run to continue (deepen_run/run/resume.py), or None;
    tags: extra run tags (a sweep job's parent run and sweep id)."""
    tasks = tasks or check(cfg)
    home = resume_home or current_dir()
    accelerator = make_accelerator(cfg.train)
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment, enabled=accelerator.is_main_process)
    tracker.check()
    if "sweep_id" not in (tags or {}):  # a sweep's launcher looks for dead runs once, for all its jobs
        reap_orphans(tracker, note=ck.orphan_note)
    run_id = ck.read_run_file(resume_home).get("run_id") if resume_home else None
    phase("store")
    set_seed(cfg.seed)
    method = METHODS[cfg.method.name]

    backbone, loaded, added = backbone_steps.load(cfg)  # steps before any method builds: all see them
    model = method.build(backbone, cfg.method, tasks)
    backbone_steps.train_new(added)
    new_params = new_parameters(model, loaded, added)
    sizes = param_report(model, sum(p.numel() for p in loaded), sum(p.numel() for p in (*added.copied, *added.new)),
                         sum(p.numel() for p in added.fresh))
    sizes["model/num_layers"] = getattr(model.backbone.config, "num_hidden_layers", 0)
    phase("model")

    before = tracker.status(run_id) if run_id else ""
    where = {"run_dir": str(home)} if home is not None else {}  # what the orphan reaper checks for checkpoints
    signals = guard()
    # A signal while the run is being created waits until the try below, where it ends the run KILLED:
    # raised in between, it would leave the run RUNNING under a live process (a sweep worker idles on).
    with signals.deferred():
        tracker.start(run_name(cfg) + ("-dry" if cfg.dry_run else ""),
                      tags_for(cfg) | provenance() | where | (tags or {}), run_id=run_id)
        ck.write_run_file(home, tracker.run_id, cfg.tracking.uri, cfg.tracking.experiment)
        if not run_id:
            save_run_config(home, cfg)
            save_fingerprint(home, cfg, tasks)
    status = "FAILED"
    restored = not run_id  # a resume that fails before its checkpoint is back keeps its status
    try:
        signals.raise_pending()
        if run_id:  # a resume: same run, RUNNING again; nothing it already logged is logged twice
            tracker.resume()
        public = public_config(cfg)
        tracker.log_params(flatten(public))
        tracker.log_text(OmegaConf.to_yaml(public), "config.yaml")
        tracker.log_metrics(sizes, 0)
        tracker.set_tags({"num_processes": str(accelerator.num_processes)})
        accelerator.print(size_summary(sizes))
        phase("started")
        if cfg.dry_run:
            status = "FINISHED"
            return float("nan")
        from deepen_run.run import train  # data, metrics, figures: only for a run that trains

        recipe = train.setup(cfg, Run(tasks, model, method, new_params, accelerator, tracker, home, resume_home))
        restored = True
        phase("data")
        score = train.fit(recipe)
        status = "FINISHED"
        return score
    except KeyboardInterrupt as e:
        status = "KILLED"
        e.checkpoint = ck.latest(home) if home is not None else None  # what the exit message names
        tracker.set_tags({"interrupted": str(e) or "KeyboardInterrupt"})
        raise
    except TrackingLost:
        raise  # the store is gone: nothing more can be recorded there (the checkpoint is saved)
    except Exception as e:
        line = first_line(e, 5000)
        if not restored:
            status = before or "KILLED"
        tracker.set_tags({"error" if restored else "resume_error": line})
        raise
    finally:
        try:
            tracker.end(status)
        except TrackingLost:
            status = "FAILED"  # run.json says how it ended when MLflow cannot
        if accelerator.is_main_process:
            ck.finish(home, status)
            if status == "FINISHED":
                summary.show(tracker, home, status)
        phase("ended")


def size_summary(s: dict) -> str:
    dup = f"  duplicated {s['params/duplicated']:,}" if s.get("params/duplicated") else ""
    fresh = f" (new, not in its checkpoint: {s['params/backbone_new']:,})" if s.get("params/backbone_new") else ""
    return (f"params: backbone {s['params/backbone']:,}{fresh}{dup}  method {s['params/method']:,}  heads "
            f"{s['params/heads']:,}  total {s['params/total']:,}  trainable {s['params/trainable']:,}  "
            f"ratio {s['params/ratio']:.4f}x  layers {s['model/num_layers']}")
