"""docs/results.md is re-derivable from the repo: the `deepen-report --from-csv` command it shows,
run on the published CSVs alone (no MLflow store), prints every line of the page's result tables
and every interval its readings quote; and --from-csv rebuilds the rows as the store-backed report
built them (ids, labels, baselines, the 45-test Holm family)."""
import re
import shlex

import pytest

from deepen_run.config.schema import ROOT
from deepen_run.report import from_csv
from deepen_run.report import main as report

DOC = (ROOT / "docs" / "results.md").read_text()
# Three studies, each with its command: Study IV (the newest, tests/test_results_s4.py), Study III, the floor study.
S3 = DOC[DOC.index("## Study III"):DOC.index("## The floor study")]
FLOOR = DOC[DOC.index("## The floor study"):]
INTERVAL = re.compile(r"\[[+-]\d+\.\d, [+-]\d+\.\d\]")


def documented_command(section: str = FLOOR) -> list[str]:
    """The section's first ```bash block that runs --from-csv: its argv after deepen-report."""
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        argv = shlex.split(block.replace("\\\n", " "))
        if argv[0] == "deepen-report" and "--from-csv" in argv:
            return argv[1:]
    raise AssertionError("docs/results.md shows no deepen-report --from-csv command there")


def run_report(argv: list[str]) -> str:
    import contextlib
    import io
    import os

    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)  # the command's paths are the repo's
    try:
        with contextlib.redirect_stdout(out):
            report.main(argv)
    finally:
        os.chdir(cwd)
    return out.getvalue()


@pytest.fixture(scope="module")
def printed() -> str:
    return run_report(documented_command(FLOOR))


def study_command(study: str, part: str, section: str) -> list[str]:
    """The section shows `eval "$(python scripts/study.py --study S --part P --command)"`: the argv after
    deepen-report of the line that prints."""
    import subprocess
    import sys

    assert f'eval "$(python scripts/study.py --study {study} --part {part} --command)"' in section
    line = subprocess.run([sys.executable, "scripts/study.py", "--study", study, "--part", part, "--command"],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout
    argv = shlex.split(line)
    assert argv[0] == "deepen-report"
    return argv[1:]


def s3_command() -> list[str]:
    return study_command("s3", "family", S3)


@pytest.fixture(scope="module")
def printed_s3() -> str:
    return run_report(s3_command())


@pytest.fixture(scope="module")
def printed_design() -> str:
    """Study III by its design-time plan."""
    return run_report(study_command("s3", "design", S3))


REPORTED = ("| # | backbone |", "| a | b | task | n |")
PLANNED = REPORTED + ("| member | a | b | task | n (planned) |", "| id | a | b | task | n |")  # --plan's tables


def result_tables(section: str = FLOOR, keep: tuple = REPORTED) -> list[list[str]]:
    """The section's tables that the report prints: the rows table, the contrasts, secondary, power
    (keep=PLANNED: and a plan's family and exploratory tables)."""
    tables, cur = [], []
    for line in section.splitlines() + [""]:
        if line.startswith("|"):
            cur.append(line)
        elif cur:
            tables.append(cur)
            cur = []
    return [t for t in tables if t[0].startswith(keep)]


def test_every_line_of_the_result_tables_is_printed_by_the_documented_command(printed):
    tables = result_tables()
    assert len(tables) == 4  # rows, the 45 contrasts, the secondary ones, power
    lines = set(printed.splitlines())
    missing = [line for t in tables for line in t if line not in lines]
    assert not missing, missing[:5]
    assert "adjusted over the 45 contrasts with a p" in printed
    # And nothing printed is left out of the page: each printed table line is on it.
    doc_lines = set(FLOOR.splitlines())
    assert [x for x in printed.splitlines() if x.startswith("| ") and x not in doc_lines] == []


def test_study3s_tables_and_quoted_intervals_are_printed_by_its_command(printed_s3, printed_design):
    argv = s3_command()
    files = [argv[i + 1] for i, x in enumerate(argv) if x == "--from-csv"]
    assert len(files) == 12 * 4 + 16 * 2 and "--holm-avg" in argv  # every job of multi_a-c, hire_a-c
    assert argv.count("--contrast") == 5 and argv.count("--power") == 5 and argv[argv.index("--family") + 1] == "5"
    tables = result_tables(S3)
    assert len(tables) == 3  # rows, the family's contrasts, power
    lines = set(printed_s3.splitlines())
    assert [line for t in tables for line in t if line not in lines] == []
    assert [x for x in printed_s3.splitlines() if x.startswith("| ") and x not in set(S3.splitlines())] == []
    assert "adjusted over the 5 avg readings alone" in printed_s3
    quoted = set(INTERVAL.findall(S3))
    # each printed by one of the section's two commands: the narrower family's, or the design's (--plan)
    assert len(quoted) > 15 and sorted(q for q in quoted if q not in printed_s3 and q not in printed_design) == []


def test_study3_names_each_members_n_and_mde_as_printed(printed_s3):
    """The family table: C1-C5 with the n and both MDEs of the power table's avg line."""
    power = {(ln.split(" | ")[0].strip("| "), ln.split(" | ")[1]): ln.split(" | ")
             for ln in printed_s3.splitlines() if ln.startswith("| ") and " | avg | " in ln and ln.count("|") == 10}
    members = [ln for ln in S3.splitlines() if re.match(r"\| C[1-5] \| .*\(row \d+ - row \d+\)", ln)]
    assert [m.split(" | ")[0] for m in members] == ["| C1", "| C2", "| C3", "| C4", "| C5"]
    for m in members:
        cells = [c.strip() for c in m.strip("|").split("|")]
        a, b = re.search(r"row (\d+) - row (\d+)", cells[1]).groups()
        row = power[(a, b)]
        n, mde, mde_family = row[3], row[6], row[7]
        assert (cells[2], cells[3]) == (n, f"{mde} / {mde_family}"), (m, row)


def test_every_interval_the_readings_quote_is_printed(printed):
    readings = FLOOR[FLOOR.index("### What it answers"):FLOOR.index("### The earlier study")]
    quoted = set(INTERVAL.findall(readings))
    assert len(quoted) > 30
    assert sorted(q for q in quoted if q not in printed) == []


def test_the_audits_numbers(printed):
    """The audit's headline-changing contrasts (issue 36) as the command prints them."""
    for line in ("| 12 | 4 | avg | 5 | +1.2 [+0.3, +2.1] | 0.018 | 0.073 |",
                 "| 11 | 5 | avg | 5 | -1.9 [-2.3, -1.6] | <0.001 | <0.001 |",
                 "| 5 | 4 | avg | 5 | +2.7 [+1.8, +3.5] | 0.001 | 0.008 |",
                 "| 8 | 4 | avg | 5 | +1.1 [-0.0, +2.3] | 1.25 | 2.1 | 3.1 | 41 |"):
        assert line in printed, line


def test_holm_avg_adjusts_over_the_average_readings_alone(capsys):
    """--holm-avg (Study III's family is planned on the average): p Holm over the avg readings only,
    the per-task readings descriptive (no p Holm), the header saying which."""
    from deepen_run.report.contrasts import holm

    argv = ["--from-csv", str(ROOT / "docs" / "results" / "floor_seeds.csv"), "--baseline", "pooling=mean",
            "--contrast", "8:4", "--contrast", "12:11", "--contrast", "1:4", "--only-contrasts"]
    report.main(argv + ["--json"])
    everything = __import__("json").loads(capsys.readouterr().out)["contrasts"]
    report.main(argv + ["--holm-avg", "--json"])
    cs = __import__("json").loads(capsys.readouterr().out)["contrasts"]
    avg = [c for c in cs if c["task"] == "avg"]
    assert len(avg) == 3 and len(cs) == 9
    assert [c["p_holm"] for c in avg] == pytest.approx(holm([c["p"] for c in avg]))
    assert all(c["p_holm"] is None and c["p"] is not None for c in cs if c["task"] != "avg")
    # over 3 readings, not 9: never stricter than the report's Holm over every reading
    assert all(a["p_holm"] <= b["p_holm"] + 1e-12 for a, b in zip(cs, everything) if a["task"] == "avg")
    report.main(argv + ["--holm-avg"])
    out = capsys.readouterr().out
    assert "p Holm: adjusted over the 3 avg readings alone (the per-task ones are descriptive)" in out
    table = out[out.index("Contrasts ("):].splitlines()
    assert sorted(ln.split(" | ")[2] for ln in table if ln.endswith(" | - |")) == ["sst2"] * 3 + ["stsb"] * 3
    # Rows compared on one task (--tasks sst2): that reading is their average, in the family (it was empty).
    report.main(argv + ["--tasks", "sst2", "--holm-avg", "--json"])
    one = __import__("json").loads(capsys.readouterr().out)["contrasts"]
    assert len(one) == 3 and {c["task"] for c in one} == {"sst2"}
    assert [c["p_holm"] for c in one] == pytest.approx(holm([c["p"] for c in one]))


def test_rows_rebuilt_from_the_csv_keep_their_settings_and_baselines():
    rows, keys = from_csv.load(ROOT / "docs" / "results" / "floor_seeds.csv")
    assert len(rows) == 12 and all(len(r["per_seed"][t]) == 5 for r in rows for t in ("sst2", "stsb"))
    cfg = {r["id"]: r["config"] for r in rows}
    assert cfg[1]["backbone.duplicate_layers"] == "[1, 2]" and cfg[7]["method.extractor"] == "False"
    assert (cfg[12]["task.names"], cfg[12]["schedule.name"]) == ("[sst2, stsb]", "annealed")
    table = report.finish(rows, keys, {k: r["settings"] for k, r in zip(keys, rows)}, ["sst2", "stsb"], [],
                          ["pooling=mean"], True)
    assert {r["id"]: r["baseline"] for r in table["rows"]} == {1: 4, 2: 4, 3: 4, 4: 4, 5: 5, 6: 6, 7: 4, 8: 4, 9: 4,
                                                               10: 4, 11: 11, 12: 11}


def test_bad_input_names_the_culprit(tmp_path, capsys):
    bad = tmp_path / "seeds.csv"
    bad.write_text("row,backbone,method,setup,settings,task,seed\n1,minilm,baseline,single-task,-,sst2,1\n")
    with pytest.raises(SystemExit) as e:
        report.main(["--from-csv", str(bad)])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == (f"deepen-report: error: {bad}: no column value (the format "
                                               "deepen-report --seeds-csv writes: row, backbone, method, setup, "
                                               "settings, task, seed, value)")
    with pytest.raises(SystemExit) as e:
        report.main(["--from-csv", str(ROOT / "docs" / "results" / "floor_seeds.csv"), "--uri", "sqlite:///x.db"])
    assert e.value.code == 2 and "--from-csv reads no MLflow store: drop --uri" in capsys.readouterr().err


def test_a_study_published_in_parts_joins_into_the_table_of_one_file(tmp_path, capsys):
    """Study III publishes one per-seed CSV a job (docs/results/s3/jobs/<preset>/<job>.csv): several --from-csv
    files merge rows with equal settings, so the parts' table equals the table of one file; a task and
    seed given twice is refused in one line."""
    import csv

    src = ROOT / "docs" / "results" / "floor_seeds.csv"
    with src.open(newline="") as f:
        lines = list(csv.DictReader(f))
    head = list(lines[0])
    # Part A: rows 1-8 and seeds 1-3 of rows 9-12; part B: seeds 4-5 of rows 9-12, renumbered from 1.
    a = [x for x in lines if int(x["row"]) <= 8 or int(x["seed"]) <= 3]
    b = [x | {"row": str(int(x["row"]) - 8)} for x in lines if int(x["row"]) > 8 and int(x["seed"]) > 3]
    for path, part in ((tmp_path / "a.csv", a), (tmp_path / "b.csv", b)):
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, head)
            w.writeheader()
            w.writerows(part)
    joined, jkeys = from_csv.load_all([tmp_path / "a.csv", tmp_path / "b.csv"])
    whole, wkeys = from_csv.load(src)
    assert jkeys == wkeys and [r["per_seed"] for r in joined] == [r["per_seed"] for r in whole]
    assert [r["id"] for r in joined] == list(range(1, 13))

    def table(*files):
        report.main([x for p in files for x in ("--from-csv", str(p))] + ["--baseline", "pooling=mean"])
        return capsys.readouterr().out

    assert table(tmp_path / "a.csv", tmp_path / "b.csv") == table(src)
    with pytest.raises(SystemExit) as e:
        table(src, tmp_path / "b.csv")
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith(f"deepen-report: error: {tmp_path / 'b.csv'}: row ") \
        and "seed 4 is also in an earlier --from-csv file" in err and "\n" not in err


def test_jobs_published_one_a_file_join_into_rows(tmp_path):
    """Study III publishes one file a job (scripts/study_jobs.py), each a one-row report labelled "-".
    Joined: a draw that follows the seed (method.random_seed=${seed}) is one row over its seeds, not a
    row a seed; where GLUE lives and what a run chose for itself (train/...) do not split a row; and
    the rows are labelled against each other again."""
    import csv
    import json

    head = ["row", "backbone", "method", "setup", "settings", "task", "seed", "value", "runs", "git_commits", "config"]
    files = []
    for importance in ("dynamic", "random"):
        for seed in ("101", "102", "103"):
            cfg = {"backbone.name": "minilm", "method.name": "hire", "method.importance": importance,
                   "method.random_seed": seed if importance == "random" else "0", "train.max_steps": "300",
                   "data.glue_dir": f"/machine-{seed}/glue", "train/optimizer_impl": "fused" if seed == "101" else "foreach"}
            path = tmp_path / f"{importance}-{seed}.csv"
            with path.open("w", newline="") as f:
                w = csv.writer(f)
                w.writerow(head)
                for task, value in (("sst2", 80 + int(seed) % 10), ("stsb", 70 + int(seed) % 10)):
                    w.writerow(["1", "minilm", "hire", "single-task", "-", task, seed, value, 1, "abc",
                                json.dumps(cfg, sort_keys=True)])
            files.append(path)
    rows, keys = from_csv.load_all(files)
    assert len(rows) == 2, [r["settings"] for r in rows]
    assert [sorted(r["per_seed"]["sst2"]) for r in rows] == [["101", "102", "103"]] * 2
    by = {dict(k)["method.importance"]: r for k, r in zip(keys, rows)}
    assert by["random"]["config"]["method.random_seed"] == "seed"
    assert by["dynamic"]["config"]["method.random_seed"] == "0"
    assert "data.glue_dir" not in by["random"]["config"] and "train/optimizer_impl" not in by["random"]["config"]
    assert by["random"]["settings"] == "importance=random random_seed=seed"
    assert by["dynamic"]["settings"] == "importance=dynamic random_seed=0"
    # a lone job whose fixed draw equals its seed is not folded: one seed is no evidence of following it
    lone, _ = from_csv.load_all([files[3], files[0]])
    assert {r["config"]["method.random_seed"] for r in lone} == {"101", "0"}


def test_a_setting_added_later_joins_at_auto_and_splits_when_set(tmp_path):
    """A job published after train.attention existed (at auto: what earlier runs did) joins the
    rows of jobs published before it; a value set by hand makes a row of its own."""
    import csv
    import json

    head = ["row", "backbone", "method", "setup", "settings", "task", "seed", "value", "runs", "git_commits", "config"]
    files = []
    for seed, extra in (("101", {}), ("102", {"train.attention": "auto", "train.dropout_masks": "auto"}),
                        ("103", {"train.attention": "eager"})):
        cfg = {"backbone.name": "minilm", "method.name": "baseline", "train.max_steps": "300"} | extra
        path = tmp_path / f"job-{seed}.csv"
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(head)
            w.writerow(["1", "minilm", "baseline", "single-task", "-", "sst2", seed, 80, 1, "abc",
                        json.dumps(cfg, sort_keys=True)])
        files.append(path)
    rows, keys = from_csv.load_all(files)
    seeds = sorted(sorted(r["per_seed"]["sst2"]) for r in rows)
    assert seeds == [["101", "102"], ["103"]], seeds
    assert [dict(k).get("train.attention") for k in keys if len(dict(k)) == 4] == ["eager"]


def test_the_readme_quotes_the_results_page():
    """One home per fact: every interval the README's Results section quotes is on docs/results.md."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Results"):]
    section = section[:section.index("\n## ", 1)]
    quoted = INTERVAL.findall(section)
    assert len(quoted) >= 4
    assert [q for q in quoted if q not in DOC] == []
