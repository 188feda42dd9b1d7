"""What each GLUE task is: its columns, labels, metrics and file names.

Label ids follow the Hub's nyu-mll/glue so both data sources give identical datasets.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Optional


@dataclass(frozen=True)
class TaskSpec:
    name: str  # our key: cola, sst2, ...
    folder: str  # GLUE folder: CoLA, SST-2, ...
    text_a: str  # Hub column names
    text_b: Optional[str]
    label_names: tuple[str, ...]  # Hub order; empty = regression
    metrics: tuple[str, ...]
    # TSV column names for (text_a, text_b, label); CoLA has no header, so indices there.
    tsv_cols: tuple = ()
    dev_splits: tuple[tuple[str, str], ...] = (("dev", "validation"),)  # (tsv stem, hub split)
    test_splits: tuple[tuple[str, str], ...] = (("test", "test"),)
    eval_names: tuple[str, ...] = ()  # metric prefixes, one per dev split
    submission: tuple[str, ...] = ()  # GLUE server file stems, one per test split
    # Labels in the TSV are the label strings (else ints that already equal the Hub ids).
    tsv_label_strings: bool = False

    @property
    def is_regression(self) -> bool:
        return not self.label_names

    @property
    def num_labels(self) -> int:
        return len(self.label_names) or 1


def _spec(name, folder, a, b, labels, metrics, tsv_cols, **kw) -> TaskSpec:
    kw.setdefault("eval_names", (name,))
    kw.setdefault("submission", (folder,))
    return TaskSpec(name, folder, a, b, tuple(labels), tuple(metrics), tuple(tsv_cols), **kw)


ENTAIL2 = ("entailment", "not_entailment")
TASKS: MappingProxyType = MappingProxyType({
    s.name: s
    for s in [
        _spec("cola", "CoLA", "sentence", None, ("unacceptable", "acceptable"),
              ["matthews_correlation"], (3, None, 1)),
        _spec("sst2", "SST-2", "sentence", None, ("negative", "positive"),
              ["accuracy"], ("sentence", None, "label")),
        _spec("mrpc", "MRPC", "sentence1", "sentence2", ("not_equivalent", "equivalent"),
              ["accuracy", "f1"], ("#1 String", "#2 String", "Quality")),
        _spec("stsb", "STS-B", "sentence1", "sentence2", (),
              ["pearson", "spearmanr"], ("sentence1", "sentence2", "score")),
        _spec("qqp", "QQP", "question1", "question2", ("not_duplicate", "duplicate"),
              ["accuracy", "f1"], ("question1", "question2", "is_duplicate")),
        _spec("mnli", "MNLI", "premise", "hypothesis", ("entailment", "neutral", "contradiction"),
              ["accuracy"], ("sentence1", "sentence2", "gold_label"),
              dev_splits=(("dev_matched", "validation_matched"),
                          ("dev_mismatched", "validation_mismatched")),
              test_splits=(("test_matched", "test_matched"), ("test_mismatched", "test_mismatched")),
              eval_names=("mnli-m", "mnli-mm"), submission=("MNLI-m", "MNLI-mm"),
              tsv_label_strings=True),
        _spec("qnli", "QNLI", "question", "sentence", ENTAIL2,
              ["accuracy"], ("question", "sentence", "label"), tsv_label_strings=True),
        _spec("rte", "RTE", "sentence1", "sentence2", ENTAIL2,
              ["accuracy"], ("sentence1", "sentence2", "label"), tsv_label_strings=True),
        _spec("wnli", "WNLI", "sentence1", "sentence2", ("not_entailment", "entailment"),
              ["accuracy"], ("sentence1", "sentence2", "label")),
    ]
})

# GLUE's diagnostic set (the leaderboard's AX.tsv): MNLI's labels, predicted by the MNLI head, from
# diagnostic/diagnostic.tsv (download_glue_data.py's layout) or the Hub's `ax` test split.
AX = TaskSpec("ax", "diagnostic", "premise", "hypothesis", TASKS["mnli"].label_names, (),
              ("sentence1", "sentence2", None), dev_splits=(), test_splits=(("diagnostic", "test"),),
              submission=("AX",), tsv_label_strings=True)
DIAGNOSED_BY = "mnli"  # the task whose head predicts AX


def get_tasks(names) -> list[TaskSpec]:
    from deepen_run.errors import UserError

    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise UserError(f"unknown task {unknown[0]!r} in task.names; choose from {', '.join(TASKS)}")
    if len(set(names)) != len(names):
        raise UserError(f"task.names lists a task twice: {list(names)}")
    if not names:
        raise UserError("task.names is empty; give at least one task, e.g. task=sst2")
    return [TASKS[n] for n in names]
