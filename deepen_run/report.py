"""`deepen-report`: the paper-style results table, from the runs in MLflow.

One row per (backbone, method, schedule, method options that differ between rows); one column per GLUE task holding the
task's mean metric x100 (MRPC: mean of accuracy and F1, STS-B: of Pearson and Spearman, MNLI: of
-m and -mm, as in the GLUE score), as mean ± sample std over the row's runs (seeds), plus the
average over the row's tasks and the number of runs. Rows may cover only some tasks.
Single-task runs get schedule "-" (a schedule only matters when tasks share the encoder).
"""
from __future__ import annotations

import argparse
import csv
import io
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Optional

from deepen_run.errors import UserError
from deepen_run.glue import TASKS

KEY = ("backbone", "method", "schedule", "options")


def task_value(metrics: dict[str, float], task: str) -> Optional[float]:
    """A task's mean official metric x100 in one run, or None when the run did not evaluate it."""
    spec = TASKS[task]
    vals = [metrics.get(f"eval/{name}/{m}") for name in spec.eval_names for m in spec.metrics]
    vals = [v for v in vals if v is not None and not math.isnan(v)]
    return 100 * sum(vals) / len(vals) if vals else None


def _options(params: dict[str, str]) -> tuple:
    return tuple((k[len("method."):], v) for k, v in sorted(params.items())
                 if k.startswith("method.") and k != "method.name")


def _shown_options(keys) -> dict[tuple, str]:
    """Name only the method options that differ between rows of the same method: a table of
    gru_layers=1,2,3 says `gru_layers=2`, not every default of HIRE."""
    by_method: dict[str, list[dict]] = {}
    for k in keys:
        by_method.setdefault(k[1], []).append(dict(k[3]))
    varying = {m: {o for d in ds for o in d if len({str(x.get(o)) for x in ds}) > 1} for m, ds in by_method.items()}
    return {k: " ".join(f"{o}={v}" for o, v in k[3] if o in varying[k[1]]) or "-" for k in keys}


def _stats(vals: list[float]) -> dict:
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else None,
            "n": len(vals)}


def build(runs: list[dict]) -> dict:
    """runs: tracking.find_runs dicts. Returns {"tasks": [...], "rows": [...]}; each row has the KEY
    fields, "n" and per task (and "avg") {"mean", "std", "n"} or None."""
    groups: dict[tuple, dict[str, list[tuple[str, float]]]] = {}  # key -> task -> [(seed, value)]
    for r in runs:
        tags = r["tags"]
        if r["status"] != "FINISHED" or tags.get("sweep_role") == "parent" or "task" not in tags:
            continue
        tasks = tags["task"].split("+")
        key = (tags.get("backbone", "?"), tags.get("method", "?"),
               tags.get("schedule", "?") if len(tasks) > 1 else "-", _options(r["params"]))
        for t in tasks:
            v = task_value(r["metrics"], t) if t in TASKS else None
            if v is not None:
                groups.setdefault(key, {}).setdefault(t, []).append((tags.get("seed", r["run_id"]), v))
    order = [t for t in TASKS if any(t in g for g in groups.values())]
    rows = []
    shown = _shown_options(groups)
    for key, per_task in sorted(groups.items()):
        row = dict(zip(KEY, key))
        row["options"] = shown[key]
        for t in order:
            row[t] = _stats([v for _, v in per_task[t]]) if t in per_task else None
        means = [row[t]["mean"] for t in order if row[t]]
        # The average's spread is over the seeds that have every task of the row (single-task
        # runs of one seed line up); without such seeds the average has no spread.
        by_seed = [{s: statistics.fmean(v for s2, v in pairs if s2 == s) for s, _ in pairs} for pairs in per_task.values()]
        seeds = set.intersection(*(set(d) for d in by_seed))
        per_seed = [statistics.fmean(d[s] for d in by_seed) for s in sorted(seeds)]
        row["avg"] = {"mean": statistics.fmean(means), "std": _stats(per_seed)["std"] if per_seed else None,
                      "n": len(per_seed)}
        row["n"] = max(len(v) for v in per_task.values())
        rows.append(row)
    return {"tasks": order, "rows": rows}


def _cell(c: Optional[dict], n: int) -> str:
    if c is None:
        return "-"
    s = f"{c['mean']:.1f}" + (f" ± {c['std']:.1f}" if c["std"] is not None else "")
    return s + (f" (n={c['n']})" if c["n"] != n else "")


def to_markdown(table: dict) -> str:
    heads = list(KEY) + [TASKS[t].folder for t in table["tasks"]] + ["Avg", "n"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in table["rows"]:
        cells = [r[k] or "-" for k in KEY] + [_cell(r[t], r["n"]) for t in table["tasks"]]
        lines.append("| " + " | ".join(cells + [_cell(r["avg"], r["avg"]["n"]), str(r["n"])]) + " |")
    return "\n".join(lines) + "\n"


def to_csv(table: dict) -> str:
    cols = list(KEY) + [f"{t}{s}" for t in table["tasks"] + ["avg"] for s in ("", "_std", "_n")] + ["n"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    for r in table["rows"]:
        out = {k: r[k] for k in KEY} | {"n": r["n"]}
        for t in table["tasks"] + ["avg"]:
            c = r[t] or {}
            out |= {t: c.get("mean"), f"{t}_std": c.get("std"), f"{t}_n": c.get("n")}
        w.writerow(out)
    return buf.getvalue()


def load_runs(uri: str, experiment: str, tags: dict[str, str]) -> list[dict]:
    from deepen_run.tracking import find_runs

    return find_runs(uri, experiment, tags, status="FINISHED")


def write(table: dict, out: Path) -> list[Path]:
    from deepen_run.report_figure import methods_plot

    out.mkdir(parents=True, exist_ok=True)
    files = [out / "results.md", out / "results.csv", out / "results.png"]
    files[0].write_text(to_markdown(table))
    files[1].write_text(to_csv(table))
    fig = methods_plot(table)
    fig.savefig(files[2], dpi=120)
    return files


def log_to_run(table: dict, tracker) -> None:
    """results.{md,csv,png} under report/ of a run (a sweep's parent)."""
    with tempfile.TemporaryDirectory() as tmp:
        for f in write(table, Path(tmp)):
            tracker.log_file(str(f), "report")


def _parse_tags(items: list[str]) -> dict[str, str]:
    bad = [i for i in items if "=" not in i]
    if bad:
        raise UserError(f"--tag {bad[0]!r} is not KEY=VALUE, e.g. --tag method=hire")
    return dict(i.split("=", 1) for i in items)


def _description() -> str:
    import textwrap

    first, rest = __doc__.split("\n\n", 1)
    return first + "\n\n" + textwrap.fill(rest.split("\n\n")[0].replace("\n", " "), 100)


EXAMPLES = """Examples:
  deepen-report                                   every finished run of experiment deepen-run
  deepen-report --sweep-id <id> --out outputs/report   one sweep (its id is printed at the sweep's end)
  deepen-report --tag method=hire --tag task=rte  only runs with these tags
"""


def main(argv: Optional[list[str]] = None) -> None:
    from deepen_run.config import TrackingConfig
    from omegaconf import OmegaConf

    default = OmegaConf.structured(TrackingConfig)
    p = argparse.ArgumentParser(prog="deepen-report", description=_description(),
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    p.add_argument("--uri", default=default.uri, help="MLflow tracking URI (default: %(default)s)")
    p.add_argument("--experiment", default=default.experiment, help="default: %(default)s")
    p.add_argument("--sweep-id", help="only the children of this sweep (tag sweep_id)")
    p.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="only runs with this tag (repeatable)")
    p.add_argument("--out", type=Path, help="write results.md, results.csv and results.png here")
    p.add_argument("--log-to-parent", action="store_true", help="log them under report/ of the sweep's parent run")
    a = p.parse_args(argv)
    try:
        if a.log_to_parent and not a.sweep_id:
            raise UserError("--log-to-parent needs --sweep-id (the parent is the sweep's)")
        tags = _parse_tags(a.tag) | ({"sweep_id": a.sweep_id} if a.sweep_id else {})
        table = build(load_runs(a.uri, a.experiment, tags))
        if not table["rows"]:
            raise UserError(f"no FINISHED runs with evaluated GLUE tasks in experiment {a.experiment!r} "
                            f"matching {tags or 'any tags'} ({a.uri})")
        print(to_markdown(table), end="")
        if a.out:
            print(f"wrote {', '.join(str(f) for f in write(table, a.out))}")
        if a.log_to_parent:
            from deepen_run.tracking import Tracker, find_runs

            parents = find_runs(a.uri, a.experiment, {"sweep_id": a.sweep_id, "sweep_role": "parent"})
            if not parents:
                raise UserError(f"sweep {a.sweep_id} has no parent run in {a.experiment!r}")
            log_to_run(table, Tracker(a.uri, a.experiment).attach(parents[0]["run_id"]))
            print(f"logged report/ to parent run {parents[0]['run_id']}")
    except UserError as e:
        print(f"deepen-report: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
