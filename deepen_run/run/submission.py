"""GLUE test-server files (`predict=true`): one TSV per test split, as run artifacts under submission/.

The server wants `index<TAB>prediction` per file (CoLA.tsv, SST-2.tsv, MRPC.tsv, STS-B.tsv,
QQP.tsv, MNLI-m.tsv, MNLI-mm.tsv, QNLI.tsv, RTE.tsv, WNLI.tsv) with its own label strings:
entailment / not_entailment (RTE, QNLI), entailment / neutral / contradiction (MNLI), 0 / 1 for
the other classification tasks (our label ids already are GLUE's), and STS-B scores clipped to
[0, 5] with 3 decimals; AX.tsv (the diagnostic set, MNLI's labels, by the MNLI head) where its
test file is present.

The leaderboard zip (submission/glue_submission.zip, the files at its root, as the server wants
them): one per run from what that run predicted, and `deepen-report --submission FILE.zip` across
runs of each task (deepen_run/report/submission.py). Both name the
files the zip lacks in one line. docs/runs.md, section GLUE test submissions.
"""
from __future__ import annotations

import io
import zipfile

from deepen_run.data.glue import AX, TASKS, TaskSpec

# The GLUE server's file names, in its order; AX is its diagnostic set.
SERVER_FILES = (*(stem for t in TASKS.values() for stem in t.submission), *AX.submission)
ZIP = "glue_submission.zip"


def label_string(spec: TaskSpec, pred) -> str:
    if spec.is_regression:
        return f"{min(5.0, max(0.0, float(pred))):.3f}"
    return spec.label_names[int(pred)] if spec.tsv_label_strings else str(int(pred))


def to_tsv(spec: TaskSpec, idx: list[int], preds: list) -> str:
    return "index\tprediction\n" + "".join(f"{i}\t{label_string(spec, p)}\n" for i, p in zip(idx, preds))


def zip_bytes(files: dict[str, str]) -> bytes:
    """stem -> TSV text => a zip of <stem>.tsv at its root, in the server's order."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for stem in sorted(files, key=lambda s: SERVER_FILES.index(s) if s in SERVER_FILES else len(SERVER_FILES)):
            z.writestr(f"{stem}.tsv", files[stem])
    return buf.getvalue()


def missing_line(have) -> str:
    gone = [s for s in SERVER_FILES if s not in have]
    return f"missing {len(gone)} of {len(SERVER_FILES)}: {', '.join(gone)}" if gone else "all GLUE files present"


def _log_zip(tracker, files: dict[str, str]) -> None:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ZIP
        path.write_bytes(zip_bytes(files))
        tracker.log_file(str(path), "submission")


def write(model, accelerator, tracker, data: dict, tokenizer, batch_size: int) -> dict[str, int]:
    """Predict every loaded test split, log submission/<stem>.tsv and the zip of them all; returns
    rows per file."""
    from deepen_run.data.loaders import eval_loader
    from deepen_run.run.predict import predict

    rows, files = {}, {}
    was_training = model.training
    model.eval()
    for d in data.values():
        for stem, ds in d.test.items():
            loader = accelerator.prepare(eval_loader(ds, tokenizer, batch_size))
            preds, _ = predict(model, accelerator, loader, d.spec, desc=f"predict {stem}")
            files[stem] = to_tsv(d.spec, list(ds["idx"]), preds)
            tracker.log_text(files[stem], f"submission/{stem}.tsv")
            rows[stem] = len(preds)
    model.train(was_training)
    _log_zip(tracker, files)
    return rows

