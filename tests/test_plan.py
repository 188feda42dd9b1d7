"""deepen-report --plan (deepen_run/report/plan.py): Study III read by the plan it was designed with
(docs/plans/s3.yaml: Holm over all 15 readings, 10993d0), from its published job files alone; an
edited copy of the plan is reported as changed, with its diff, and its changed member as post hoc."""
from pathlib import Path

import pytest

from deepen_run.config.schema import ROOT
from deepen_run.report import main as report
from deepen_run.report.contrasts import sign_flip

PLAN = ROOT / "docs" / "plans" / "s3.yaml"
JOBS = ROOT / "docs" / "results" / "s3" / "jobs"
PARTS = ("s3_multi_a", "s3_multi_b", "s3_multi_c", "s3_hire_a", "s3_hire_b", "s3_hire_c")


def files() -> list[str]:
    return [x for p in PARTS for f in sorted((JOBS / p).glob("*.csv")) for x in ("--from-csv", str(f))]


def family(out: str) -> dict[tuple[str, str], list[str]]:
    """(member, task) -> the planned family table's cells."""
    rows = [ln.strip("|").split(" | ") for ln in out.splitlines()
            if ln.startswith("| ") and ln.count("|") == 13 and not ln.startswith("| member")]
    return {(r[0].strip(), r[3]): [c.strip() for c in r] for r in rows}


def test_study3_by_its_design_time_plan(capsys):
    report.main(["--plan", str(PLAN), *files()])
    out = capsys.readouterr().out
    assert out.startswith(f"Plan: {PLAN} (Study III), sha256 ")
    assert "the runs recorded this plan (80 job files): read as designed" in out
    assert "Holm over the 15 readings of the family" in out
    fam = family(out)
    assert len(fam) == 15 and {m for m, _ in fam} == {"C1", "C2", "C3", "C4", "C5"}
    holding = {k for k, r in fam.items() if r[10] == "holds"}
    assert {m for m, t in holding if t == "avg"} == {"C3", "C5"}  # 2 of 5, not the 4 of the narrowed family
    assert "Members with a reading that holds: C3, C5 (2 of 5)." in out
    # The design-time Holm: C1's avg p 0.022 x its rank's multiplier, as docs/results.md quotes it.
    assert fam[("C1", "avg")][6:9] == ["0.022", "0.031", "0.17"]
    assert all(r[11] == "as planned" for r in fam.values())


def test_a_changed_contrast_is_reported_first_with_its_diff_and_labelled_post_hoc(tmp_path, capsys):
    edited = tmp_path / "s3.yaml"
    text = PLAN.read_text()
    edited.write_text(text.replace("b: variant=low_rank", "b: method=baseline setup=multi\n    # C4 aimed at the baseline"))
    assert edited.read_text() != text
    report.main(["--plan", str(edited), *files()])
    out = capsys.readouterr().out
    assert out.startswith("**The plan changed after its runs recorded it.**")
    assert "member C4 changed" in out and "-    b: variant=low_rank" in out and "+    b: method=baseline setup=multi" in out
    fam = family(out)
    assert {m for (m, _), r in fam.items() if r[11] == "post hoc"} == {"C4"}
    assert all(r[11] == "as planned" for (m, _), r in fam.items() if m != "C4")
    # A change to the adjustment changes every reading's test: every member is post hoc.
    edited.write_text(text.replace("over: readings", "over: avg"))
    report.main(["--plan", str(edited), *files()])
    out = capsys.readouterr().out
    assert "adjustment changed" in out and "Holm over the 5 readings of the family" in out
    assert {r[11] for r in family(out).values()} == {"post hoc"}


def test_the_sign_flip_test_is_exact():
    assert sign_flip([1.0, 2.0, 0.5, 3.0, 1.5, 2.5]) == pytest.approx(2 / 64)  # all positive: its floor at n = 6
    assert sign_flip([1.0] * 5 + [2.0] * 6) == pytest.approx(2 / 2 ** 11)
    # [1, -1, 2], sum 2: the 8 sign choices give sums 2, 4, 0, 2, -2, 0, -4, -2; |sum| >= 2 in 6 of 8.
    assert sign_flip([1.0, -1.0, 2.0]) == pytest.approx(6 / 8)
    assert sign_flip([1.0]) is None and sign_flip([0.0, 0.0]) is None


def test_bad_plans_name_the_culprit(tmp_path, capsys):
    bad = tmp_path / "p.yaml"
    for text, line in ((PLAN.read_text().replace("decide: t ", "decide: z "), "test.decide must be one of t, exact, both"),
                       ("name: x\n", "no 'alpha'"),
                       (PLAN.read_text().replace("    n: 11\n", ""), "family member C5: needs n")):
        bad.write_text(text)
        with pytest.raises(SystemExit) as e:
            report.main(["--plan", str(bad), *files()])
        assert e.value.code == 2 and line in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        report.main(["--plan", str(PLAN), "--contrast", "1:2", *files()])
    assert e.value.code == 2 and "--plan names the contrasts and their adjustment: drop --contrast" in capsys.readouterr().err


def test_results_page_leads_with_the_design_and_prints_it_from_the_job_files(capsys):
    """docs/results.md's Study III table by its design is printed by the page's command, line for line."""
    import re
    import shlex
    import subprocess
    import sys

    doc = (ROOT / "docs" / "results.md").read_text()
    s3 = doc[doc.index("## Study III"):doc.index("## The floor study")]
    assert s3.index("as designed: 2 of 5 hold") < s3.index("chosen after the results")
    assert 'eval "$(python scripts/study.py --study s3 --part design --command)"' in s3
    line = subprocess.run([sys.executable, "scripts/study.py", "--study", "s3", "--part", "design", "--command"],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout
    argv = shlex.split(line)
    assert argv[0] == "deepen-report" and argv[argv.index("--plan") + 1] == "docs/plans/s3.yaml"
    import os

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        report.main(argv[1:])
    finally:
        os.chdir(cwd)
    printed = set(capsys.readouterr().out.splitlines())
    planned = [ln for ln in s3.splitlines() if re.match(r"\| (C[1-5]|E\d) \| \d+ \| \d+ \|", ln)]
    assert len(planned) == 15 + 3 and [ln for ln in planned if ln not in printed] == []
    # The overclaims the audit listed are gone from the page and the README's Results.
    readme = (ROOT / "README.md").read_text()
    results = readme[readme.index("## Results"):readme.index("## Where to read more")]
    for text in (s3, results):
        assert "Four hold" not in text and "Four of the five hold" not in text
        assert "annealing mitigates" not in text.replace("not that annealing mitigates", "")
        assert "Holm rejects C3, C5 and C2 first" not in text


def test_a_studys_jobs_record_its_plan_and_a_later_edit_is_post_hoc(tmp_path, capsys):
    """scripts/study_jobs.py with a plan (a researcher's own study, here of one seed): each job file
    gets the plan's sha in a `plan` column and the plan's text is kept beside the jobs; the report
    given the same plan reads it as designed, an edited one says so first and labels the member post
    hoc. The jobs' values are Study III's published ones (the sweep itself is not what is tested)."""
    import json
    import shutil
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    import study_jobs

    from deepen_run.report.plan import sha

    plan = tmp_path / "mine.yaml"
    plan.write_text("name: mine\nalpha: 0.05\ntest: {decide: exact}\nadjustment: {method: holm, over: readings}\n"
                    "readings: [sst2, stsb]\nfamily:\n  H:\n    a: extractor=true\n    b: extractor=false\n    n: 1\n")

    def sh(cmd, env=None, capture=False):  # the sweep's and the report's effects, from the published files
        if "--seeds-csv" in cmd:
            out = cmd[cmd.index("--seeds-csv") + 1]
            shutil.copy(JOBS / "s3_hire_c" / out.split("/")[-1].replace(".partial", ""), out)
        else:
            sweep_dir = next(c.split("=", 1)[1] for c in cmd if c.startswith("hydra.sweep.dir="))
            (tmp_path / sweep_dir).mkdir(parents=True, exist_ok=True)
            (tmp_path / sweep_dir / "deepen_sweep.json").write_text(json.dumps({"sweep_id": "x"}))
        return ""

    files = study_jobs.run_preset("s3_hire_c", out=tmp_path / "out", pub=tmp_path / "pub", uri="sqlite:///x.db",
                                  experiment="mine", extra=[], env={}, sh=sh, bin_dir=tmp_path, smoke=True,
                                  plan=plan)
    assert len(files) == 4 and (tmp_path / "pub" / "jobs" / f"plan-{sha(plan.read_text())}.yaml").is_file()
    assert all(open(f).readline().rstrip().endswith(",plan") for f in files)  # the column, last
    argv = [x for f in files for x in ("--from-csv", f)]
    report.main(["--plan", str(plan), *argv])
    out = capsys.readouterr().out
    assert "the runs recorded this plan (4 job files): read as designed" in out
    assert {r[11] for r in family(out).values()} == {"as planned"}
    plan.write_text(plan.read_text().replace("b: extractor=false", "b: gru_layers=4"))
    report.main(["--plan", str(plan), *argv])
    out = capsys.readouterr().out
    assert out.startswith("**The plan changed after its runs recorded it.**") and "member H changed" in out
    assert {r[11] for r in family(out).values()} == {"post hoc"}
    # The edited plan then recorded by more jobs than the first (here 2 of the 4 files re-stamped, then
    # 3): the report still holds the member to the first plan the runs recorded.
    edited = sha(plan.read_text())
    (tmp_path / "pub" / "jobs" / f"plan-{edited}.yaml").write_text(plan.read_text())
    for f in files[:3]:
        text = Path(f).read_text()
        Path(f).write_text(text.replace(text.splitlines()[1].rsplit(",", 1)[1], edited))
    report.main(["--plan", str(plan), *argv])
    out = capsys.readouterr().out
    assert out.startswith("**The plan changed after its runs recorded it.**"), out[:300]
    assert f"{edited} (3 job files" in out and "(1 job files" in out and "member H changed" in out
    assert {r[11] for r in family(out).values()} == {"post hoc"}


def test_study4s_plan_is_sized_from_study3s_paired_sds_and_its_parts_run_its_seeds():
    """docs/plans/s4.yaml: n = 8 and the MDEs it states, from Study III's measured paired sds (its
    published family report's power table); the presets run exactly the planned seeds (the pilot seed
    200 in none of them); study.py's Study IV parts cover every s4 preset."""
    import importlib.util
    import re

    import yaml

    from deepen_run.report.plan import load
    from deepen_run.report.power import mde, n_for

    plan, text = load(ROOT / "docs" / "plans" / "s4.yaml")
    assert len(plan["family"]) == 7 and plan["adjustment"]["over"] == "avg"
    assert {m["n"] for m in plan["family"].values()} == {8}
    assert {tuple(m["seeds"]) for m in plan["family"].values()} == {tuple(range(201, 209))}
    power = (ROOT / "docs" / "results" / "s3" / "family_report.md").read_text()
    sd = {(a, b): float(cells[5]) for ln in power.splitlines() if " | avg | " in ln and ln.count("|") == 10
          for cells in [ln.strip("|").split(" | ")] for a, b in [(cells[0].strip(), cells[1])]}
    single, multi, sched = sd[("7", "8")], max(sd[("1", "2")], sd[("1", "5")], sd[("1", "6")]), sd[("1", "3")]
    assert (single, multi, sched) == (0.78, 0.83, 4.33)
    alpha = 0.05 / 7
    assert [n_for(s, 1.0, alpha) for s in (single, multi, sched)] == [11, 12, 238]
    assert [round(float(mde(s, 8, alpha)), 2) for s in (single, multi, sched)] == [1.28, 1.36, 7.12]
    assert "n = 11 (single-task), 12 (multi-task), 238" in text and "MDE 1.28 single-task, 1.36 multi-task, 7.12" in text
    presets = {p.stem: yaml.safe_load(p.read_text()) for p in (ROOT / "conf" / "study").glob("s4_*.yaml")}
    seeds = {name: {int(s) for s in str(p["hydra"]["sweeper"]["params"]["seed"]).split(",")} for name, p in presets.items()}
    assert all(s == {200} for n, s in seeds.items() if "pilot" in n)
    runs = [s for n, s in seeds.items() if "pilot" not in n]
    assert set().union(*runs) == set(range(201, 209))
    spec = importlib.util.spec_from_file_location("study", ROOT / "scripts" / "study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    assert {p for part in study.STUDIES["s4"]["parts"].values() for p in part["presets"]} == set(presets)
    assert study.STUDIES["s4"]["plan"] == ROOT / "docs" / "plans" / "s4.yaml"
    assert re.search(r"1,400 for F7", text)
