"""GLUE TSV files: check they exist and parse them row by row, with the standard library only.

Kept apart from data.py (datasets, torch) so the pre-flight can validate every file, with
file:line errors, in a fraction of a second and before any heavy import or MLflow run.
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Optional

from deepen_run.errors import UserError
from deepen_run.glue import TaskSpec

csv.field_size_limit(sys.maxsize)


def check_glue_dir(glue_dir: Optional[str], specs: list[TaskSpec], need_train: bool = True) -> None:
    """Cheap checks before any model loads: the folder and each task's files exist."""
    if glue_dir is None:
        from datasets import config as ds_config  # only on the Hub path: datasets is heavy

        from deepen_run.backbone import hub_reachable

        if not ds_config.HF_HUB_OFFLINE and not hub_reachable():
            raise UserError("data.glue_dir is unset, so GLUE comes from the Hugging Face Hub, which is "
                            "unreachable; set DEEPEN_GLUE_DIR or data.glue_dir=<folder of GLUE TSVs>")
        return
    root = Path(glue_dir)
    if not root.is_dir():
        raise UserError(f"data.glue_dir={glue_dir} does not exist; point it (or DEEPEN_GLUE_DIR) "
                        "at a folder of GLUE TSVs (<TASK>/train.tsv, dev.tsv), or unset it to use the Hub")
    for spec in specs:
        stems = ([("train", "train")] if need_train else []) + list(spec.dev_splits)
        for stem, _ in stems:
            f = root / spec.folder / f"{stem}.tsv"
            if not f.is_file():
                raise UserError(f"task {spec.name}: {f} is missing; put GLUE's {spec.folder}/{stem}.tsv "
                                f"there or drop {spec.name} from task.names")


def read_tsv(path: Path, spec: TaskSpec, labelled: bool) -> dict[str, list]:
    """Parse one GLUE TSV with quoting off (GLUE text contains bare quotes)."""
    cols = {"text_a": [], "text_b": [], "label": [], "idx": []}
    with open(path, encoding="utf-8-sig", newline="") as fh:  # MRPC's header has a BOM
        rows = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        headerless = spec.name == "cola" and labelled
        if headerless:
            width, (ia, ib, il) = 4, spec.tsv_cols
        else:
            header = next(rows, None)
            if header is None:
                raise UserError(f"{path}: the file is empty")
            width = len(header)
            a, b, lab = spec.tsv_cols if labelled else (*_test_cols(spec), None)
            try:
                ia = header.index(a) if isinstance(a, str) else a
                ib = header.index(b) if b is not None else None
                il = header.index(lab) if labelled else None
            except ValueError as e:
                raise UserError(f"{path}: header {header} lacks a column GLUE's {spec.folder} has ({e})")
            iid = header.index("index") if "index" in header else header.index("id") if "id" in header else None
        for n, row in enumerate(rows, start=1 if headerless else 2):
            if len(row) != width:
                raise UserError(f"{path}:{n}: expected {width} tab-separated columns, got {len(row)}")
            cols["text_a"].append(row[ia])
            cols["text_b"].append(row[ib] if ib is not None else None)
            cols["label"].append(_parse_label(row[il], spec, path, n) if labelled else -1)
            cols["idx"].append(int(row[iid]) if not headerless and iid is not None else len(cols["idx"]))
    if not cols["idx"]:
        raise UserError(f"{path}: no data rows (empty split)")
    if spec.text_b is None:
        del cols["text_b"]
    return cols


def _test_cols(spec: TaskSpec):
    if spec.name == "cola":
        return "sentence", None
    if spec.name == "mrpc":
        return "#1 String", "#2 String"
    return spec.tsv_cols[0], spec.tsv_cols[1]


def _parse_label(value: str, spec: TaskSpec, path: Path, line: int):
    if spec.is_regression:
        try:
            return float(value)
        except ValueError:
            raise UserError(f"{path}:{line}: label {value!r} is not a number") from None
    if spec.tsv_label_strings:
        if value in spec.label_names:
            return spec.label_names.index(value)
    elif value.isdigit() and int(value) < spec.num_labels:
        return int(value)
    allowed = spec.label_names if spec.tsv_label_strings else range(spec.num_labels)
    raise UserError(f"{path}:{line}: label {value!r} is not one of {list(allowed)} for {spec.name}")


def validate(glue_dir: Optional[str], specs: list[TaskSpec]) -> None:
    """Parse every train and dev file once (SST-2 train: ~0.1 s), so a bad row or label, or an
    empty split, is reported as file:line before any run is created or model loaded."""
    if glue_dir is None:
        return
    for spec in specs:
        for stem in ["train"] + [s for s, _ in spec.dev_splits]:
            read_tsv(Path(glue_dir) / spec.folder / f"{stem}.tsv", spec, labelled=True)
