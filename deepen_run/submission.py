"""GLUE test-server files (`predict=true`): one TSV per test split, as run artifacts under submission/.

The server wants `index<TAB>prediction` per file (CoLA.tsv, SST-2.tsv, MRPC.tsv, STS-B.tsv,
QQP.tsv, MNLI-m.tsv, MNLI-mm.tsv, QNLI.tsv, RTE.tsv, WNLI.tsv) with its own label strings:
entailment / not_entailment (RTE, QNLI), entailment / neutral / contradiction (MNLI), 0 / 1 for
the other classification tasks (our label ids already are GLUE's), and STS-B scores clipped to
[0, 5] with 3 decimals. Zip the folder's files to upload them.
"""
from __future__ import annotations

from pathlib import Path

import torch
from tqdm.auto import tqdm

from deepen_run.errors import UserError
from deepen_run.glue import TaskSpec
from deepen_run.train import batch_inputs


def check(cfg, tasks: list[TaskSpec]) -> None:
    """predict=true with a local GLUE folder: every test file must be there (fail before loading)."""
    if not cfg.predict or cfg.data.glue_dir is None or cfg.dry_run:
        return
    for spec in tasks:
        for stem, _ in spec.test_splits:
            f = Path(cfg.data.glue_dir) / spec.folder / f"{stem}.tsv"
            if not f.is_file():
                raise UserError(f"predict=true: {f} is missing; put GLUE's {spec.folder}/{stem}.tsv there "
                                f"or drop {spec.name} from task.names")


def label_string(spec: TaskSpec, pred) -> str:
    if spec.is_regression:
        return f"{min(5.0, max(0.0, float(pred))):.3f}"
    return spec.label_names[int(pred)] if spec.tsv_label_strings else str(int(pred))


def to_tsv(spec: TaskSpec, idx: list[int], preds: list) -> str:
    return "index\tprediction\n" + "".join(f"{i}\t{label_string(spec, p)}\n" for i, p in zip(idx, preds))


@torch.no_grad()
def predict(model, accelerator, loader, spec: TaskSpec) -> list:
    """Predictions in the loader's order (the test split's order)."""
    model.eval()
    outs = []
    for batch in tqdm(loader, desc=f"predict {spec.name} test", leave=False, dynamic_ncols=True,
                      disable=not accelerator.is_main_process):
        logits = model(spec.name, **batch_inputs(batch))
        p = logits.squeeze(-1).float() if spec.is_regression else logits.argmax(-1)
        outs.append(accelerator.gather_for_metrics(p).cpu())
    model.train()
    return torch.cat(outs).tolist() if outs else []


def write(model, accelerator, tracker, data: dict, tokenizer, batch_size: int, seed: int) -> dict[str, int]:
    """Predict every loaded test split and log submission/<stem>.tsv; returns rows per file."""
    from deepen_run.data import make_loader

    rows = {}
    for d in data.values():
        for stem, ds in d.test.items():
            loader = accelerator.prepare(make_loader(ds, tokenizer, batch_size, False, seed))
            preds = predict(model, accelerator, loader, d.spec)
            tracker.log_text(to_tsv(d.spec, list(ds["idx"]), preds), f"submission/{stem}.tsv")
            rows[stem] = len(preds)
    return rows
