"""Arm-vs-arm contrasts for deepen-report: which rows to compare, per-seed values, paired t intervals
and Holm-adjusted p-values.

A contrast "a - b" pairs the two rows by seed: per task, the difference of the seed's values; on the
average ("avg"), the difference of the seed's means over the tasks both rows ran (seeds that have all
of them). Its interval is the one-sample t interval (95%, n-1 degrees of freedom) of those
differences and p the two-sided t test of mean 0, both from scipy. p_holm: Holm's step-down
adjustment over every contrast of the report that has a p (a family of m contrasts), so a table of
many contrasts does not read its smallest p-values as if each were the only one tested.
"""
from __future__ import annotations

import math
import re
import statistics
from typing import Optional

from deepen_run.errors import UserError

AGREE = 1e-6  # x100 scale: a deterministic rerun of a seed gives the same value to float precision


def seed_order(seed: str):
    return (0, int(seed), "") if str(seed).lstrip("-").isdigit() else (1, 0, str(seed))


def per_seed(values: dict[str, list[tuple[str, float, dict]]]) -> tuple[dict, list[dict]]:
    """task -> [(seed, value, run)] -> ({task: {seed: value}}, repeats). A seed run more than once
    keeps the mean of its runs, and is listed in repeats with every value and whether they agree."""
    out: dict[str, dict[str, float]] = {}
    repeats = []
    for task, items in values.items():
        by_seed: dict[str, list[tuple[float, dict]]] = {}
        for seed, v, run in items:
            by_seed.setdefault(str(seed), []).append((v, run))
        out[task] = {}
        for seed in sorted(by_seed, key=seed_order):
            vals = [v for v, _ in by_seed[seed]]
            out[task][seed] = statistics.fmean(vals)
            if len(vals) > 1:
                repeats.append({"task": task, "seed": seed, "values": vals, "agree": max(vals) - min(vals) <= AGREE,
                                "run_ids": [r["run_id"] for _, r in by_seed[seed]]})
    return out, repeats


def seed_avgs(ps: dict[str, dict[str, float]], tasks: list[str]) -> dict[str, float]:
    """The mean over `tasks` for every seed that has them all."""
    seeds = set.intersection(*(set(ps[t]) for t in tasks)) if tasks else set()
    return {s: statistics.fmean(ps[t][s] for t in tasks) for s in sorted(seeds, key=seed_order)}


def differences(a: dict[str, float], b: dict[str, float]) -> list[float]:
    """a - b per common seed, in seed order."""
    return [a[s] - b[s] for s in sorted(set(a) & set(b), key=seed_order)]


def sign_flip(diffs: list[float]) -> Optional[float]:
    """Two-sided p of the paired sign-flip (permutation) test of mean 0: under the null each seed's
    difference is as likely negative, so every assignment of signs is equally likely. Exact (all 2^n
    assignments) up to n = 20, else 100,000 seeded draws. Unlike the t test it assumes no normality,
    and it has a floor: at n = 6 no p is below 2/64 = 0.031."""
    import numpy as np
    from scipy import stats

    if len(diffs) < 2 or statistics.pstdev(diffs) == 0:
        return None
    exact = len(diffs) <= 20
    r = stats.permutation_test((np.asarray(diffs),), np.mean, permutation_type="samples", vectorized=True,
                               n_resamples=np.inf if exact else 100_000, alternative="two-sided", rng=0)
    return float(r.pvalue)


def paired(a: dict[str, float], b: dict[str, float]) -> Optional[dict]:
    """a - b over their common seeds: n, mean, 95% t interval, p; None without a common seed. With one
    seed, or differences without spread, there is no interval and no p."""
    from scipy import stats

    diffs = differences(a, b)
    if not diffs:
        return None
    mean = statistics.fmean(diffs)
    if len(diffs) < 2 or statistics.stdev(diffs) == 0:
        return {"n": len(diffs), "mean": mean, "lo": None, "hi": None, "p": None}
    t = stats.ttest_1samp(diffs, 0.0)
    ci = t.confidence_interval(0.95)
    return {"n": len(diffs), "mean": mean, "lo": float(ci.low), "hi": float(ci.high), "p": float(t.pvalue)}


def holm(ps: list[Optional[float]]) -> list[Optional[float]]:
    """Holm's step-down adjusted p-values (None stays None and is not counted in the family)."""
    idx = sorted((i for i, p in enumerate(ps) if p is not None), key=lambda i: ps[i])
    m, out, running = len(idx), [None] * len(ps), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * ps[i]))  # monotone: never below a smaller p's
        out[i] = running
    return out


def contrast(a_id: int, b_id: int, a: dict, b: dict, default: bool) -> list[dict]:
    """Per common task, then "avg" when the rows share two tasks or more (with one, it is that task)."""
    tasks = [t for t in a if t in b]
    out = []
    for task in tasks + (["avg"] if len(tasks) > 1 else []):
        d = paired(*(seed_avgs(x, tasks) if task == "avg" else x[task] for x in (a, b)))
        if d is not None:
            out.append({"a": a_id, "b": b_id, "task": task} | d | {"p_holm": None, "default": default})
    return out


def _norm(v) -> str:
    """Values compare without spaces ([1,2] = [1, 2]) and case (true = True, as params log a bool)."""
    return re.sub(r"\s+", "", str(v)).lower()


def matches(spec: str, rows: list[dict], what: str) -> list[int]:
    """The ids of the rows that a row id ("3") or settings ("method=hire importance=mean": every
    KEY=VALUE must hold; a key is a full config key or its last part(s), e.g. importance for
    method.importance, method for method.name; setup=single or setup=multi picks by setup) name."""
    spec = spec.strip()
    if spec.isdigit():
        if not 1 <= int(spec) <= len(rows):
            raise UserError(f"{what}: no row {spec} (rows 1-{len(rows)})")
        return [int(spec)]
    terms = spec.split()
    bad = [t for t in terms if "=" not in t]
    if bad or not terms:
        raise UserError(f"{what}: {spec!r} is neither a row id nor KEY=VALUE settings (e.g. 'method=hire importance=mean')")

    def holds(term: str, row: dict) -> bool:
        k, v = term.split("=", 1)
        if k == "setup":
            return row["setup"].startswith(_norm(v))
        cfg = row["config"]
        keys = [c for c in cfg if c == k or c.endswith("." + k) or c == k + ".name"]
        return any(_norm(cfg[c]) == _norm(v) for c in keys)

    return [r["id"] for r in rows if all(holds(t, r) for t in terms)]


def select(spec: str, rows: list[dict], what: str) -> int:
    """The id of the one row that `spec` (see matches) names."""
    hits = matches(spec, rows, what)
    if len(hits) != 1:
        found = ", ".join(f"row {i} ({rows[i - 1]['method']} {rows[i - 1]['settings']})" for i in hits) or "none"
        raise UserError(f"{what}: {spec!r} must match exactly one row, it matches {found}; "
                        "add settings to tell them apart, or give the row id")
    return hits[0]


def parse(spec: str, rows: list[dict]) -> tuple[int, int]:
    parts = spec.split(":")
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise UserError(f"--contrast {spec!r} is not A:B (A and B: a row id or KEY=VALUE settings, e.g. '2:1' or "
                        "'importance=dynamic:importance=mean')")
    return select(parts[0], rows, f"--contrast {spec!r}"), select(parts[1], rows, f"--contrast {spec!r}")


def compute(rows: list[dict], named: list[str], defaults: bool = True, flag: str = "--contrast") -> list[dict]:
    """Every row vs its baseline (unless defaults=False), then the named A:B contrasts; Holm over all.
    flag: the option that named them (--contrast, --secondary), for the error lines."""
    pairs = [(r["id"], r["baseline"], None) for r in rows if defaults and r["baseline"] not in (None, r["id"])]
    for spec in named:
        a, b = parse(spec, rows)
        if a == b:
            raise UserError(f"{flag} {spec!r} compares row {a} with itself")
        pairs = [p for p in pairs if set(p[:2]) != {a, b}] + [(a, b, spec)]  # b:a is the same test
    out = []
    for a, b, spec in pairs:
        found = contrast(a, b, rows[a - 1]["per_seed"], rows[b - 1]["per_seed"], spec is None)
        if not found and spec is not None:  # asked for by name: an empty answer must not look like no effect
            raise UserError(f"{flag} {spec}: rows {a} and {b} share no seed on a common task "
                            "(a contrast pairs the two rows' runs of each seed)")
        out += found
    for c, p in zip(out, holm([c["p"] for c in out])):
        c["p_holm"] = p
    return out


def holm_on_avg(cs: list[dict]) -> None:
    """A family planned on the average (docs/study.md, Study III): Holm over the avg readings alone; the
    per-task readings stay descriptive (no p Holm). A contrast of rows that share one task has no
    avg reading (contrast()): that task's reading is its average, and is in the family."""
    shared = {}
    for c in cs:
        shared.setdefault((c["a"], c["b"]), []).append(c)
    avg = [c for pair in shared.values() for c in pair if c["task"] == "avg" or len(pair) == 1]
    for c in cs:
        c["p_holm"] = None
    for c, p in zip(avg, holm([c["p"] for c in avg])):
        c["p_holm"] = p


def fmt_p(p: Optional[float]) -> str:
    return "-" if p is None or math.isnan(p) else (f"{p:.2g}" if p >= 0.001 else "<0.001")
