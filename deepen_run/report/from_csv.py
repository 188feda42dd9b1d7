"""deepen-report --from-csv: the report's rows rebuilt from a published per-seed CSV (--seeds-csv's
format), with no MLflow store, so a study's tables and contrasts can be recomputed from the repo.

The seeds CSV gives each row's label (backbone, method, setup, settings) and its per-seed values;
the row's settings are read back from its label (`key=value` pairs; a key without a dot is a method
option, or a backbone one for duplicate_*, as deepen_run/report/rows.py shortens them), which is
enough to find each row's baseline and to name rows in --contrast. A second CSV (--rows-csv, one line
a row) may add what the per-seed file lacks: parameter counts and step times, as the MLflow report
printed them.
"""
from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

from deepen_run.errors import UserError
from deepen_run.report import contrasts as rc
from deepen_run.report import rows as rr

SEEDS_COLUMNS = ("row", "backbone", "method", "setup", "settings", "task", "seed", "value")
SIZE_COLUMNS = ("params_total", "params_trainable", "x_backbone", "x_backbone_all", "step_time_s")
# One setting of a label: key=value, where a value may be a list with spaces ("[1, 2]").
SETTING = re.compile(r"(\S+?)=(\[[^\]]*\]|\S+)")


def config_of(backbone: str, method: str, setup: str, settings: str) -> dict[str, str]:
    """The row's settings as the report's config keys (enough for baselines and row selectors)."""
    cfg = {"backbone.name": backbone, "method.name": method}
    for k, v in SETTING.findall("" if settings == "-" else settings):
        if "." not in k:
            k = ("backbone." if k.startswith("duplicate_") else "method.") + k
        cfg[k] = v
    if setup.startswith("multi-task "):  # "multi-task sst2+stsb, annealed"
        tasks, _, schedule = setup[len("multi-task "):].partition(", ")
        cfg["task.names"] = "[" + ", ".join(tasks.split("+")) + "]"
        cfg["schedule.name"] = schedule
    return cfg


# Left out of a published key: where this machine keeps GLUE, and what a run chose for itself
# (train/precision, train/optimizer_impl: params with a slash). Files of one study published from
# several machines join on the settings the study sets.
LOCAL = ("data.glue_dir",)
CHOSEN = "train/"


def key_of(line: dict, path: Path, n: int) -> tuple | None:
    """The row's whole key from the config column (newer CSVs); None: rebuild it from the label."""
    if not line.get("config"):
        return None
    try:
        cfg = json.loads(line["config"])
        # As rows.settings: a job published after a setting was added, at its default, joins the rows
        # of the jobs published before it (rows.ADDED_LATER); a single-task key has no multi-task keys.
        multi = "task.names" in cfg
        return tuple(sorted((k, v) for k, v in cfg.items() if k not in LOCAL and not k.startswith(CHOSEN)
                            and rr.ADDED_LATER.get(k) != v and (multi or not k.startswith(rr.MULTI_TASK_ONLY))))
    except (ValueError, AttributeError):
        raise UserError(f"{path}, line {n}: the config column is not a JSON object of settings") from None


def fold_seeds(pairs: list[tuple[dict, tuple]]) -> list[tuple]:
    """Each (row, key)'s key, a *_seed setting equal to the row's only seed read as "seed" where two
    seeds or more of otherwise equal settings follow theirs: a fresh draw per seed, published one job
    a file, is one row, as the store's report folds it (deepen_run/report/rows.py, keys)."""
    folded, seeds = [], {}
    for r, k in pairs:
        own = {s for by_seed in r["per_seed"].values() for s in by_seed}
        f = tuple((n, "seed" if n.endswith("_seed") and len(own) == 1 and v in own else v) for n, v in k)
        folded.append(f)
        if f != k:
            seeds.setdefault(f, set()).update(own)
    return [f if f != k and len(seeds[f]) > 1 else k for (_, k), f in zip(pairs, folded)]


def _read(path: Path, need: tuple[str, ...]) -> list[dict]:
    if not path.is_file():
        raise UserError(f"--from-csv: no file {path}")
    try:
        with path.open(newline="", encoding="utf-8") as f:
            lines = list(csv.DictReader(f))
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}); --from-csv reads the CSV deepen-report "
                        "--seeds-csv writes") from None
    except csv.Error as e:
        raise UserError(f"{path}: not a CSV file ({e})") from None
    missing = [c for c in need if lines and c not in lines[0]]
    if not lines or missing:
        raise UserError(f"{path}: {'no rows' if not lines else 'no column ' + ', '.join(missing)} "
                        f"(the format deepen-report --seeds-csv writes: {', '.join(need)})")
    return lines


def _size(text, path: Path, column: str):
    if text in ("", "None", None):
        return None
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v):
        raise UserError(f"{path}: {column} {text!r} is not a finite number")
    return v


def load(seeds: Path, sizes: Path | None = None) -> tuple[list[dict], list[tuple]]:
    """(rows, keys): rows as report.build makes them (ids and order of the CSV), keys their settings."""
    rows: dict[int, dict] = {}
    for n, line in enumerate(_read(seeds, SEEDS_COLUMNS), 2):
        try:
            rid, value = int(line["row"]), float(line["value"])
        except (ValueError, TypeError):
            raise UserError(f"{seeds}, line {n}: row {line['row']!r} / value {line['value']!r} is not a number") from None
        if not math.isfinite(value):  # nan, inf, 1e310: no mean or interval can be made of it
            raise UserError(f"{seeds}, line {n}: value {line['value']!r} is not a finite number")
        if not (line.get("seed") or "").strip() or not (line.get("task") or "").strip():
            raise UserError(f"{seeds}, line {n}: the {'seed' if (line.get('task') or '').strip() else 'task'} cell "
                            "is empty; every value needs its task and seed (seeds pair the rows)")
        r = rows.setdefault(rid, {"id": rid, **{k: line[k] for k in ("backbone", "method", "setup", "settings")},
                                  "per_seed": {}, "repeats": [], "commits": {}} | dict.fromkeys(SIZE_COLUMNS)
                             | {"key": key_of(line, seeds, n)})
        seeds_of = r["per_seed"].setdefault(line["task"], {})
        if line["seed"] in seeds_of:
            raise UserError(f"{seeds}, line {n}: row {rid}, {line['task']}, seed {line['seed']} appears twice")
        seeds_of[line["seed"]] = value
        for c in (line.get("git_commits") or "").split():
            r["commits"].setdefault(c, []).append(line["seed"])
    ids = sorted(rows)
    if ids != list(range(1, len(ids) + 1)):
        raise UserError(f"{seeds}: rows must be numbered 1..{len(ids)}, found {ids}")
    for r in rows.values():
        r["commits"] = {c: sorted(set(s), key=rc.seed_order) for c, s in r["commits"].items()}
        r["per_seed"] = {t: dict(sorted(v.items(), key=lambda kv: rc.seed_order(kv[0]))) for t, v in r["per_seed"].items()}
    if sizes is not None:
        for line in _read(sizes, ("row", *SIZE_COLUMNS)):
            rid = int(line["row"])
            if rid not in rows:
                raise UserError(f"{sizes}: row {rid} is not in {seeds}")
            rows[rid] |= {k: _size(line[k], sizes, k) for k in SIZE_COLUMNS}
    out = [rows[i] for i in ids]
    keys = [r.pop("key") or tuple(sorted(config_of(r["backbone"], r["method"], r["setup"], r["settings"]).items()))
            for r in out]
    for r, k in zip(out, keys):
        r["config"] = dict(k)
    return out, keys


def load_all(seeds: list[Path], sizes: Path | None = None) -> tuple[list[dict], list[tuple]]:
    """Several per-seed CSVs as one table: a study run in parts over several sessions, each preset's values
    published on their own (scripts/study.py writes them under docs/results/s3/). Rows with the same
    settings are one row, numbered in the order they first appear; a task and seed that two files both
    give is refused, not silently picked."""
    if len(seeds) == 1:
        return load(seeds[0], sizes)
    if sizes is not None:
        raise UserError("--rows-csv numbers the rows of one --from-csv file; give one --from-csv with it")
    loaded = [(path, r, k) for path in seeds for r, k in zip(*load(path))]
    merged: dict[tuple, dict] = {}
    for (path, r, _), k in zip(loaded, fold_seeds([(r, k) for _, r, k in loaded])):
        into = merged.setdefault(k, r | {"id": len(merged) + 1, "per_seed": {}, "commits": {}, "config": dict(k)})
        for task, values in r["per_seed"].items():
            have = into["per_seed"].setdefault(task, {})
            twice = sorted(set(have) & set(values), key=rc.seed_order)
            if twice:
                raise UserError(f"{path}: row {r['settings']!r}, {task}, seed {twice[0]} is also in an earlier "
                                "--from-csv file")
            into["per_seed"][task] = dict(sorted((have | values).items(), key=lambda kv: rc.seed_order(kv[0])))
        for c, s in r["commits"].items():
            into["commits"][c] = sorted(set(into["commits"].get(c, [])) | set(s), key=rc.seed_order)
    # Each file labelled its rows against its own rows only (one job a file: "-"): label them again.
    label = rr.labels(list(merged))
    for k, r in merged.items():
        r["settings"] = label[k]
    return list(merged.values()), list(merged)
