"""Study IV's section of docs/results.md is printed by its one command from the published per-job
files alone, read by the plan that was committed before its first job (docs/plans/s4.yaml)."""
import re

import pytest
from test_results_csv import DOC, INTERVAL, PLANNED, ROOT, result_tables, run_report, study_command

S4 = DOC[DOC.index("## Study IV"):DOC.index("## Study III")]


def test_study4s_tables_and_quoted_intervals_are_printed_by_its_command():
    """Study IV is read once, whole, by its plan: the command runs deepen-report --plan over every
    non-pilot job file, each of which recorded the plan's sha, with each member's achieved power."""
    argv = study_command("s4", "family", S4)
    files = [argv[i + 1] for i, x in enumerate(argv) if x == "--from-csv"]
    assert len(files) == 24 + 24 + 16 + 24 + 24 + 16 + 8 + 8  # hire_a-b, capacity, dup_a-b, multi, sched_a-b
    assert argv[argv.index("--plan") + 1] == "docs/plans/s4.yaml" and "--contrast" not in argv
    assert argv.count("--power") == 7 and argv[argv.index("--family") + 1] == "7"
    printed = run_report(argv)
    assert f"the runs recorded this plan ({len(files)} job files): read as designed" in printed
    tables = result_tables(S4, PLANNED)
    assert len(tables) == 4  # rows, the planned family, the exploratory contrasts, power
    lines = set(printed.splitlines())
    assert [line for t in tables for line in t if line not in lines] == []
    assert [x for x in printed.splitlines() if x.startswith("| ") and x not in set(S4.splitlines())] == []
    quoted = set(INTERVAL.findall(S4))
    assert len(quoted) > 7 and sorted(q for q in quoted if q not in printed) == []
    held = re.search(r"Members with a reading that holds: (.*)\.", printed).group(1)
    assert f"Members with a reading that holds: {held}." in S4


def test_study4s_plan_is_older_than_every_study4_job_file():
    """The plan was committed before the first job file, and not changed since."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    if not (ROOT / ".git").exists() or git("rev-parse", "--is-shallow-repository").strip() == "true":
        pytest.skip("needs the repo's whole git history")
    plan = git("log", "-1", "--format=%H", "--", "docs/plans/s4.yaml").strip()
    first_job = git("log", "--diff-filter=A", "--reverse", "--format=%H", "--", "docs/results/s4/jobs").split()[0]
    assert plan != first_job
    assert subprocess.run(["git", "merge-base", "--is-ancestor", plan, first_job], cwd=ROOT).returncode == 0


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_study_reads_itself_again_and_publishes_paths_of_the_repo(tmp_path):
    """`make study-s4 PART=family` again: it replaces the files of the run before (it once stopped at
    its own seeds.csv), and the published report names the plan by its path in the repo."""
    import json
    import subprocess
    import sys

    pub = tmp_path / "pub"
    pub.mkdir()
    (pub / "jobs").symlink_to(ROOT / "docs" / "results" / "s4" / "jobs")
    cmd = [sys.executable, "scripts/study.py", "--study", "s4", "--part", "family", "--out", str(tmp_path / "out"),
           "--publish", str(pub)]
    stale = tmp_path / "out" / "family" / "seeds.csv"  # as a run before this one left it
    stale.parent.mkdir(parents=True)
    stale.write_text("stale\n")
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert stale.read_text().startswith("row,") and len(stale.read_text().splitlines()) > 100
    published = (pub / "family_report.md").read_text()
    assert (pub / "family_contrasts.png").read_bytes()[:4] == b"\x89PNG"
    assert published.startswith("Plan: docs/plans/s4.yaml (Study IV)") and str(ROOT) not in published
    assert "Members with a reading that holds:" in published and "| member | a | b |" in published
    family = json.loads((tmp_path / "out" / "family" / "report.json").read_text())["contrasts"]
    assert len(family) == 7 * 3 and {c["member"] for c in family} == {f"F{i}" for i in range(1, 8)}
