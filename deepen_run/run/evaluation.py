"""Evaluation on the dev sets: one pass per eval set through the shared prediction loop (run/predict.py),
the official GLUE metrics and eval/score, a warning for an undefined metric, and the end-of-run record.

The pass also keeps what a method's model hands out besides its logits (Output.extras, e.g.
HIRE's per-example layer importances), so a method's end-of-run report
reads the final evaluation instead of running the dev sets through the model a second time.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from deepen_run.data import metrics as glue_metrics
from deepen_run.run.predict import predict


@dataclass
class Evaluation:
    """One evaluation, per eval name (e.g. sst2, mnli-m), everything in dev order."""
    results: dict  # {metric: value}
    preds: dict  # predictions
    refs: dict  # labels
    extras: dict  # {key: [tensors]}: the model's Output.extras in dev order (none: {})


@torch.no_grad()
def evaluate(model, accelerator, dev_loaders: dict, specs: dict) -> Evaluation:
    """dev_loaders: eval name -> loader; specs: eval name -> TaskSpec."""
    model.eval()
    ev = Evaluation({}, {}, {}, {})
    for name, loader in dev_loaders.items():
        ev.extras[name] = {}
        ev.preds[name], ev.refs[name] = predict(model, accelerator, loader, specs[name], labels=True,
                                                desc=f"eval {name}", extras=ev.extras[name])
        ev.results[name] = glue_metrics.compute(name, ev.preds[name], ev.refs[name])
    model.train()
    return ev


def eval_metrics(results: dict, task_of: dict) -> dict[str, float]:
    flat = {f"eval/{n}/{m}": v for n, ms in results.items() for m, v in ms.items()}
    flat["eval/score"] = glue_metrics.glue_score(results, task_of)
    return flat


def warn_undefined(results, seen: list, tracker, console) -> None:
    """An undefined metric counts as 0 in eval/score (deepen_run/data/metrics): say so once per metric
    (`seen` holds those already reported), and tag the run `undefined_metrics=stsb/pearson,...` so
    the score is never read as a clean one."""
    new = [m for m in glue_metrics.undefined(results) if m not in seen]
    if new:
        seen += new
        console.print(f"deepen-run: warning: {', '.join(new)} undefined (NaN; a constant prediction?), "
                      f"counted as {glue_metrics.UNDEFINED_VALUE:g} in eval/score")
        tracker.set_tags({"undefined_metrics": ",".join(seen)})


def record(tracker, data: dict, ev: Evaluation, final: dict, total: int) -> None:
    """metrics.json and dev predictions (idx, prediction, label) per eval set, as artifacts."""
    tracker.log_dict({"step": total, **final, "per_task": ev.results}, "metrics.json")
    for d in data.values():
        for name, ds in d.dev.items():
            pred = ev.preds.get(name, [])
            lines = ["idx\tprediction\tlabel"] + [f"{i}\t{p:.4f}\t{y}" if d.spec.is_regression else f"{i}\t{p}\t{y}"
                                                 for i, p, y in zip(ds["idx"], pred, ds["label"])]
            tracker.log_text("\n".join(lines) + "\n", f"predictions/{name}.tsv")
