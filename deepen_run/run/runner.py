"""One run's life: model -> MLflow run -> the training recipe (deepen_run/run/train.py) -> summary.

The caller has run the pre-flight once (cheap checks of tasks, numbers, files, backbone, tracking
store: bad input fails in seconds) and hands its tasks in; the MLflow run is created only after it,
and always ends FINISHED, FAILED or KILLED.
A dry run stops after recording the model's sizes: it imports nothing of data, metrics or figures.
"""
from __future__ import annotations

from accelerate.utils import set_seed
from omegaconf import OmegaConf

from deepen_run.run import resume
from deepen_run.model import steps as backbone_steps
from deepen_run.errors import UserError
from deepen_run.run.progress import quiet_libraries
from deepen_run.run.names import SCORE_TAG, model_name, model_tags, run_name, tags_for
from deepen_run.run.fast import make_accelerator
from deepen_run.run.lifecycle import reap_orphans
from deepen_run.run.record import RunRecord
from deepen_run.run.stop import check
from deepen_run.methods import METHODS
from deepen_run.model.heads import new_parameters, param_report
from deepen_run.config.redact import public_config
from deepen_run.precision import resolve
from deepen_run.run.resume import current_dir
from deepen_run.serve import publish
from deepen_run.tracking.models import run_exists
from deepen_run.tracking.store import Tracker, flatten
from deepen_run.run.context import RunState
from deepen_run.util import phase


def run(cfg, tasks: list, resume_home=None, tags: dict[str, str] | None = None) -> float:
    """tasks: what the pre-flight returned (run/preflight.py's check, which the caller ran: the
    entry point, cli.run.checked_run); resume_home: the run dir of a killed run to continue
    (deepen_run/run/resume.py), or None; tags: extra run tags (a sweep job's parent run and sweep id).
    A stop asked by a signal (run/stop.py) raises Stopped at the run's next check."""
    home = resume_home or current_dir()
    compute = resolve(cfg.train)  # precision, attention, fast paths: decided once, here
    accelerator = make_accelerator(cfg.train, compute.precision)
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment, enabled=accelerator.is_main_process)
    tracker.check()
    if "sweep_id" not in (tags or {}):  # a sweep's launcher looks for dead runs once, for all its jobs
        reap_orphans(tracker, note=resume.orphan_note)
    run_id = resume.read_run_file(resume_home).get("run_id") if resume_home else None
    # Before any weights load: MLflow would say "not found" in 55 lines.
    if run_id and tracker.enabled and not run_exists(tracker.uri, run_id):
        raise UserError(f"resume: run {run_id} of {resume_home} is not in the MLflow store {tracker.shown} (deleted "
                        "or replaced since); restore that store to continue it, or start afresh: the same command "
                        "without resume and with another hydra.run.dir")
    phase("store")
    set_seed(cfg.seed)
    method = METHODS[cfg.method.name]
    quiet_libraries()  # before the weights load: transformers' bar off a terminal
    check(accelerator)
    backbone, loaded, added = backbone_steps.load(cfg, compute)  # steps before any method builds: all see them
    model = method.build(backbone, cfg.method, tasks)
    backbone_steps.train_new(added)
    new_params = new_parameters(model, loaded, added)
    sizes = param_report(model, sum(p.numel() for p in loaded), sum(p.numel() for p in (*added.copied, *added.new)),
                         sum(p.numel() for p in added.fresh))
    sizes["model/num_layers"] = getattr(model.backbone.config, "num_hidden_layers", 0)
    phase("model")
    check(accelerator)  # the last point where a stop leaves no MLflow run

    name = run_name(cfg) + ("-dry" if cfg.dry_run else "")
    with RunRecord(cfg, tasks, tracker, home, name, tags_for(cfg) | (tags or {}), run_id,
                   accelerator.is_main_process) as record:
        check(accelerator)
        public = public_config(cfg)
        tracker.log_params(flatten(public))
        if not run_id or not tracker.inputs_linked:  # a run stopped before it linked its files links them now
            publish.log_data(tracker, cfg, tasks, home)
        tracker.log_text(OmegaConf.to_yaml(public), "config.yaml")
        tracker.log_metrics(sizes, 0)
        tracker.set_tags({"num_processes": str(accelerator.num_processes)})
        accelerator.print(size_summary(sizes))
        phase("started")
        if cfg.dry_run:
            return float("nan")
        from deepen_run.run import train  # data, metrics, figures: only for a run that trains

        state = train.setup(RunState(cfg, tasks, model, method, new_params, accelerator, tracker, compute, home,
                                     resume_home))
        record.saver, record.restored = state.saver, True
        if run_id:
            accelerator.print(f"resuming run {run_name(cfg)} ({run_id}) at step {state.start} of {state.total}")
        phase("data")
        score = train.fit(state)["eval/score"]
        # The runs table shows a metric's every digit, cut off (0.77522935…); this column reads at a glance.
        tracker.set_tags({SCORE_TAG: f"{score:.4f}"})
        check(accelerator)
        publish.publish(cfg, tasks, accelerator.unwrap_model(state.model), state.tokenizer, tracker,
                        state.saver, state.total, model_name(cfg), model_tags(cfg), compute)
        check(accelerator)
        return score


def size_summary(s: dict) -> str:
    dup = f"  duplicated {s['params/duplicated']:,}" if s.get("params/duplicated") else ""
    fresh = f" (new, not in its checkpoint: {s['params/backbone_new']:,})" if s.get("params/backbone_new") else ""
    return (f"params: backbone {s['params/backbone']:,}{fresh}{dup}  method {s['params/method']:,}  heads "
            f"{s['params/heads']:,}  total {s['params/total']:,}  trainable {s['params/trainable']:,}  "
            f"ratio {s['params/ratio']:.4f}x  layers {s['model/num_layers']}")
