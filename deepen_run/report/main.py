"""`deepen-report`: the study's results table, from the runs in MLflow (built by deepen_run/report/table.py).

Rows: runs that share every setting but the seed (deepen_run/report/rows.py); a row is labelled by
backbone, method, setup (single-task, or multi-task with its tasks and schedule) and the settings
that differ between rows. Columns: each GLUE task's mean metric x100 (MRPC: mean of accuracy and
F1, STS-B: of Pearson and Spearman, MNLI: of -m and -mm, as in the GLUE score) as mean ± sample std
over the row's seeds, the average over the row's tasks, the paired difference of that average to
the row's baseline with a 95% t interval, parameter counts and the measured training step time.
Dry runs and unfinished runs never enter the table.

Contrasts (deepen_run/report/contrasts.py): every row against its baseline and any named A:B,
per task and on the average, paired by seed, with t intervals and Holm-adjusted p-values. Nothing
is mixed silently: a row of several code versions (git_commit) and a seed run twice are marked in
footnotes; --json and --seeds-csv give every per-seed value behind the numbers.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Optional

from deepen_run.report import contrasts as rc
from deepen_run.errors import UserError, fail
from deepen_run.data.glue import TASKS
from deepen_run.report.output import seeds_csv, to_csv, to_markdown  # noqa: F401 (part of this module's API)
from deepen_run.report.table import build, finish, load_runs, task_value, to_json  # noqa: F401 (likewise)


def write(table: dict, out: Path) -> list[Path]:
    """results.md, results.csv, results.png (and contrasts.png) into `out`, never over a file this tool
    did not write there (deepen_run/safe_fs.py keeps the folder's manifest): a UserError instead."""
    from deepen_run.report.figure import contrasts_plot, methods_plot
    from deepen_run.safe_fs import NotOurs, write_owned

    files = {"results.md": lambda p: p.write_text(to_markdown(table)),
             "results.csv": lambda p: p.write_text(to_csv(table)),
             # the legend stands outside the axes
             "results.png": lambda p: methods_plot(table).savefig(p, dpi=120, bbox_inches="tight")}
    if table["contrasts"]:
        files["contrasts.png"] = lambda p: contrasts_plot(table).savefig(p, dpi=120, bbox_inches="tight")
    try:
        return write_owned(out, files)
    except NotOurs as e:
        raise UserError(f"--out {out}: {e}; pass a new or empty folder, or one deepen-report wrote") from None
    except OSError as e:
        raise UserError(f"--out {out}: cannot write there ({e.strerror or e})") from None


def _check_out(out: Path) -> None:
    from deepen_run.safe_fs import NotOurs, check_owned

    try:
        check_owned(out, ["results.md", "results.csv", "results.png", "contrasts.png"])
    except NotOurs as e:
        raise UserError(f"--out {out}: {e}; pass a new or empty folder, or one deepen-report wrote") from None


def log_to_run(table: dict, tracker) -> None:
    """results.{md,csv,png} (and contrasts.png) under report/ of a run (a sweep's parent)."""
    with tempfile.TemporaryDirectory() as tmp:
        for f in write(table, Path(tmp)):
            tracker.log_file(str(f), "report")


def _parse_tags(items: list[str]) -> dict[str, str]:
    bad = [i for i in items if "=" not in i]
    if bad:
        raise UserError(f"--tag {bad[0]!r} is not KEY=VALUE, e.g. --tag method=hire")
    return dict(i.split("=", 1) for i in items)


def _parse_tasks(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in TASKS]
    if bad or not names:
        raise UserError(f"--tasks {text!r}: {bad[0] if bad else 'no task'} is not a GLUE task; choose from "
                        f"{', '.join(TASKS)}")
    return names


def _description() -> str:
    import textwrap

    first, rest = __doc__.split("\n\n", 1)
    return first + "\n\n" + textwrap.fill(rest.split("\n\n")[0].replace("\n", " "), 100)


EXAMPLES = """Examples:
  deepen-report                                   every finished run of experiment deepen-run
  deepen-report --sweep-id <id> --out outputs/report   one sweep (its id is printed at the sweep's end)
  deepen-report --tag method=hire --tag task=rte  only runs with these tags
  deepen-report --sweep-id <a> --sweep-id <b> --tasks sst2,stsb   two grids, compared on the tasks both ran
  deepen-report --contrast 'importance=dynamic:importance=mean' --baseline 'pooling=mean'   an arm-vs-arm contrast
  deepen-report --json --seeds-csv seeds.csv     every per-seed value and contrast, for checking by hand
  deepen-report --submission glue.zip            the GLUE leaderboard zip from predict=true runs
"""


def csv_table(a) -> dict:
    """--from-csv: the table from the published per-seed values alone (deepen_run/report/from_csv.py)."""
    from deepen_run.report import from_csv

    bad = [f"--{k.replace('_', '-')}" for k in ("uri", "sweep_id", "tag", "log_to_parent") if getattr(a, k)]
    if bad:
        raise UserError(f"--from-csv reads no MLflow store: drop {', '.join(bad)}")
    rows, keys = from_csv.load_all(a.from_csv, a.rows_csv)
    tasks = [t for t in TASKS if any(t in r["per_seed"] for r in rows)]
    only = _parse_tasks(a.tasks) if a.tasks else tasks
    for r in rows:
        r["per_seed"] = {t: v for t, v in r["per_seed"].items() if t in only}
    label = {k: r["settings"] for k, r in zip(keys, rows)}
    return finish(rows, keys, label, [t for t in tasks if t in only], a.contrast, a.baseline, not a.only_contrasts)


def extra_tables(table: dict, a) -> str:
    """--secondary (their own Holm family) and --power, after the report's own tables."""
    from deepen_run.report import power
    from deepen_run.report.output import contrasts_markdown

    out = ""
    if a.secondary:
        post = rc.compute(table["rows"], a.secondary, defaults=False, flag="--secondary")
        out += contrasts_markdown({"contrasts": post}).replace(
            "Contrasts (", "Secondary contrasts, exploratory or post hoc, not in the family above (", 1)
    if a.power:
        out += power.markdown(power.table(table["rows"], a.power, a.family, a.mde), a.family, a.mde)
    return out


def main(argv: Optional[list[str]] = None) -> None:
    from deepen_run.config.schema import TrackingConfig
    from omegaconf import OmegaConf

    default = OmegaConf.structured(TrackingConfig)
    p = argparse.ArgumentParser(prog="deepen-report", description=_description(),
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    p.add_argument("--uri", help=f"MLflow tracking URI (default: {default.uri})")
    p.add_argument("--from-csv", type=Path, action="append", metavar="SEEDS_CSV",
                   help="rebuild the rows from a per-seed CSV (--seeds-csv's format, e.g. docs/results/floor_seeds.csv) "
                   "instead of an MLflow store; repeat it to join a study's parts (rows with equal settings merge)")
    p.add_argument("--rows-csv", type=Path, metavar="FILE", help="with --from-csv: per-row parameter counts and "
                   "step times (row, params_total, params_trainable, x_backbone, x_backbone_all, step_time_s)")
    p.add_argument("--secondary", action="append", default=[], metavar="A:B",
                   help="a contrast exploratory or post hoc: its own table, with Holm over the --secondary ones alone")
    p.add_argument("--power", action="append", default=[], metavar="A:B",
                   help="the contrast's paired sd, 90%% interval, minimum detectable effect and the n a study needs "
                   "(deepen_run/report/power.py)")
    p.add_argument("--family", type=int, default=1, help="with --power: the size of the planned Holm family")
    p.add_argument("--mde", type=float, default=0.7, help="with --power: the target minimum detectable effect")
    p.add_argument("--experiment", default=default.experiment, help="default: %(default)s")
    p.add_argument("--sweep-id", action="append", default=[],
                   help="only the children of this sweep (tag sweep_id); repeat for several sweeps (a study's grids)")
    p.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="only runs with this tag (repeatable)")
    p.add_argument("--tasks", help="only these tasks' columns, comma-separated (e.g. sst2,stsb): rows that ran "
                   "different task sets then average and pair over the same tasks")
    p.add_argument("--contrast", action="append", default=[], metavar="A:B",
                   help="also compare row A with row B (a - b, per task and on the average, paired by seed); A and B: "
                   "a row id or KEY=VALUE settings that match one row, e.g. '3:1' or 'importance=dynamic:importance=mean' "
                   "(repeatable)")
    p.add_argument("--only-contrasts", action="store_true",
                   help="only the --contrast ones, not every row vs its baseline (the Holm family is then just those)")
    p.add_argument("--holm-avg", action="store_true",
                   help="Holm over the contrasts' avg readings alone (a family planned on the average of the tasks); "
                   "the per-task readings are then descriptive, without p Holm")
    p.add_argument("--plan", type=Path, metavar="PLAN.yaml",
                   help="report exactly the family a study plan names, with its tests and adjustment, and say first "
                   "if the plan differs from the one the runs recorded (deepen_run/report/plan.py, docs/study.md)")
    p.add_argument("--baseline", action="append", default=[], metavar="ROW|KEY=VALUE",
                   help="the baseline where several rows could be one (e.g. --baseline 'pooling=mean'); repeatable")
    p.add_argument("--json", action="store_true", help="print the rows' per-seed values and the contrasts as JSON "
                   "instead of the table")
    p.add_argument("--seeds-csv", type=Path, metavar="FILE", help="write one line per (row, task, seed) to FILE")
    p.add_argument("--out", type=Path, help="write results.md, results.csv and results.png (and contrasts.png) here")
    p.add_argument("--log-to-parent", action="store_true", help="log them under report/ of each sweep's parent run")
    p.add_argument("--submission", type=Path, metavar="FILE.zip",
                   help="write the GLUE leaderboard zip from the runs' submission/ files (predict=true): per file, "
                   "the run with the best dev score of its task; the table is not printed")
    p.add_argument("--overwrite", action="store_true", help="let --submission and --seeds-csv replace a file that exists")
    p.add_argument("--register", metavar="NAME", help="register the best run (by eval/score) of a row as model NAME, "
                   "alias champion (docs/use-a-model.md)")
    p.add_argument("--row", type=int, help="the row --register takes (default: the only one)")
    a = p.parse_args(argv)
    from deepen_run.safe_fs import unwritable

    try:
        if a.log_to_parent and not a.sweep_id:
            raise UserError("--log-to-parent needs --sweep-id (the parent is the sweep's)")
        tags = _parse_tags(a.tag)
        if a.out:  # before reading the store: a refused --out costs nothing
            _check_out(a.out)
        for flag, f in (("--seeds-csv", a.seeds_csv), ("--submission", a.submission)):
            why = f is not None and unwritable(f, flag, a.overwrite)  # before the store is read
            if why:
                raise UserError(why)
        if a.register is not None and (not a.register.strip() or any(c in a.register for c in "/:")):
            raise UserError(f"--register {a.register!r}: a registered model's name is not empty and has no '/' or ':'")
        only = _parse_tasks(a.tasks) if a.tasks else None
        if a.plan:  # before reading anything: the plan sets the contrasts and their adjustment
            from deepen_run.report import plan as rp

            plan, plan_text = rp.take_over(a)
        if a.only_contrasts and not a.contrast:
            raise UserError("--only-contrasts needs at least one --contrast A:B")
        from deepen_run.masking import mask_uri

        if a.from_csv:
            if a.submission or a.register:
                raise UserError("--submission and --register read an MLflow store, not --from-csv")
            table = csv_table(a)
        else:
            if a.rows_csv:
                raise UserError("--rows-csv goes with --from-csv")
            a.uri = a.uri or default.uri
            runs = [r for sid in a.sweep_id for r in load_runs(a.uri, a.experiment, tags | {"sweep_id": sid})] \
                if a.sweep_id else load_runs(a.uri, a.experiment, tags)
            if a.submission:
                from deepen_run.report.submission import gather

                chosen, missing = gather(runs, a.uri, a.submission, task_value)
                if not chosen:
                    raise UserError(f"no FINISHED run in {a.experiment!r} has submission/ files; run with predict=true")
                for stem, name in chosen.items():
                    print(f"{stem}.tsv  from {name}")
                print(f"wrote {a.submission} ({len(chosen)} files); {missing}")
                return
            table = build(runs, only, a.contrast, a.baseline, not a.only_contrasts)
        if a.holm_avg:
            rc.holm_on_avg(table["contrasts"])
        if not table["rows"]:
            raise UserError(f"no FINISHED runs with evaluated GLUE tasks in experiment {a.experiment!r} "
                            f"matching {tags or 'any tags'}{' in sweeps ' + ', '.join(a.sweep_id) if a.sweep_id else ''}"
                            f" ({mask_uri(a.uri) if a.uri else ', '.join(map(str, a.from_csv or []))})")
        info = sys.stderr if a.json else sys.stdout  # --json: stdout is the JSON alone
        if a.register:  # before the table, so a bad --row is refused before anything is printed
            from deepen_run.report.register import pick_row

            pick_row(table, a.row)
        text = rp.report(table, plan, plan_text, a) if a.plan else to_markdown(table)
        print(to_json(table) if a.json else text + extra_tables(table, a), end="")
        if a.seeds_csv:
            a.seeds_csv.parent.mkdir(parents=True, exist_ok=True)
            a.seeds_csv.write_text(seeds_csv(table))
            print(f"wrote {a.seeds_csv}", file=info)
        from deepen_run.report.missing import missing_lines

        for line in (ln for sid in a.sweep_id for ln in missing_lines(a.uri, a.experiment, sid)):
            print(line, file=info)
        if a.out:
            print(f"wrote {', '.join(str(f) for f in write(table, a.out))}", file=info)
        if a.log_to_parent:
            from deepen_run.tracking.store import Tracker, find_runs

            for sid in a.sweep_id:
                parents = find_runs(a.uri, a.experiment, {"sweep_id": sid, "sweep_role": "parent"})
                if not parents:
                    raise UserError(f"sweep {sid} has no parent run in {a.experiment!r}")
                log_to_run(table, Tracker(a.uri, a.experiment, run_id=parents[0]["run_id"]))
                print(f"logged report/ to parent run {parents[0]['run_id']} (sweep {sid})", file=info)
        if a.register:
            from deepen_run.report.register import register

            print(register(a.uri, runs, table, a.register, a.row), file=info)
    except UserError as e:
        fail(str(e), 2, prog="deepen-report")


if __name__ == "__main__":
    main()
