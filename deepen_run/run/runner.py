"""One run's life: model -> MLflow run -> the training recipe (deepen_run/run/train.py) -> summary.

The caller has run the pre-flight once (cheap checks of tasks, numbers, files, backbone, tracking
store: bad input fails in seconds) and hands its tasks in; the MLflow run is created only after it,
and always ends FINISHED, FAILED or KILLED.
A dry run stops after recording the model's sizes: it imports nothing of data, metrics or figures.
"""
from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Optional

from accelerate.utils import set_seed
from omegaconf import OmegaConf

from deepen_run.run import checkpoint as ck
from deepen_run.run import runfile
from deepen_run.model import steps as backbone_steps
from deepen_run.errors import UserError
from deepen_run.run import summary
from deepen_run.run.context import Run
from deepen_run.run.names import SCORE_TAG, model_name, model_tags, run_name, tags_for  # noqa: F401 (callers import some)
from deepen_run.run.fast import make_accelerator
from deepen_run.run.lifecycle import Interrupted, SignalGuard, provenance, reap_orphans
from deepen_run.methods import METHODS
from deepen_run.model.heads import new_parameters, param_report
from deepen_run.config.redact import public_config
from deepen_run.run.resume import current_dir, save_run_config
from deepen_run.data.fingerprint import save_fingerprint
from deepen_run.serve import publish
from deepen_run.tracking.store import Tracker, TrackingLost, flatten
from deepen_run.tracking.models import SystemMetrics
from deepen_run.util import first_line, phase


class RunKilled(Interrupted):
    """The run ended KILLED by a signal (Ctrl-C included): which one, and the checkpoint it left
    (None: none saved), for the exit message of the command or the sweep job."""

    def __init__(self, signum: int, checkpoint: Optional[Path]):
        super().__init__(signum)
        self.checkpoint = checkpoint

    def __reduce__(self):  # a sweep job's exception travels to the launcher pickled
        return (RunKilled, (self.signum, self.checkpoint))


def run(cfg, tasks: list, resume_home=None, tags: dict[str, str] | None = None,
        signals: SignalGuard | None = None) -> float:
    """tasks: what the pre-flight returned (run/preflight.py's check, which the caller ran: the
    entry point, cli.run.checked_run); resume_home: the run dir of a killed run to continue
    (deepen_run/run/resume.py), or None; tags: extra run tags (a sweep job's parent run and sweep id);
    signals: the guard the entry point installed for this run (None: an inert one, no handlers)."""
    home = resume_home or current_dir()
    accelerator = make_accelerator(cfg.train)
    signals = signals or SignalGuard()
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment, enabled=accelerator.is_main_process, signals=signals)
    tracker.check()
    if "sweep_id" not in (tags or {}):  # a sweep's launcher looks for dead runs once, for all its jobs
        reap_orphans(tracker, note=runfile.orphan_note)
    run_id = runfile.read_run_file(resume_home).get("run_id") if resume_home else None
    if run_id and not tracker.has_run(run_id):  # before any weights load: MLflow would say "not found" in 55 lines
        raise UserError(f"resume: run {run_id} of {resume_home} is not in the MLflow store {tracker.shown} (deleted "
                        "or replaced since); restore that store to continue it, or start afresh: the same command "
                        "without resume and with another hydra.run.dir")
    phase("store")
    set_seed(cfg.seed)
    method = METHODS[cfg.method.name]

    from deepen_run.run.progress import quiet_libraries

    quiet_libraries()  # before the weights load: transformers' bar off a terminal
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
    # A signal while the run is being created waits until the try below, where it ends the run KILLED:
    # raised in between, it would leave the run RUNNING under a live process (a sweep worker idles on).
    with signals.deferred():
        if not run_id:  # before run.json: a SIGKILL between the two must not leave a run whose config
            save_run_config(home, cfg)  # a resume reads from Hydra's copy (which lacks a sweep job's name)
        tracker.start(run_name(cfg) + ("-dry" if cfg.dry_run else ""),
                      tags_for(cfg) | provenance() | where | (tags or {}), run_id=run_id)
    status, monitor, recipe = "FAILED", None, None
    restored = not run_id  # a resume that fails before its checkpoint is back keeps its status
    try:  # from here on, whatever fails (a full disk writing run.json) ends the run
        with signals.deferred():  # run.json names the run before a signal stops it: resume=auto finds it
            runfile.write_run_file(home, tracker.run_id, cfg.tracking.uri, cfg.tracking.experiment)
            if not run_id:
                save_fingerprint(home, cfg, tasks)
        with signals.atomic():  # MLflow's monitor reads the run (resume_logging) in this thread
            monitor = SystemMetrics(tracker, cfg.tracking.system_metrics)
        signals.raise_pending()
        if run_id:  # a resume: same run, RUNNING again; nothing it already logged is logged twice
            tracker.resume()
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
            status = "FINISHED"
            return float("nan")
        from deepen_run.run import train  # data, metrics, figures: only for a run that trains

        recipe = train.setup(cfg, Run(tasks, model, method, new_params, accelerator, tracker, home, resume_home,
                                       signals))
        restored = True
        if run_id:
            accelerator.print(f"resuming run {run_name(cfg)} ({run_id}) at step {recipe.start} of {recipe.total}")
        phase("data")
        score = train.fit(recipe)["eval/score"]
        # The runs table shows a metric's every digit, cut off (0.77522935…); this column reads at a glance.
        tracker.set_tags({SCORE_TAG: f"{score:.4f}"})
        publish.publish(cfg, tasks, accelerator.unwrap_model(recipe.model), recipe.ctx.tokenizer, tracker,
                        recipe.saver, recipe.total, model_name(cfg), model_tags(cfg))
        status = "FINISHED"
        return score
    except KeyboardInterrupt as e:
        killed = stopped(e, str(e) or "KeyboardInterrupt", signals, recipe, home, tracker)
        status = "KILLED"
        raise killed from e
    except TrackingLost:
        raise  # the store is gone: nothing more can be recorded there (the checkpoint is saved)
    except Exception as e:
        surfaced = signals.surfaced(e)
        if surfaced is not None:
            # The signal came first and was raised inside library code, which turned it into another
            # error (CPython's `from os import <missing name>` in tqdm, hit in CI, raised "TypeError:
            # expected a message argument"): the run was stopped, not broken. A signal only deferred
            # (a step's end) raised nothing: an error then is the run's own, FAILED below.
            why = f"{surfaced} (it surfaced as {first_line(e)})"
            print(f"deepen-run: warning: {why}", file=sys.stderr)
            killed = stopped(surfaced, why, signals, recipe, home, tracker)
            status = "KILLED"
            raise killed from e
        line = first_line(e, 5000)
        if not restored:
            status = before or "KILLED"
        with signals.deferred():  # a signal here waits: the run ends FAILED, as the store will say
            tracker.set_tags({"error" if restored else "resume_error": line})
        raise
    finally:
        # MLflow's status and run.json's are written together: a signal here waits until both say how
        # the run ended (raised between them, the store said FINISHED and run.json RUNNING).
        with signals.deferred():
            if monitor is not None:
                with signals.atomic():  # its last samples are written in this thread
                    monitor.stop()
            try:
                tracker.end(status)
            except TrackingLost:
                status = "FAILED"  # run.json says how it ended when MLflow cannot
            if accelerator.is_main_process:
                runfile.finish(home, status)
                if status == "FINISHED":
                    summary.show(tracker, home, status)
            phase("ended")


def stopped(e: KeyboardInterrupt, why: str, signals: SignalGuard, recipe, home, tracker) -> RunKilled:
    """A run stopped by a signal: its last step saved, why tagged; -> the RunKilled to raise, which
    names the signal and the checkpoint to the command's exit message or the sweep job."""
    signals.pending = signals.raised = None  # e is that signal, handled here; another one waits until the run is KILLED
    with signals.deferred():  # raised in here, it would lose the checkpoint's name and the exit message
        if recipe is not None:  # stopped after the loop (publishing the model): the last step is saved too
            recipe.saver.on_interrupt()
        checkpoint = ck.latest(home) if home is not None else None  # what the exit message names
        tracker.set_tags({"interrupted": why}
                         # no checkpoint: stopped while loading, before its first step (nothing to resume)
                         | ({"stopped_before_first_step": "true"} if checkpoint is None else {}))
    return RunKilled(getattr(e, "signum", signal.SIGINT), checkpoint)


def size_summary(s: dict) -> str:
    dup = f"  duplicated {s['params/duplicated']:,}" if s.get("params/duplicated") else ""
    fresh = f" (new, not in its checkpoint: {s['params/backbone_new']:,})" if s.get("params/backbone_new") else ""
    return (f"params: backbone {s['params/backbone']:,}{fresh}{dup}  method {s['params/method']:,}  heads "
            f"{s['params/heads']:,}  total {s['params/total']:,}  trainable {s['params/trainable']:,}  "
            f"ratio {s['params/ratio']:.4f}x  layers {s['model/num_layers']}")
