"""GLUE test-server files (`predict=true`): one TSV per test split, as run artifacts under submission/,
with the server's label strings (entailment / not_entailment, ...; STS-B clipped to [0, 5], 3
decimals), and the leaderboard zip of them all (submission/glue_submission.zip). Across runs:
deepen_run/report/submission.py. docs/runs.md, section GLUE test submissions.
"""
from __future__ import annotations

import io
import tempfile
import zipfile
from pathlib import Path

from deepen_run.data.glue import AX, TASKS, TaskSpec

# The GLUE server's file names, in its order; AX is its diagnostic set.
SERVER_FILES = (*(stem for t in TASKS.values() for stem in t.submission), *AX.submission)
ZIP = "glue_submission.zip"


def to_tsv(spec: TaskSpec, idx: list[int], preds: list) -> str:
    if spec.is_regression:
        labels = [f"{min(5.0, max(0.0, float(p))):.3f}" for p in preds]  # the server's range, STS-B's 0-5
    else:
        labels = [spec.label_names[int(p)] if spec.tsv_label_strings else str(int(p)) for p in preds]
    return "index\tprediction\n" + "".join(f"{i}\t{label}\n" for i, label in zip(idx, labels))


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


def write(model, accelerator, tracker, data: dict, tokenizer, batch_size: int) -> dict[str, int]:
    """Predict every loaded test split, log submission/<stem>.tsv and the zip of them all; returns
    rows per file."""
    from deepen_run.data.loaders import eval_loader
    from deepen_run.run.evaluation import predict  # torch: deepen-report reads this module's names without it

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
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / ZIP).write_bytes(zip_bytes(files))
        tracker.log_file(str(Path(tmp) / ZIP), "submission")
    return rows

