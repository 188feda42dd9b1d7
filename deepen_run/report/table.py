"""The results table itself: rows of runs that share every setting but the seed, each task's
mean metric over the seeds, each row's baseline and paired difference, the contrasts
(deepen-report's CLI is deepen_run/report/main.py; the module docstring there says what a row and a
column are)."""
from __future__ import annotations

import json
import math
import statistics
from types import MappingProxyType
from typing import Optional

from deepen_run.data.glue import TASKS
from deepen_run.data.metrics import UNDEFINED_VALUE
from deepen_run.errors import UserError
from deepen_run.methods import REFERENCE
from deepen_run.report import contrasts as rc
from deepen_run.report import rows as rr


SIZES = MappingProxyType({"params_total": "params/total", "params_trainable": "params/trainable",
                          "x_backbone": "params/ratio", "step_time_s": "train/step_time_s"})


def task_value(metrics: dict[str, float], task: str) -> Optional[float]:
    """A task's mean official metric x100 in one run, or None when the run did not evaluate it. An
    undefined metric (logged NaN: STS-B's correlations of a constant prediction) counts as
    UNDEFINED_VALUE, as in the run's own eval/score: dropped, the collapsed seed would leave its row."""
    spec = TASKS[task]
    vals = [metrics.get(f"eval/{name}/{m}") for name in spec.eval_names for m in spec.metrics]
    vals = [v if math.isfinite(v) else UNDEFINED_VALUE for v in vals if v is not None]
    return 100 * sum(vals) / len(vals) if vals else None


def _stats(vals: list[float]) -> dict:
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else None,
            "n": len(vals)}


def paired_delta(row: dict[str, dict], base: dict[str, dict]) -> Optional[dict]:
    """Row minus baseline in the average over their common tasks, paired by seed (per_seed dicts):
    the mean of the per-seed differences with a 95% t interval (n-1 degrees of freedom); None
    without a common seed, no interval with one."""
    tasks = [t for t in row if t in base]
    d = rc.paired(rc.seed_avgs(row, tasks), rc.seed_avgs(base, tasks))
    return None if d is None else {k: d[k] for k in ("mean", "lo", "hi", "n")}


def _commits(runs: list[dict]) -> dict[str, list[str]]:
    """git_commit tag -> the seeds run at it (runs logged without the tag: "unrecorded")."""
    out: dict[str, set[str]] = {}
    for r in runs:
        out.setdefault(r["tags"].get("git_commit", "unrecorded"), set()).add(str(r["tags"].get("seed", r["run_id"])))
    return {c: sorted(s, key=rc.seed_order) for c, s in sorted(out.items())}


def _baseline(key: tuple, keys: list[tuple], picked: set[tuple], label: dict) -> Optional[tuple]:
    """The row's baseline: itself when it is one; the one candidate; else the one picked by --baseline."""
    cands = rr.baseline_candidates(key, keys)
    if key in cands or not cands:
        return key if key in cands else None
    chosen = [c for c in cands if c in picked] if len(cands) > 1 else cands
    if len(chosen) == 1:
        return chosen[0]
    d = dict(key)
    names = ", ".join(f"row {keys.index(c) + 1} ({label[c]})" for c in cands)
    raise UserError(f"row {keys.index(key) + 1} ({d['method.name']}, {rr.setup(key)}, {label[key]}) has "
                    f"{len(cands)} candidate baselines: {names}; pick one with --baseline ROW or --baseline "
                    f"'KEY=VALUE ...' (e.g. --baseline {keys.index(cands[0]) + 1} or --baseline '{label[cands[0]]}')")


def _sizes(runs: list[dict]) -> dict:
    """Mean parameter counts and step time of a row's runs. x_backbone_all: the parameters that
    serve all the row's tasks, in backbones: one model per task for single-task rows (the sum of the
    tasks' ratios), the one shared model for a multi-task row."""
    out = {}
    for name, metric in SIZES.items():
        vals = [r["metrics"][metric] for r in runs if metric in r["metrics"]]
        out[name] = statistics.fmean(vals) if vals else None
    ratios: dict[str, list[float]] = {}
    for r in runs:
        if "params/ratio" in r["metrics"]:
            ratios.setdefault(r["tags"]["task"], []).append(r["metrics"]["params/ratio"])
    out["x_backbone_all"] = sum(statistics.fmean(v) for v in ratios.values()) if ratios else None
    return out


def build(runs: list[dict], only: Optional[list[str]] = None, contrasts: Optional[list[str]] = None,
          baselines: Optional[list[str]] = None, default_contrasts: bool = True) -> dict:
    """runs: tracking.find_runs dicts; only: these tasks' columns (and average, delta) alone;
    contrasts: "A:B" specs (report/contrasts.py, parse) on top of every row vs its baseline (unless
    default_contrasts=False); baselines: --baseline specs, which pick among several candidates.
    Returns {"tasks": [...], "rows": [...], "contrasts": [...]}; a row has id (1-based), backbone,
    method, setup, settings (its label), config (its full settings), per task and "avg" {"mean",
    "std", "n"} or None, per_seed {task: {seed: value}}, "delta" (vs its baseline) and "baseline"
    (that row's id), commits {git_commit: seeds}, repeats (seeds run more than once), run_ids (its
    runs), the sizes and "n" (seeds)."""
    groups: dict[tuple, dict[str, list[tuple[str, float, dict]]]] = {}  # key -> task -> [(seed, value, run)]
    members: dict[tuple, list[dict]] = {}
    runs = [r for r in runs if rr.reportable(r)]
    for r, key in zip(runs, rr.keys(runs)):
        tags = r["tags"]
        for t in rr.tasks_of(r):
            v = task_value(r["metrics"], t) if t in TASKS and (only is None or t in only) else None
            if v is not None:
                groups.setdefault(key, {}).setdefault(t, []).append((tags.get("seed", r["run_id"]), v, r))
                if r not in members.setdefault(key, []):
                    members[key].append(r)
    order = [t for t in TASKS if any(t in g for g in groups.values())]
    keys = sorted(groups, key=lambda k: (rr.setup(k) != "single-task", dict(k)["method.name"] != REFERENCE, k))
    label = rr.labels(keys)
    rows = []
    for i, key in enumerate(keys, 1):
        d = dict(key)
        ps, repeats = rc.per_seed({t: groups[key][t] for t in order if t in groups[key]})
        row = {"id": i, "backbone": d["backbone.name"], "method": d["method.name"], "setup": rr.setup(key),
               "settings": label[key], "config": d, "per_seed": ps, "repeats": repeats,
               "commits": _commits(members[key]), "run_ids": [r["run_id"] for r in members[key]]}
        rows.append(row | _sizes(members[key]))
    return finish(rows, keys, label, order, contrasts, baselines, default_contrasts)


def finish(rows: list[dict], keys: list[tuple], label: dict, order: list[str], contrasts: Optional[list[str]],
           baselines: Optional[list[str]], default_contrasts: bool) -> dict:
    """The table from rows that hold their per_seed values (from MLflow, or --from-csv): each task's
    cell, the average, each row's baseline and delta, the contrasts."""
    for row in rows:
        ps = row["per_seed"]
        for t in order:
            # One value a seed (a seed run by two sweeps counts once), so n and the std are over seeds.
            row[t] = _stats(list(ps[t].values())) if t in ps else None
        # The average's spread is over the seeds that have every task of the row.
        avgs = list(rc.seed_avgs(ps, list(ps)).values())
        row["avg"] = {"mean": statistics.fmean(row[t]["mean"] for t in ps),
                      "std": _stats(avgs)["std"] if avgs else None, "n": len(avgs)}
        row["n"] = max(len(v) for v in ps.values())
    picked: set[tuple] = set()  # --baseline: the rows it names; among a row's candidates, one must remain
    for b in baselines or []:
        ids = rc.matches(b, rows, f"--baseline {b!r}")
        if not ids:
            raise UserError(f"--baseline {b!r} matches no row")
        picked |= {keys[i - 1] for i in ids}
    for key, row in zip(keys, rows):
        base = _baseline(key, keys, picked, label)
        row["baseline"] = keys.index(base) + 1 if base is not None else None
        row["delta"] = paired_delta(row["per_seed"], rows[row["baseline"] - 1]["per_seed"]) \
            if base is not None and base != key else None
    return {"tasks": order, "rows": rows, "contrasts": rc.compute(rows, contrasts or [], default_contrasts)}


def to_json(table: dict) -> str:
    """The rows' per-seed values and the contrasts: every number of the report, to check by hand."""
    drop = ("delta", "avg", *table["tasks"])  # derived from per_seed: recomputable, so left out
    rows = [{k: v for k, v in r.items() if k not in drop} for r in table["rows"]]
    return json.dumps({"tasks": table["tasks"], "rows": rows, "contrasts": table["contrasts"]}, indent=1) + "\n"


def load_runs(uri: str, experiment: str, tags: dict[str, str]) -> list[dict]:
    from deepen_run.tracking.store import find_runs

    return find_runs(uri, experiment, tags, status="FINISHED")
