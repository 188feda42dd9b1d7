"""Evaluation on the dev sets, and the prediction loop it shares with the test-set submissions
(run/submission.py): one forward per batch in the loader's order, predictions gathered across processes
with the duplicate samples that pad the last batch dropped (Accelerate's gather_for_metrics). A loader
that visits the longest examples first (data/loaders.py, eval_loader) gets its outputs back in dataset
order, so callers never see the batching order. Then the official GLUE metrics and eval/score, a warning
for an undefined metric, and the end-of-run record.

The pass also keeps what a method's model hands out besides its logits (Output.extras, e.g.
HIRE's per-example layer importances), so a method's end-of-run report
reads the final evaluation instead of running the dev sets through the model a second time.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from deepen_run.data import metrics as glue_metrics
from deepen_run.run.progress import interactive
from deepen_run.run.stop import check


def batch_inputs(batch: dict) -> dict:
    """The model's inputs from a collated batch (no labels, no idx)."""
    return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}


@torch.no_grad()
def predict(model, accelerator, loader, spec, labels: bool = False, desc: str | None = None,
            extras: dict | None = None) -> tuple[list, list]:
    """-> (predictions, labels) as lists in the loader's order; labels stays empty unless asked for.

    Class ids for classification, float scores for regression. The caller sets eval/train mode.
    desc: a progress bar (rank 0 only) with this label.
    extras: a dict to fill with the model's Output.extras (methods/contract.py; tensors whose first dim
    is the batch): key -> gathered CPU tensors, one per batch (a single one, in dataset order, for a
    longest-first loader).
    """
    from tqdm.auto import tqdm

    from deepen_run.data.loaders import LongestFirst

    outs, refs = [], []
    quiet = desc is None or not accelerator.is_main_process or not interactive()  # no \r bars in a log file
    bar = tqdm(loader, desc=desc, leave=False, dynamic_ncols=True, disable=quiet)
    for batch in bar:
        check(accelerator)  # a stop asked during evaluation acts between its batches (run/stop.py)
        out = model(spec.name, **batch_inputs(batch))
        logits = out.logits
        p = logits.squeeze(-1).float() if spec.is_regression else logits.argmax(-1)
        if labels:
            p, r = accelerator.gather_for_metrics((p, batch["labels"]))
            refs.append(r.cpu())
        else:
            p = accelerator.gather_for_metrics(p)
        outs.append(p.cpu())
        for key, value in (out.extras.items() if extras is not None else ()):
            extras.setdefault(key, []).append(accelerator.gather_for_metrics(value).cpu())
    if isinstance(loader.dataset, LongestFirst):  # its outputs back in dataset order: the inverse of its order
        back = torch.argsort(torch.tensor(loader.dataset.order))
        outs, refs = restore(outs, back, "predictions"), restore(refs, back, "labels")
        for key, chunks in (extras or {}).items():
            extras[key] = restore(chunks, back, f"extras[{key!r}]")
    return (torch.cat(outs).tolist() if outs else []), (torch.cat(refs).tolist() if refs else [])


def restore(chunks: list, back: torch.Tensor, what: str) -> list:
    """Gathered chunks in loader order -> one tensor in dataset order (`back`: the inverse of the order)."""
    if not chunks:
        return []
    rows = torch.cat(chunks)
    if rows.shape[0] != len(back):  # a first dim that is not the batch would silently mix rows
        raise RuntimeError(f"{what}: {rows.shape[0]} rows gathered for {len(back)} examples; "
                           "extras must be tensors whose first dim is the batch")
    return [rows[back]]



@dataclass
class Evaluation:
    """One evaluation, per eval name (e.g. sst2, mnli-m), everything in dev order."""
    results: dict  # {metric: value}
    preds: dict  # predictions
    refs: dict  # labels
    extras: dict  # {key: [tensors]}: the model's Output.extras in dev order (none: {})
    flat: dict  # eval/<name>/<metric> and eval/score, as logged


@torch.no_grad()
def evaluate(model, accelerator, dev_loaders: dict, specs: dict) -> Evaluation:
    """dev_loaders: eval name -> loader; specs: eval name -> TaskSpec."""
    model.eval()
    ev = Evaluation({}, {}, {}, {}, {})
    for name, loader in dev_loaders.items():
        ev.extras[name] = {}
        ev.preds[name], ev.refs[name] = predict(model, accelerator, loader, specs[name], labels=True,
                                                desc=f"eval {name}", extras=ev.extras[name])
        ev.results[name] = glue_metrics.compute(name, ev.preds[name], ev.refs[name])
    model.train()
    ev.flat = eval_metrics(ev.results, {name: spec.name for name, spec in specs.items()})
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


def record(tracker, data: dict, ev: Evaluation, total: int) -> None:
    """metrics.json and dev predictions (idx, prediction, label) per eval set, as artifacts."""
    tracker.log_dict({"step": total, **ev.flat, "per_task": ev.results}, "metrics.json")
    for d in data.values():
        for name, ds in d.dev.items():
            pred = ev.preds.get(name, [])
            lines = ["idx\tprediction\tlabel"] + [f"{i}\t{p:.4f}\t{y}" if d.spec.is_regression else f"{i}\t{p}\t{y}"
                                                 for i, p, y in zip(ds["idx"], pred, ds["label"])]
            tracker.log_text("\n".join(lines) + "\n", f"predictions/{name}.tsv")
