"""deepen-report --register NAME: the best run of one report row (by eval/score, among its runs that
kept weights) becomes a new version of the registered model NAME, with the alias `champion`
(docs/use-a-model.md, "The registry"); deepen_run.load("models:/NAME@champion") then loads it."""
from __future__ import annotations

import math
from typing import Optional

from deepen_run.errors import UserError

ALIAS = "champion"


def pick_row(table: dict, row: Optional[int]) -> dict:
    rows = table["rows"]
    if row is None:
        if len(rows) > 1:
            listed = "; ".join(f"{r['id']}: {r['method']} {r['setup']} {r['settings']}".strip() for r in rows[:6])
            raise UserError(f"--register: the report has {len(rows)} rows ({listed}); pick one with --row ID")
        return rows[0]
    found = [r for r in rows if r["id"] == row]
    if not found:
        raise UserError(f"--row {row}: the report has rows 1 to {len(rows)}")
    return found[0]


def best_run(runs: list[dict], row: dict) -> dict:
    """The row's run with the highest eval/score that has a logged model. The row names its runs: a
    run's key alone may differ from the row's (a *_seed setting folded into "seed", rows.keys)."""
    mine = [r for r in runs if r["run_id"] in row["run_ids"] and r["tags"].get("model_id")]
    mine = [r for r in mine if not math.isnan(r["metrics"].get("eval/score", math.nan))]
    if not mine:
        raise UserError(f"row {row['id']} has no run that kept its weights (runs keep them with train.save_best=true)")
    tasks = sorted({r["tags"].get("task", "?") for r in mine})
    if len(tasks) > 1:  # eval/score of a CoLA model and of an STS-B model are not one scale
        raise UserError(f"row {row['id']} holds models of {len(tasks)} tasks ({', '.join(tasks)}), whose eval/score "
                        "do not compare: pick one with --tag task=<name>")
    return max(mine, key=lambda r: r["metrics"]["eval/score"])


def register(uri: str, runs: list[dict], table: dict, name: str, row: Optional[int]) -> str:
    from deepen_run.tracking.models import register as register_model

    chosen = pick_row(table, row)
    run = best_run(runs, chosen)
    version, model_id = register_model(uri, run["run_id"], name, ALIAS)
    return (f"registered run {run['run_id']} (row {chosen['id']}, eval/score {run['metrics']['eval/score']:.4f}) "
            f"as {name} version {version}, alias {ALIAS}: models:/{name}@{ALIAS} (model {model_id})")
