"""GLUE test-server files (`predict=true`): one TSV per test split, as run artifacts under submission/.

The server wants `index<TAB>prediction` per file (CoLA.tsv, SST-2.tsv, MRPC.tsv, STS-B.tsv,
QQP.tsv, MNLI-m.tsv, MNLI-mm.tsv, QNLI.tsv, RTE.tsv, WNLI.tsv) with its own label strings:
entailment / not_entailment (RTE, QNLI), entailment / neutral / contradiction (MNLI), 0 / 1 for
the other classification tasks (our label ids already are GLUE's), and STS-B scores clipped to
[0, 5] with 3 decimals. Zip the folder's files to upload them.
"""
from __future__ import annotations

from deepen_run.data.glue import TaskSpec


def label_string(spec: TaskSpec, pred) -> str:
    if spec.is_regression:
        return f"{min(5.0, max(0.0, float(pred))):.3f}"
    return spec.label_names[int(pred)] if spec.tsv_label_strings else str(int(pred))


def to_tsv(spec: TaskSpec, idx: list[int], preds: list) -> str:
    return "index\tprediction\n" + "".join(f"{i}\t{label_string(spec, p)}\n" for i, p in zip(idx, preds))


def write(model, accelerator, tracker, data: dict, tokenizer, batch_size: int) -> dict[str, int]:
    """Predict every loaded test split and log submission/<stem>.tsv; returns rows per file."""
    from deepen_run.data.loaders import eval_loader
    from deepen_run.run.predict import predict

    rows = {}
    was_training = model.training
    model.eval()
    for d in data.values():
        for stem, ds in d.test.items():
            loader = accelerator.prepare(eval_loader(ds, tokenizer, batch_size))
            preds, _ = predict(model, accelerator, loader, d.spec, desc=f"predict {stem}")
            tracker.log_text(to_tsv(d.spec, list(ds["idx"]), preds), f"submission/{stem}.tsv")
            rows[stem] = len(preds)
    model.train(was_training)
    return rows
