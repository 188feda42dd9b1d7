"""The few lines every run ends with (rank 0): what it was, how it scored, where to look next.

Read back from the MLflow store, so it shows what was recorded, not what the process believes.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Optional

from deepen_run.config.schema import local_store
from deepen_run.masking import mask_uri
from deepen_run.serve.table import predict_args
from deepen_run.tracking import ui
from deepen_run.tracking.models import local_dir

DEFAULT_STORE = local_store()  # what the tools read with neither an option nor MLFLOW_TRACKING_URI
DEFAULT_EXPERIMENT = "deepen-run"


def ui_hint(uri: str) -> tuple[str, str]:
    """(UI base URL, how to start it) for a tracking URI; never a user:password@'s password."""
    if uri.startswith("http://") or uri.startswith("https://"):
        return mask_uri(uri).rstrip("/"), "the tracking server"
    if uri == DEFAULT_STORE:
        return ui.MAKE_UI, "make ui"  # the spelling make ui serves without the Assistant over the table
    return ui.DEFAULT_UI, f"mlflow ui --backend-store-uri {shlex.quote(mask_uri(uri))}"


def store_args(uri: str, experiment: Optional[str] = None, flag: str = "--uri") -> str:
    """The options a printed command needs to reach this store (and experiment) where they are not
    the defaults: copied as printed, the command must find the run (in a shell without MLflow's
    variables too, so a store or experiment they named is spelled out)."""
    out = f" {flag} {shlex.quote(mask_uri(uri))}" if uri != DEFAULT_STORE else ""
    if experiment is not None and experiment != DEFAULT_EXPERIMENT:
        out += f" --experiment {shlex.quote(experiment)}"
    return out


def text(tracker, home: Optional[Path]) -> str:
    run = tracker.client.get_run(tracker.run_id)
    metrics = run.data.metrics
    evals = {k: v for k, v in sorted(metrics.items()) if k.startswith("eval/") and k != "eval/score"}
    ui.apply(tracker.client, tracker.experiment_id, expand=run.data.tags.get("mlflow.parentRunId"))
    base, how = ui_hint(tracker.uri)
    lines = [f"run {run.info.run_name}  FINISHED  (id {tracker.run_id}, experiment {tracker.experiment})"]
    chosen = [f"{var} ({shown})" for var, value, shown in (  # MLflow's variables chose the store or experiment
        ("MLFLOW_TRACKING_URI", tracker.uri, mask_uri(tracker.uri)),
        ("MLFLOW_EXPERIMENT_NAME", tracker.experiment, tracker.experiment)) if os.environ.get(var) == value]
    if chosen:
        lines.append(f"  tracking      from {', '.join(chosen)}")
    if "eval/score" in metrics:
        per = "  ".join(f"{k[5:]} {v:.4f}" for k, v in evals.items() if k != "eval/best_score")
        lines.append(f"  eval/score {metrics['eval/score']:.4f}   {per}")
    elif run.data.tags.get("dry_run") == "true":
        lines.append("  dry run: sizes and config recorded, no training")
    best = home / "checkpoints" / "best" if home is not None else None
    if best is not None and (best / "model.safetensors").is_file():
        lines.append(f"  best weights  {best}  (eval/best_score {metrics.get('eval/best_score', float('nan')):.4f})")
    elif "eval/score" in metrics:
        lines.append("  best weights  not kept (short run; train.save_best=true keeps them)")
    if run.data.tags.get("model_id"):  # the LoggedModel of a run that kept weights (serve/publish.py)
        lines.append(f"  model         models:/{run.data.tags['model_id']}  (deepen-predict --run {tracker.run_id}"
                     f"{store_args(tracker.uri, flag='--tracking-uri')} {predict_args(run.data.tags.get('task', ''))}; "
                     "docs/use-a-model.md)")
    names = [a.path + ("/" if a.is_dir else "") for a in tracker.client.list_artifacts(tracker.run_id)]
    lines.append(f"  artifacts     {local_dir(run.info.artifact_uri) or run.info.artifact_uri}  ({', '.join(names)})")
    lines.append(f"  MLflow UI     {ui.run_url(base, tracker.experiment_id, tracker.run_id)}  ({how})")
    return "\n".join(lines)


def show(tracker, home: Optional[Path]) -> None:
    """Print a FINISHED run's summary; never fails the run that has just been recorded."""
    if not tracker.enabled or not tracker.run_id:
        return
    try:
        print("\n" + text(tracker, home), flush=True)
    except Exception as e:  # noqa: BLE001 (a store hiccup here must not turn a FINISHED run into an error)
        print(f"run {tracker.run_id} FINISHED (summary unavailable: {type(e).__name__})", flush=True)
