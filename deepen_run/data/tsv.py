"""GLUE TSV files: check they exist and parse them row by row, with the standard library only.

Kept apart from loaders.py (datasets, torch) so the pre-flight can validate every file, with
file:line errors, in a fraction of a second and before any heavy import or MLflow run.
"""
from __future__ import annotations

import csv
import io
import math
import os
import sys
from pathlib import Path
from typing import Optional

from deepen_run.errors import UserError
from deepen_run.util import hub_reachable
from deepen_run.data.glue import AX, DIAGNOSED_BY, TaskSpec

csv.field_size_limit(sys.maxsize)


def check_glue_dir(glue_dir: Optional[str], specs: list[TaskSpec], need_train: bool = True,
                   need_test: bool = False) -> None:
    """Cheap checks before any model loads: the folder and each task's files exist and are readable
    (need_test: predict=true also reads the test splits)."""
    if glue_dir is None:
        from datasets import config as ds_config  # only on the Hub path: datasets is heavy

        if not ds_config.HF_HUB_OFFLINE and not hub_reachable():
            raise UserError("data.glue_dir is unset, so GLUE comes from the Hugging Face Hub, which is "
                            "unreachable; set DEEPEN_GLUE_DIR or data.glue_dir=<folder of GLUE TSVs>")
        if ds_config.HF_HUB_OFFLINE and not _in_hf_cache(ds_config.HF_DATASETS_CACHE, specs):
            raise UserError("data.glue_dir is unset and HF_HUB_OFFLINE=1, but GLUE is not in the Hugging Face "
                            f"cache ({ds_config.HF_DATASETS_CACHE}); set DEEPEN_GLUE_DIR or data.glue_dir=<folder "
                            "of GLUE TSVs>")
        return
    if not str(glue_dir).strip():  # DEEPEN_GLUE_DIR= (set, empty): Path("") would read the current folder
        raise UserError("data.glue_dir is empty (is DEEPEN_GLUE_DIR set to nothing?): give the folder of GLUE "
                        "TSVs, or unset it to use the Hugging Face Hub")
    root = Path(glue_dir)
    hint = "point it (or DEEPEN_GLUE_DIR) at a folder of GLUE TSVs (<TASK>/train.tsv, dev.tsv), or unset it to use the Hub"
    if root.exists() and not root.is_dir():
        raise UserError(f"data.glue_dir={glue_dir} is a file, not a folder; {hint}")
    if not root.is_dir():
        raise UserError(f"data.glue_dir={glue_dir} does not exist; {hint}")
    for spec in specs:
        stems = ([("train", "")] if need_train else []) + [(s, "") for s, _ in spec.dev_splits]
        stems += [(s, "predict=true: ") for s, _ in spec.test_splits] if need_test else []
        for stem, why in stems:
            f = root / spec.folder / f"{stem}.tsv"
            # The folders first: in a folder without search (x) permission, is_file() raises EACCES.
            # Root reads anything, so for root os.access is true and the read itself is the test.
            for d in (root, root / spec.folder):
                if d.is_dir() and not os.access(d, os.R_OK | os.X_OK):
                    raise UserError(f"task {spec.name}: folder {d} is not readable (permissions); chmod it")
            try:
                present = f.is_file()
            except OSError as e:  # any other reason the file cannot even be looked at
                raise UserError(f"task {spec.name}: cannot look at {f} ({e.strerror}); check the folder") from None
            if not present:
                raise UserError(f"{why}task {spec.name}: {f} is missing; put GLUE's {spec.folder}/{stem}.tsv "
                                f"there or drop {spec.name} from task.names")
            if not os.access(f, os.R_OK):
                raise UserError(f"task {spec.name}: {f} is not readable (permissions); chmod it")


def _in_hf_cache(datasets_cache: str, specs: list[TaskSpec]) -> bool:
    """Offline, `load_dataset("nyu-mll/glue", task)` can only read a cached copy: the prepared one in the
    datasets cache, or the raw files in the Hub cache. Looking for their folders is cheap and saves
    loading the model only to fail on the data."""
    from huggingface_hub import constants

    if (Path(constants.HF_HUB_CACHE) / "datasets--nyu-mll--glue").is_dir():
        return True
    return all((Path(datasets_cache) / "nyu-mll___glue" / s.name).is_dir() for s in specs)


def _text(path: Path) -> str:
    """The whole file as text; a byte that is not UTF-8 is reported as file:line."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror})") from None
    try:
        return raw.decode("utf-8-sig")  # MRPC's header has a BOM
    except UnicodeDecodeError as e:
        bom = 3 if raw.startswith(b"\xef\xbb\xbf") else 0
        line = raw[:e.start + bom].count(b"\n") + 1
        raise UserError(f"{path}:{line}: byte {raw[e.start + bom:e.start + bom + 1]!r} is not UTF-8; "
                        "GLUE files are UTF-8 text") from None


def read_tsv(path: Path, spec: TaskSpec, labelled: bool) -> dict[str, list]:
    """Parse one GLUE TSV with quoting off (GLUE text contains bare quotes)."""
    cols = {"text_a": [], "text_b": [], "label": [], "idx": []}
    with io.StringIO(_text(path), newline="") as fh:
        rows = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        headerless = spec.name == "cola" and labelled
        if headerless:
            width, (ia, ib, il) = 4, spec.tsv_cols
        else:
            header = next(rows, None)
            if header is None:
                raise UserError(f"{path}: the file is empty")
            width = len(header)
            a, b, lab = spec.tsv_cols if labelled else (*unlabelled_columns(spec), None)
            try:
                ia = header.index(a) if isinstance(a, str) else a
                ib = header.index(b) if b is not None else None
                il = header.index(lab) if labelled else None
            except ValueError as e:
                raise UserError(f"{path}: header {header} lacks a column GLUE's {spec.folder} has ({e})") from None
            iid = header.index("index") if "index" in header else header.index("id") if "id" in header else None
        for n, row in enumerate(rows, start=1 if headerless else 2):
            if len(row) != width:
                raise UserError(f"{path}:{n}: expected {width} tab-separated columns, got {len(row)}")
            cols["text_a"].append(row[ia])
            cols["text_b"].append(row[ib] if ib is not None else None)
            cols["label"].append(_parse_label(row[il], spec, path, n) if labelled else -1)
            cols["idx"].append(_parse_index(row[iid], path, n) if not headerless and iid is not None
                               else len(cols["idx"]))
    if not cols["idx"]:
        raise UserError(f"{path}: no data rows (empty split)")
    if spec.text_b is None:
        del cols["text_b"]
    return cols


def unlabelled_columns(spec: TaskSpec):
    """The text columns of the task's test.tsv, by name (CoLA's test file has a header, its train and dev none)."""
    if spec.name == "cola":
        return "sentence", None
    if spec.name == "mrpc":
        return "#1 String", "#2 String"
    return spec.tsv_cols[0], spec.tsv_cols[1]


def _parse_index(value: str, path: Path, line: int) -> int:
    if not (value.isascii() and value.isdigit()):  # isdigit alone passes '²', which int() rejects
        raise UserError(f"{path}:{line}: index {value!r} is not a non-negative integer")
    return int(value)


STSB_RANGE = (0.0, 5.0)  # GLUE's STS-B similarity scores


def _parse_label(value: str, spec: TaskSpec, path: Path, line: int):
    if spec.is_regression:
        try:
            score = float(value)
        except ValueError:
            raise UserError(f"{path}:{line}: label {value!r} is not a number") from None
        lo, hi = STSB_RANGE
        if not (math.isfinite(score) and lo <= score <= hi):  # float() accepts nan and inf
            raise UserError(f"{path}:{line}: label {value!r} is not a score in [{lo:g}, {hi:g}]")
        return score
    if spec.tsv_label_strings:
        if value in spec.label_names:
            return spec.label_names.index(value)
    elif value.isascii() and value.isdigit() and int(value) < spec.num_labels:  # not '²
        return int(value)
    allowed = spec.label_names if spec.tsv_label_strings else range(spec.num_labels)
    raise UserError(f"{path}:{line}: label {value!r} is not one of {list(allowed)} for {spec.name}")


def validate(glue_dir: Optional[str], specs: list[TaskSpec], test: bool = False) -> None:
    """Parse every train and dev file once (SST-2 train: ~0.1 s), and the test files when
    predict=true, so a bad row or label, or an empty split, is reported as file:line before any
    run is created or model loaded."""
    if glue_dir is None:
        return
    for spec in specs:
        for stem in ["train"] + [s for s, _ in spec.dev_splits]:
            read_tsv(Path(glue_dir) / spec.folder / f"{stem}.tsv", spec, labelled=True)
        for stem, _ in spec.test_splits if test else ():
            read_tsv(Path(glue_dir) / spec.folder / f"{stem}.tsv", spec, labelled=False)
        ax = Path(glue_dir) / AX.folder / "diagnostic.tsv"
        if test and spec.name == DIAGNOSED_BY and ax.is_file():  # optional, but a bad row is still one line
            read_tsv(ax, AX, labelled=False)
