"""Which runs are the same experiment: the report's row key, row labels and each row's baseline.

Runs are averaged together only when they share every setting except the seed: the key is the
run's logged config (MLflow params) minus the seed and what does not change the result (where
things are stored, logging and checkpoint cadence, dry_run/predict). A 60-step and a 5-step run
therefore never share a row; the differing setting shows in both rows' labels. The path that chooses
the model (backbone.path) is a setting: another checkpoint is another experiment. The data is keyed by
what the files hold, not where they are: a run tagged data_fingerprint (deepen_run/data/fingerprint.py,
data_id) leaves data.glue_dir out of its key, and where runs of one setting and task trained on
different files, their fingerprint joins their key (data.fingerprint=<id>), so they never merge.
Runs recorded before the tag keep data.glue_dir, `..` and `.` normalised.

Single-task runs of different tasks with otherwise equal settings form one row (tasks are the
table's columns): for them the task list, the schedule and the multi-task epoch length are left out
of the key (a schedule only matters when tasks share the encoder). Multi-task runs keep them.
"""
from __future__ import annotations

import os
import re
from types import MappingProxyType

from deepen_run.config.keys import neutral_keys
from deepen_run.methods import REFERENCE, schemas

# Never part of the key: the seed (what a row averages over) and the keys the schema marks neutral
# (where things live, bookkeeping that cannot change a score: deepen_run/config/schema.py).
IGNORED = neutral_keys(methods=schemas()) | {"seed"}
IGNORED_PREFIXES = ("sweep.", "hydra.")
PATHLIKE_NAME = re.compile(r"(^|[._])(path|dir|uri|file|url)$")
PATHLIKE_VALUE = re.compile(r"^(/|~/|[a-z]+://|[a-z]+:///|pkg://)")
# What a run wrote about its own choices (deepen_run/run/fast.py, train.py): why it chose, and what
# the choice touched. They follow from the key's other settings and the machine: as part of the key,
# train/unpad_linears (a count that grows with duplicated layers) kept every duplicated row from its
# plain baseline.
EXPLAINS = frozenset({"train/precision_reason", "train/attention_reason", "train/dropout_masks_reason",
                      "train/unpad_reason", "train/unpad_linears", "train/dropout_masks_in",
                      "train/threads", "train/threads_reason"})
# Path-like, yet they change the result (the weights, the data): always part of the key.
SEPARATE = frozenset({"backbone.path", "data.glue_dir"})
DATA_TAG, DATA_KEY, DATA_DIR = "data_fingerprint", "data.fingerprint", "data.glue_dir"  # serve/publish.py tags it
MULTI_TASK_ONLY = ("task.names", "schedule.", "train.steps_per_epoch", "train.steps_per_task")
# Shown in their own columns (backbone, method, setup), never repeated in "settings".
SHOWN_ELSEWHERE = ("backbone.name", "method.name", "task.names", "schedule.")
# A method's own options and layer duplication: what the baseline of a row may differ in.
METHOD_SPECIFIC = ("method.", "backbone.duplicate_")
# The value of a *_seed setting that equals the run's seed in every run of the row.
SEED_FOLLOWING = "seed"
# Where no baseline has the row's new-parameter learning-rate scale, one with another may pair with it.
LR_RULE = "train.new_params_lr_scale"


def is_dry(run: dict) -> bool:
    return str(run["params"].get("dry_run", "")).lower() == "true" or \
        str(run["tags"].get("dry_run", "")).lower() in ("true", "1")


def reportable(run: dict) -> bool:
    """What the report's rows are made of: a FINISHED run of GLUE tasks that trained (not a sweep's
    parent, not a dry run)."""
    return run["status"] == "FINISHED" and run["tags"].get("sweep_role") != "parent" and "task" in run["tags"] \
        and not is_dry(run)


def tasks_of(run: dict) -> list[str]:
    return run["tags"]["task"].split("+")


# Keys added after runs were recorded without them: at its default (as logged), a run has the same
# setting as one logged before the key existed, so both share a row.
ADDED_LATER = MappingProxyType({"train.layer_decay": "1.0", "train.early_stopping_patience": "None",
                                "train.early_stopping_threshold": "0.0", "train.attention": "auto",
                                "train.dropout_masks": "auto"})


def _ignored(k: str, v: str, multi: bool) -> bool:
    if ADDED_LATER.get(k) == v:
        return True
    if k in SEPARATE:
        return False
    if k in IGNORED or k.startswith(IGNORED_PREFIXES) or PATHLIKE_NAME.search(k) or k in EXPLAINS:
        return True
    if PATHLIKE_VALUE.match(str(v)):
        return True
    return not multi and k.startswith(MULTI_TASK_ONLY)


def settings(run: dict, fold: bool = False) -> dict[str, str]:
    """The run's settings that must be equal for two runs to share a row; fold: a *_seed setting
    equal to the run's seed reads "seed" (keys(), which folds only where several seeds follow)."""
    tags, multi = run["tags"], len(tasks_of(run)) > 1
    out = {k: str(v) for k, v in run["params"].items() if not _ignored(k, str(v), multi)}
    if tags.get(DATA_TAG):
        out.pop(DATA_DIR, None)  # where the data is; keys() adds what it holds where that differs
    for k in SEPARATE & out.keys():
        if out[k].startswith("/"):
            out[k] = os.path.normpath(out[k])
    seed = str(run["params"].get("seed", tags.get("seed", "")))
    for k, v in out.items():
        if fold and k.endswith("_seed") and v == seed:
            # A draw that follows the run's seed (e.g. method.random_seed=${seed}: a fresh draw per
            # seed) varies like the seed: its runs share a row, labelled random_seed=seed.
            out[k] = SEED_FOLLOWING
    # Runs logged without the full config (or older runs): fall back on the identity tags.
    out.setdefault("backbone.name", tags.get("backbone", "?"))
    out.setdefault("method.name", tags.get("method", "?"))
    if multi:
        out.setdefault("task.names", tags["task"])
        out.setdefault("schedule.name", tags.get("schedule", "?"))
    return out


def key_of(run: dict, fold: bool = False) -> tuple:
    return tuple(sorted(settings(run, fold).items()))


def keys(runs: list[dict]) -> list[tuple]:
    """Each run's row key. A *_seed setting that equals the run's seed is folded into "seed" where
    two seeds or more of the same other settings follow theirs (a fresh draw per seed), never for a
    lone run whose fixed draw happens to equal its seed (random_seed=0 at seed 0)."""
    raw = [key_of(r) for r in runs]
    folded = [key_of(r, fold=True) for r in runs]
    seeds: dict[tuple, set] = {}
    for r, k, f in zip(runs, raw, folded):
        if f != k:
            seeds.setdefault(f, set()).add(str(r["params"].get("seed", r["tags"].get("seed"))))
    return with_data([f if f != k and len(seeds[f]) > 1 else k for k, f in zip(raw, folded)], runs)


def with_data(keys: list[tuple], runs: list[dict]) -> list[tuple]:
    """The data's fingerprint joins the key of the runs whose setting and task also ran on other files
    (a changed copy of GLUE); elsewhere it stays out, so single-task runs of different tasks (different
    files, one row) still share their row."""
    seen: dict[tuple, set] = {}
    for k, r in zip(keys, runs):
        seen.setdefault((k, r["tags"].get("task")), set()).add(r["tags"].get(DATA_TAG))
    return [tuple(sorted(k + ((DATA_KEY, str(r["tags"].get(DATA_TAG))),)))
            if len(seen[(k, r["tags"].get("task"))]) > 1 else k for k, r in zip(keys, runs)]


def setup(key: tuple) -> str:
    d = dict(key)
    if "task.names" not in d:
        return "single-task"
    names = d["task.names"].strip("[]").replace("'", "").replace(", ", "+").replace(",", "+")
    return f"multi-task {names}, {d.get('schedule.name', '?')}"


def _short(k: str) -> str:
    return k.split(".", 1)[1] if k.startswith(METHOD_SPECIFIC) else k


def labels(keys: list[tuple]) -> dict[tuple, str]:
    """Each row's settings that differ between rows: a method's options only where they differ
    between rows of that method (gru_layers=2, not every default of HIRE), any other setting
    where it differs between any rows (train.max_steps=60 vs train.max_steps=5)."""
    ds = [dict(k) for k in keys]

    def varies(k: str, d: dict) -> bool:
        if k.startswith(SHOWN_ELSEWHERE):
            return False
        peers = [x for x in ds if x["method.name"] == d["method.name"]] if k.startswith("method.") else ds
        return len({x.get(k) for x in peers}) > 1

    return {key: " ".join(f"{_short(k)}={v}" for k, v in sorted(d.items()) if varies(k, d)) or "-"
            for key, d in zip(keys, ds)}


def _no_duplication(d: dict) -> bool:
    return d.get("backbone.duplicate_layers", "[]") in ("[]", "None", "null", "") and \
        d.get("method.layers", "[]") in ("[]", "None", "null", "")


def _rest(d: dict, drop_multi: bool = False, drop_lr: bool = False) -> dict:
    return {k: v for k, v in d.items() if not k.startswith(METHOD_SPECIFIC)
            and not (drop_multi and k.startswith(MULTI_TASK_ONLY)) and not (drop_lr and k == LR_RULE)}


def baseline_candidates(key: tuple, keys: list[tuple]) -> list[tuple]:
    """The rows that can be the row's baseline: method=baseline, no duplicated layers, every other
    setting equal. A multi-task row is compared with the multi-task baselines of the same tasks and
    schedule, else with the single-task ones (every setting but the multi-task ones equal). Without
    one at the same new-parameter learning-rate scale, one at another (a study that picks the scale
    per method, docs/study.md). Several candidates (baselines differing in a method option, e.g.
    pooling) are the caller's to resolve."""
    d = dict(key)
    bases = [k for k in keys if dict(k)["method.name"] == REFERENCE and _no_duplication(dict(k))]
    for drop_lr in (False, True):
        same = [b for b in bases if _rest(dict(b), drop_lr=drop_lr) == _rest(d, drop_lr=drop_lr)]
        if not same and "task.names" in d:
            same = [b for b in bases if "task.names" not in dict(b)
                    and _rest(dict(b), True, drop_lr) == _rest(d, True, drop_lr)]
        if same:
            return same
    return []
