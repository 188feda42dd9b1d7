"""The report's table as Markdown (with footnotes saying how to read it and what it mixes), its
contrasts, and as CSV (one line a row; seeds_csv: one line a row, task and seed)."""
from __future__ import annotations

import csv
import io
import json
from typing import Optional

from deepen_run.data.glue import TASKS
from deepen_run.report.contrasts import fmt_p

# Row marks: * = the row mixes code versions (git_commit tags); † = a seed ran twice with different values.
MIXED, DISAGREE = "*", "†"

LABEL = ("backbone", "method", "setup", "settings")


def _cell(c: Optional[dict], n: int) -> str:
    if c is None:
        return "-"
    s = f"{c['mean']:.1f}" + (f" ± {c['std']:.1f}" if c["std"] is not None else "")
    return s + (f" (n={c['n']})" if c["n"] != n else "")


def _delta(r: dict, i: int) -> str:
    d = r["delta"]
    if r["baseline"] == i:
        return "(baseline)"
    if d is None:  # say why: the footnote tells how to get one
        return "- (no baseline row)" if r["baseline"] is None else "- (no seed shared with its baseline)"
    ci = f" [{d['lo']:+.1f}, {d['hi']:+.1f}]" if d["lo"] is not None else ""
    return f"{d['mean']:+.1f}{ci} (n={d['n']})"


def _num(v: Optional[float], fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def to_markdown(table: dict) -> str:
    heads = ["#", *LABEL] + [TASKS[t].folder for t in table["tasks"]] + \
        ["Avg", "Δ Avg vs baseline [95% CI]", "n", "params (M)", "trainable (M)", "x backbone",
         "x backbone, all tasks", "step (s)"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for i, r in enumerate(table["rows"], 1):
        cells = [str(i) + marks(r)] + [r[k] or "-" for k in LABEL] + [_cell(r[t], r["n"]) for t in table["tasks"]]
        cells += [_cell(r["avg"], r["avg"]["n"]), _delta(r, i), str(r["n"]),
                  _num(r["params_total"] and r["params_total"] / 1e6, ".2f"),
                  _num(r["params_trainable"] and r["params_trainable"] / 1e6, ".2f"),
                  _num(r["x_backbone"], ".3f"), _num(r["x_backbone_all"], ".2f"), _num(r["step_time_s"], ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    notes = _footnotes(table) + _mixing(table["rows"])
    out = "\n".join(lines) + "\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")
    return out + contrasts_markdown(table)


def marks(r: dict) -> str:
    return (MIXED if len(r.get("commits", {})) > 1 else "") + \
        (DISAGREE if any(not x["agree"] for x in r.get("repeats", [])) else "")


def _mixing(rows: list[dict]) -> list[str]:
    """What a row puts together: several code versions, seeds run more than once."""
    out = []
    for r in rows:
        if len(r.get("commits", {})) > 1:
            parts = "; ".join(f"{c} (seed{'s' if len(s) > 1 else ''} {', '.join(s)})" for c, s in r["commits"].items())
            out.append(f"{MIXED} Row {r['id']} mixes runs of {len(r['commits'])} code versions (git_commit): {parts}.")
        for x in r.get("repeats", []):
            vals = ", ".join(f"{v:.2f}" for v in x["values"])
            if x["agree"]:
                out.append(f"Row {r['id']}: seed {x['seed']} of {x['task']} ran {len(x['values'])} times, same value "
                           f"({vals}); counted once.")
            else:
                out.append(f"{DISAGREE} Row {r['id']}: seed {x['seed']} of {x['task']} ran {len(x['values'])} times with "
                           f"different values ({vals}); their mean is used. Runs: {', '.join(x['run_ids'])}.")
    return out


def contrasts_markdown(table: dict) -> str:
    cs = table.get("contrasts") or []
    if not cs:
        return ""
    m = sum(c["p_holm"] is not None for c in cs)
    which = "avg readings alone (the per-task ones are descriptive)" if any(
        c["p"] is not None and c["p_holm"] is None for c in cs) else "contrasts with a p"
    holm = f"adjusted over the {m} {which}" if m > 1 else \
        "p itself (one reading: nothing to adjust over)" if m else "none (no contrast has a p)"
    lines = ["", f"Contrasts (a - b, paired by seed; 95% t interval; p: two-sided t test; p Holm: {holm}; avg: "
                 "over the tasks both rows ran):", "",
             "| a | b | task | n | a - b [95% CI] | p | p Holm |", "|---|---|---|---|---|---|---|"]
    for c in cs:
        ci = f" [{c['lo']:+.1f}, {c['hi']:+.1f}]" if c["lo"] is not None else ""
        lines.append(f"| {c['a']} | {c['b']} | {c['task']} | {c['n']} | {c['mean']:+.1f}{ci} | {fmt_p(c['p'])} | "
                     f"{fmt_p(c['p_holm'])} |")
    return "\n".join(lines) + "\n"


def seeds_csv(table: dict) -> str:
    """One line per (row, task, seed): the value the table averages, and how many runs gave it; the
    last column is the row's whole key (its settings as JSON), so files of a study's parts, whose labels
    name only what varies within each, join exactly (deepen-report --from-csv a.csv --from-csv b.csv)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["row", *LABEL, "task", "seed", "value", "runs", "git_commits", "config"])
    for r in table["rows"]:
        reruns = {(x["task"], x["seed"]): len(x["values"]) for x in r.get("repeats", [])}
        for task, seeds in r["per_seed"].items():
            for seed, v in seeds.items():
                commits = " ".join(c for c, s in r.get("commits", {}).items() if seed in s)
                w.writerow([r["id"], *(r[k] for k in LABEL), task, seed, repr(v), reruns.get((task, seed), 1), commits,
                            json.dumps(r["config"], sort_keys=True) if "config" in r else ""])
    return buf.getvalue()


def _footnotes(table: dict) -> list[str]:
    rows = table["rows"]
    bases: dict[int, list[int]] = {}
    for i, r in enumerate(rows, 1):
        if r["baseline"] and r["baseline"] != i:
            bases.setdefault(r["baseline"], []).append(i)
    out = ["Cells: dev score x100, mean ± sample std over seeds (n = seeds; a cell with fewer says so). "
           "Avg: mean of the row's task means; its ± is over seeds that have every task."]
    for b, of in sorted(bases.items()):
        out.append(f"Baseline of row{'s' if len(of) > 1 else ''} {', '.join(map(str, of))}: row {b} "
                   f"({rows[b - 1]['method']}, {rows[b - 1]['setup']}).")
    if any(r["baseline"] is None for r in rows):
        out.append("Δ - (no baseline row): no method=baseline row has this row's other settings; train one in "
                   "the same sweep with arms, e.g. deepen-run -m +arm=baseline,hire_g1,hire_g2 seed=1,2.")
    if any(r["baseline"] not in (None, i) and r["delta"] is None for i, r in enumerate(rows, 1)):
        out.append("Δ - (no seed shared with its baseline): no seed has scores in both rows on every task they "
                   "share (Δ pairs each seed's average over those tasks); run the baseline with the row's seeds "
                   "on the row's tasks.")
    if bases:
        out.append("Δ: row minus its baseline in the average over their common tasks, paired by seed "
                   "(seeds both rows have); [95% CI] is the t interval of the mean difference, n-1 degrees of freedom.")
    out.append("params, trainable, x backbone: per model (mean over the row's runs); x backbone, all tasks: what "
               "serves every task of the row (single-task rows: one model per task). step: mean seconds per "
               "training step (no evaluation), mean over the row's runs.")
    return out


def to_csv(table: dict) -> str:
    sizes = ["params_total", "params_trainable", "x_backbone", "x_backbone_all", "step_time_s"]
    cols = ["row", *LABEL] + [f"{t}{s}" for t in table["tasks"] + ["avg"] for s in ("", "_std", "_n")] + \
        ["delta", "delta_lo", "delta_hi", "delta_n", "baseline_row", "n"] + sizes
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    for i, r in enumerate(table["rows"], 1):
        d = r["delta"] or {}
        out = {"row": i, "n": r["n"], "baseline_row": r["baseline"], "delta": d.get("mean"), "delta_lo": d.get("lo"),
               "delta_hi": d.get("hi"), "delta_n": d.get("n")} | {k: r[k] for k in LABEL + tuple(sizes)}
        for t in table["tasks"] + ["avg"]:
            c = r[t] or {}
            out |= {t: c.get("mean"), f"{t}_std": c.get("std"), f"{t}_n": c.get("n")}
        w.writerow(out)
    return buf.getvalue()
