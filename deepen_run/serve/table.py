"""deepen-predict's text in and out: inputs from arguments, a TSV or stdin, checked against the task
(no torch: a refusal comes at once); results as a TSV.

A TSV input either has a header naming the task's GLUE columns (e.g. SST-2's dev.tsv: sentence;
MRPC's: #1 String, #2 String; an `index` column, if any, gives each row's idx) or has none: then
its first column (and second, for a pair task) are the texts, and any line may be a pair
"a<TAB>b". The output's first two columns, idx and prediction, are those of a run's
predictions/<task>.tsv (class id, or the STS-B score to 4 decimals), so the two can be compared line
by line; then the label name and its probability, every class's probability (p/<label>) and the
method's per-example extras (HIRE: alpha/<layer>, its importance of each layer it reads).
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

from deepen_run.errors import UserError

csv.field_size_limit(sys.maxsize)
INDEX = ("index", "idx")
Text = Union[str, Sequence[str]]  # a sentence, or a pair (a, b)


def pick_task(tasks: dict, task: Optional[str]):
    """The TaskSpec to predict: `task`, or the model's only one."""
    if task is None:
        if len(tasks) > 1:
            raise UserError(f"this model has {len(tasks)} tasks ({', '.join(tasks)}); name one (task=... / --task)")
        return next(iter(tasks.values()))
    if task not in tasks:
        raise UserError(f"task {task!r} is not one of this model's: {', '.join(tasks)}")
    return tasks[task]


def predict_args(tasks: str) -> str:
    """What deepen-predict needs after --run for this model: --task when it has several, a pair for
    a pair task (what it refuses otherwise)."""
    from deepen_run.data.glue import TASKS

    names = [t for t in tasks.split("+") if t in TASKS]
    if not names:
        return '"a sentence"'
    which = f"--task {names[0]} " if len(names) > 1 else ""
    return which + ('--pair "a sentence" "another"' if TASKS[names[0]].text_b else '"a sentence"')


def split_inputs(texts: Sequence[Text], spec) -> tuple[list[str], Optional[list[str]]]:
    """-> (first sentences, second sentences or None); a pair for a one-sentence task, or one
    sentence for a pair task, is refused naming the first such input."""
    if isinstance(texts, str) or (isinstance(texts, tuple) and len(texts) == 2 and spec.text_b
                                  and all(isinstance(t, str) for t in texts)):
        texts = [texts]
    a, b = [], []
    for i, t in enumerate(texts):
        pair = not isinstance(t, str)
        if pair and len(t) != 2:
            raise UserError(f"input {i + 1} has {len(t)} parts; give a sentence or a pair (a, b)")
        if pair and not spec.text_b:
            raise UserError(f"input {i + 1} is a sentence pair, but {spec.name} takes one sentence")
        if not pair and spec.text_b:
            raise UserError(f"input {i + 1} is one sentence, but {spec.name} takes a pair "
                            f"({spec.text_a}, {spec.text_b})")
        a.append(t[0] if pair else t)
        if pair:
            b.append(t[1])
    return a, (b if spec.text_b else None)


def read_stdin(stream) -> list:
    """Lines from a binary stream, UTF-8 (a byte-order mark dropped), as from_lines reads them."""
    import io

    try:  # a text stream splits lines at \n, \r\n and \r only (str.splitlines would at \f, U+2028, ...)
        return from_lines(io.TextIOWrapper(stream, encoding="utf-8-sig"))
    except UnicodeDecodeError as e:
        raise UserError(f"stdin: byte {e.start} is not UTF-8; give UTF-8 text") from None


def check_out(out: Optional[Path], overwrite: bool = False) -> None:
    """--out names a file that can be written: refused before the weights load, not after the model ran.
    A file that exists is the user's: replaced only with --overwrite."""
    if out is None:
        return
    if out.is_dir():
        raise UserError(f"--out {out} is a folder; name a file (e.g. {out / 'predictions.tsv'})")
    parent = next((p for p in out.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise UserError(f"--out {out}: {parent} is a file, not a folder")
    from deepen_run.safe_fs import unwritable

    why = unwritable(out, "--out", overwrite)
    if why:
        raise UserError(why)


def from_lines(lines: Iterable[str]) -> list:
    """Plain lines: a sentence each, or a tab-separated pair."""
    out = []
    for line in lines:
        line = line.rstrip("\n")
        if line.strip():
            parts = line.split("\t")
            out.append(parts[0] if len(parts) == 1 else tuple(parts))
    return out


def read_tsv(path: Path, spec) -> tuple[list[int], list]:
    """-> (idx per row, texts) of a TSV file: with a header naming the task's columns (its train/dev or
    its test file's), or without one: the task's own positions where every row has them (CoLA's
    dev.tsv), else the first column(s)."""
    from deepen_run.data.tsv import unlabelled_columns

    if not path.is_file():
        raise UserError(f"--tsv {path}: no such file")
    try:  # utf-8-sig: a byte-order mark (Excel's, MRPC's dev.tsv) is no part of the first column's name
        with open(path, newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    except UnicodeDecodeError as e:
        raise UserError(f"--tsv {path}: byte {e.start} is not UTF-8; save the file as UTF-8 text") from None
    if not rows:
        return [], []
    head = rows[0]
    named = [[c for c in cols[:2] if c is not None] for cols in (spec.tsv_cols, unlabelled_columns(spec))]
    names = next((n for n in named if n and all(isinstance(c, str) and c in head for c in n)), None)
    if names:
        cols, iid, body = [head.index(c) for c in names], next((head.index(c) for c in INDEX if c in head), None), rows[1:]
    else:
        at = [c for c in spec.tsv_cols[:2] if isinstance(c, int)]
        fits = at and all(len(r) > max(at) for r in rows)
        cols, iid, body = (at if fits else list(range(2 if spec.text_b else 1))), None, rows
    idx, texts = [], []
    for n, row in enumerate(body):
        line = n + 1 + (body is not rows)
        if max(cols) >= len(row):
            raise UserError(f"--tsv {path}: line {line} has {len(row)} columns, {max(cols) + 1} expected")
        vals = [row[c] for c in cols]
        texts.append(vals[0] if len(vals) == 1 else tuple(vals))
        try:
            idx.append(int(row[iid]) if iid is not None else n)
        except ValueError:
            raise UserError(f"--tsv {path}: line {line}: index {row[iid]!r} is not a whole number") from None
    return idx, texts


def header(spec, extras: dict, names: dict) -> list[str]:
    """names: the model's extra_columns, each extras entry's value names (HIRE: alpha/layer_3), else
    their positions."""
    cols = ["idx", "prediction"]
    if not spec.is_regression:
        cols += ["label", "probability"] + [f"p/{n}" for n in spec.label_names]
    for key, values in extras.items():
        cols += [f"{key}/{j}" for j in names.get(key, range(len(values)))]
    return cols


def rows(spec, idx: list[int], preds: list, names: Optional[dict] = None) -> list[str]:
    """TSV lines, the header first."""
    lines = ["\t".join(header(spec, preds[0].extras if preds else {}, names or {}))]
    for i, p in zip(idx, preds):
        if spec.is_regression:
            vals = [str(i), f"{p.score:.4f}"]
        else:
            vals = [str(i), str(p.label_id), p.label, f"{p.probability:.6f}"] + \
                   [f"{p.probabilities[n]:.6f}" for n in spec.label_names]
        for values in p.extras.values():
            vals += [f"{v:.6f}" for v in values]
        lines.append("\t".join(vals))
    return lines


def write(lines: list[str], out: Optional[Path]) -> None:
    text = "\n".join(lines) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
