"""A sweep's answer on its parent run, for whoever opens it in the MLflow UI (docs/sweeps.md): its
name says what was swept, its run note holds the children's results table (deepen-report's own code
on the same runs, rebuilt by the job watcher as each job ends), its figure eval/score against the
swept keys (figure.py), its tags its collapsed row in the runs table; each child is named and tagged
by its swept values. The sweep's last lines link to MLflow's compare view of the children and to the
parent.
"""
from __future__ import annotations

import itertools
import json
import shlex
import sys
from typing import Optional
from urllib.parse import quote

from hydra.core.override_parser.overrides_parser import OverridesParser

from deepen_run.run.names import SCORE_TAG, run_name
from deepen_run.sweep.figure import distinct, figure, score_points
from deepen_run.tracking import ui
from deepen_run.util import first_line

NOTE = "mlflow.note.content"
FIGURE = "sweep/eval_score.png"
# Keys every child already has as a tag of the same value (runner.tags_for): not tagged twice.
STANDARD = ("backbone", "method", "task", "schedule", "seed")
# The runs table's default tag columns besides `score` and the swept keys (ui.LAST), by tag name.
SHOWN = tuple(c.removeprefix("tags.`").removesuffix("`") for c in ui.LAST)


def _is_sweep(key: str, value: str) -> bool:
    """`1,2,3`, range(...), choice(...), interval(...): Hydra's own parser decides, so a plain
    list value (`method.layers=[2,3]`) is not taken for a sweep."""
    try:
        return OverridesParser.create().parse_override(f"{key}={value}").is_sweep_override()
    except Exception:  # noqa: BLE001 (glob() and friends need Hydra's config loader: not a plain value)
        return False


def swept(params: dict[str, str]) -> dict[str, str]:
    """The swept keys of a sweep (callback.sweep_params) and their values as given."""
    return {k: v for k, v in params.items() if not k.startswith("sweep.") and _is_sweep(k, str(v))}


def shown(value: str) -> str:
    """A value as a run name shows it: an Optuna draw's 2.6122937099604327e-05 as 2.612e-05 (its
    tag keeps every digit)."""
    try:
        number = float(value)
    except ValueError:
        return value
    long_float = len(value) > 8 and ("." in value or "e" in value.lower()) and number == number
    return f"{number:.4g}" if long_float else value  # a value as typed (1e-4, 0.1) stays as it is


def parent_name(config, params: dict[str, str]) -> str:
    """What was swept, in a line: `tiny hire rte | gru_layers=1,2 × seed=1,2`."""
    axes = swept(params)
    fixed = []
    if "backbone" not in axes:
        fixed.append(str(config.backbone.name))
    if not {"method", "arm"} & set(axes):  # an arm preset chooses the method
        fixed.append(str(config.method.name))
    if not {"task", "task.names"} & set(axes):
        fixed.append("+".join(str(t) for t in config.task.names))
    keys = " × ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in axes.items())
    return (" ".join(fixed) + (f" | {keys}" if keys else " sweep"))[:250]


def job_values(info: dict, overrides: list[str]) -> list[tuple[str, str]]:
    """This job's (key, value) of each swept key, in the job's override order."""
    axes = swept(info.get("params", {}))
    pairs = [(k.lstrip("+~"), v) for k, _, v in (o.partition("=") for o in overrides)]
    return [(k, v) for k, v in pairs if k in axes]


def child_tags(info: dict, overrides: list[str]) -> dict[str, str]:
    """This job's value of each swept key, as a tag named by the key (a column of the runs table)."""
    return {k: v for k, v in job_values(info, overrides) if k not in STANDARD}


def child_name(base, seed, info: dict, overrides: list[str]) -> str:
    """The swept values first (what tells the children apart), then the usual name without them:
    `gru_layers=2 seed=1 · tiny-hire-rte`. base: the job's config (its name is built without the
    swept keys, deepen_run/run/names.py) or a name already built."""
    axes = swept(info.get("params", {}))
    values = [f"{k.rsplit('.', 1)[-1]}={shown(v)}" for k, v in job_values(info, overrides)]
    if not isinstance(base, str):
        base = run_name(base, omit=set(axes) if values else ())
    if not values:
        return base
    if "seed" in axes:
        base = base.removesuffix(f"-s{seed}")
    return " ".join(values) + " · " + base


# -- the note --------------------------------------------------------------------------------------

def _cells(table_md: str) -> tuple[list[str], list[list[str]]]:
    """The report's first table (its rows) as (header, rows of cells)."""
    lines = list(itertools.takewhile(lambda ln: ln.startswith("|"), table_md.splitlines()))
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]
    return cells[0], cells[2:]


def compact(table_md: str) -> str:
    """The report's rows in the few short lines MLflow's Overview shows before "Show more" (a
    fixed height, about five lines, where a Markdown table also loses its cell spacing): one
    paragraph, a row per `·`-separated entry: `**#2** hire gru_layers=2: **50.0 ± 8.8**, Δ +1.2
    [-0.5, 2.9] (n 2)`. The cells are the table's own (Avg, its Δ to the baseline, the seeds)."""
    head, rows = _cells(table_md)
    col = {h: i for i, h in enumerate(head)}
    delta = next((h for h in head if h.startswith("Δ Avg")), None)
    out = []
    for r in rows:
        label = " ".join(x for x in (r[col["method"]], r[col["settings"]]) if x and x != "-")
        d = r[col[delta]] if delta else ""
        d = f", Δ {d.split(' (n=')[0]}" if d and d[0] in "+-0123456789" and not d.startswith("- ") else \
            " (baseline)" if d == "(baseline)" else ""
        out.append(f"**#{r[col['#']]}** {label}: **{r[col['Avg']]}**{d} (n {r[col['n']]})")
    return "Avg (dev x100, mean ± std over seeds): " + " · ".join(out)


def note(info: dict, children: list[dict], table_md: Optional[str], state: str) -> str:
    """The run note: the rows in a compact paragraph first (the overview shows the note's first
    lines until "Show more"), then the report's whole table with its footnotes."""
    n = info.get("n_jobs") or "?"
    done = sum(r["status"] == "FINISHED" for r in children)
    failed = sum(r["status"] in ("FAILED", "KILLED") for r in children)
    lines = [f"**Sweep {info['sweep_id']}** ({state}): {done} of {n} jobs finished, {failed} failed or killed.", ""]
    if table_md:
        lines[0] += " " + compact(table_md)  # one paragraph: the rows start on the first line
        lines += ["The whole table:", "", table_md, "",
                  f"The same table: `deepen-report --sweep-id {info['sweep_id']}{_store_args(info)}`. "
                  f"eval/score against the swept keys: artifact `{FIGURE}`."]
    else:
        lines.append("No finished job has an eval/score (a dry run has none)." if done else
                     "No finished job yet: the results table appears here as jobs finish.")
    from deepen_run.tracking.store import TAG_LIMIT

    tail = ["", f"Command: `{command(info['params'])}`"]
    text = "\n".join(lines + tail)
    if len(text) <= TAG_LIMIT:
        return text
    # Too long for a tag: MLflow would refuse it, and a cut table loses its last rows unsaid.
    head = lines[0] if len(lines[0]) < TAG_LIMIT // 2 else lines[0][:TAG_LIMIT // 2] + " …"
    return "\n".join([head, "", "The whole table is too long for a run note: the artifact `report/results.md` "
                      f"(written at the sweep's end), or `deepen-report --sweep-id {info['sweep_id']}"
                      f"{_store_args(info)}`.", *tail])[:TAG_LIMIT]


def command(params: dict[str, str]) -> str:
    """The sweep's command, to paste: its overrides and Hydra's (launcher, sweeper), without the sweep
    dir (pasted, it starts a new sweep; resume=auto with hydra.sweep.dir continues this one)."""
    def split(key: str) -> list[str]:
        try:
            return shlex.split(params.get(key, ""))
        except ValueError:  # a sweep recorded before they were quoted, with a lone quote in a value
            return params.get(key, "").split()

    hydra = [o for o in split("sweep.hydra_overrides") if not o.startswith(("hydra.mode=", "hydra.sweep.dir="))]
    return shlex.join(["deepen-run", "-m", *split("sweep.overrides"), *hydra])


def _store_args(info: dict) -> str:
    from deepen_run.run.summary import store_args

    return store_args(info["uri"], info["experiment"])


def current_children(info: dict) -> list[dict]:
    """The sweep's children, one a job: a job a resume ran again (its earlier run FAILED) by its
    newest run, so the note, its counts and the compare link see the sweep as it now stands."""
    from deepen_run.tracking.store import find_runs

    runs = find_runs(info["uri"], info["experiment"], {"sweep_id": info["sweep_id"], "sweep_role": "child"})
    return list({r["tags"].get("sweep_job", r["run_id"]): r for r in runs}.values())  # oldest first: newest wins


def parent_tags(children: list[dict], swept_keys: list[str], n_jobs=None) -> dict[str, str]:
    """The parent's collapsed row in the runs table: a parent trains nothing, so its default columns
    would read "-"; they hold its children's values instead (`seed` 1,2), and `score` the best child's
    (`best <score> (<k> of <n> runs)`). deepen-report leaves parents out of its rows (rows.reportable)."""
    tags = {key: ",".join(distinct(values)) for key in dict.fromkeys([*swept_keys, *SHOWN])
            if (values := [c["tags"][key] for c in children if key in c["tags"]])}
    scores = [float(c["tags"][SCORE_TAG]) for c in children if c["status"] == "FINISHED" and SCORE_TAG in c["tags"]]
    if scores:
        tags[SCORE_TAG] = f"best {max(scores):.4f} ({len(scores)} of {n_jobs or len(children)} runs)"
    return tags


def update(info: dict, tracker, state: str = "running") -> Optional[dict]:
    """Rebuild the note, the parent's row and the figure from the store -> the report table, if any."""
    from deepen_run.report import main as report

    children = current_children(info)
    table = report.build([r for r in children if r["status"] == "FINISHED"])
    md = report.to_markdown(table) if table["rows"] else None
    tracker.set_tags({NOTE: note(info, children, md, state)}
                     | parent_tags(children, list(swept(info["params"])), info.get("n_jobs")))
    if score_points(children, []):  # a finished child with an eval/score (a dry run has none)
        tracker.log_figure(figure(children, list(swept(info["params"]))), FIGURE)
    return table if table["rows"] else None


def start(info: dict, tracker) -> None:
    """At the sweep's start: the swept keys as the runs table's columns, the note (empty, or a resumed
    sweep's so far), which the job watcher rebuilds as jobs end (sweep/outcomes.py watch, on_end=update)."""
    try:
        swept_columns = [f"tags.`{k}`" for k in swept(info["params"])]
        ui.apply(tracker.client, tracker.experiment_id, info["parent_run_id"], swept_columns)
        update(info, tracker)
    except Exception as e:  # noqa: BLE001
        print(f"deepen-run: warning: the sweep's run note was not set: {first_line(e)}", file=sys.stderr)


def finish(info: dict, tracker, status: str, show_table: bool) -> None:
    """At the sweep's end (its parent closed, the job watcher stopped); the links print last."""
    from deepen_run.report import main as report

    try:
        table = update(info, tracker, status)
        if table is not None:
            tracker.log_text(report.to_markdown(table), "report/results.md")
            tracker.log_text(report.to_csv(table), "report/results.csv")
            if show_table:
                print(report.to_markdown(table), flush=True)
        print(links(info, tracker), flush=True)
    except Exception as e:  # noqa: BLE001 (the sweep itself is recorded; a report bug must not hide that)
        print(f"deepen-run: warning: the sweep's report failed: {first_line(e)}", file=sys.stderr)


def links(info: dict, tracker) -> str:
    from deepen_run.run.summary import ui_hint

    base, how = ui_hint(info["uri"])
    exp, ids = tracker.experiment_id, [r["run_id"] for r in current_children(info)]
    runs, exps = (quote(json.dumps(v, separators=(",", ":"))) for v in (ids, [exp]))
    compare = f"{base}/#/compare-runs?runs={runs}&experiments={exps}&workflowType=machine_learning"
    return "\n".join([
        f"  compare the children  {compare}  ({how})",
        f"  the sweep's parent    {ui.run_url(base, exp, info['parent_run_id'])}",
        f"  the table again       deepen-report --sweep-id {info['sweep_id']}{_store_args(info)}"])
