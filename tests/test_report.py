"""deepen-report as the study's table: only runs that share every setting but the seed are averaged
together, dry runs stay out, and the paired delta-vs-baseline interval is right on known numbers.
Runs are written to a real MLflow store through the Tracker with the real composed configs as params."""
import csv
import math

import pytest
from scipy import stats

from conftest import make_cfg
from deepen_run import report
from deepen_run.redact import public_config
from deepen_run.runner import tags_for
from deepen_run.tracking import Tracker, flatten

EXP = "study-test"


def log_run(uri, overrides, metrics, status="FINISHED", extra_tags=None):
    cfg = make_cfg(*overrides, f"tracking.uri={uri}", f"tracking.experiment={EXP}")
    t = Tracker(uri, EXP)
    t.start("r", tags_for(cfg) | (extra_tags or {}))
    t.log_params(flatten(public_config(cfg)))
    t.log_metrics(metrics, 1)
    t.end(status)


def rte(acc):
    return {"eval/rte/accuracy": acc / 100, "params/total": 2.3e7, "params/trainable": 2.3e7,
            "params/ratio": 1.0, "train/step_time_s": 0.5}


def test_runs_differing_in_anything_but_the_seed_are_separate_rows(mlflow_uri, tmp_path, capsys):
    base = ["method=baseline", "task=rte", "backbone=minilm"]
    for seed, steps, acc in [(1, 60, 60.0), (2, 60, 64.0), (1, 5, 50.0), (2, 5, 52.0)]:
        log_run(mlflow_uri, base + [f"seed={seed}", f"train.max_steps={steps}"], rte(acc))
    # Same settings but another tracking store path / run name: still the same row (not a setting).
    log_run(mlflow_uri, base + ["seed=3", "train.max_steps=60", "tracking.run_name=x"], rte(62.0))
    # Never in the table: a dry run (even with a metric), a failed run.
    log_run(mlflow_uri, base + ["seed=4", "train.max_steps=60", "dry_run=true"], rte(99.0))
    log_run(mlflow_uri, base + ["seed=5", "train.max_steps=60"], rte(1.0), status="FAILED")
    report.main(["--uri", mlflow_uri, "--experiment", EXP, "--out", str(tmp_path / "rep")])
    md = capsys.readouterr().out
    rows = {r["settings"]: r for r in csv.DictReader(open(tmp_path / "rep" / "results.csv"))}
    assert set(rows) == {"train.max_steps=5", "train.max_steps=60"}
    assert float(rows["train.max_steps=60"]["rte"]) == pytest.approx(62.0)
    assert float(rows["train.max_steps=60"]["rte_std"]) == pytest.approx(2.0)
    assert rows["train.max_steps=60"]["n"] == "3" and rows["train.max_steps=5"]["n"] == "2"
    assert float(rows["train.max_steps=5"]["rte"]) == pytest.approx(51.0)
    assert "| baseline | single-task | train.max_steps=5 | 51.0 ± 1.4 |" in md
    # Each is its own baseline: no delta between a 5-step and a 60-step run.
    assert md.count("(baseline)") == 2


def test_single_task_rows_span_tasks_and_methods_pair_with_their_baseline(mlflow_uri, tmp_path):
    # Baseline and HIRE on RTE and MRPC, seeds 1-3: per-seed averages baseline 70, 72, 74 and
    # HIRE 72, 73, 77, so the paired differences are 2, 1, 3 (mean 2, sd 1).
    base_avg, hire_avg = [70.0, 72.0, 74.0], [72.0, 73.0, 77.0]
    for method, avgs in (("baseline", base_avg), ("hire", hire_avg)):
        for seed, avg in zip((1, 2, 3), avgs):
            o = [f"method={method}", "backbone=minilm", f"seed={seed}", "train.max_steps=60"]
            log_run(mlflow_uri, o + ["task=rte"], rte(avg - 5))
            log_run(mlflow_uri, o + ["task=mrpc"], {"eval/mrpc/accuracy": (avg + 5) / 100,
                                                     "eval/mrpc/f1": (avg + 5) / 100, "params/ratio": 1.0})
    # Multi-task PALs and a multi-task baseline of the same tasks and schedule.
    for method, avg in (("baseline", 60.0), ("pals", 66.0)):
        log_run(mlflow_uri, [f"method={method}", "backbone=minilm", "seed=1", "train.max_steps=60",
                             "task.names=[rte,mrpc]", "schedule=annealed"],
                {"eval/rte/accuracy": avg / 100, "eval/mrpc/accuracy": avg / 100, "eval/mrpc/f1": avg / 100,
                 "params/ratio": 1.1})
    table = report.build(report.load_runs(mlflow_uri, EXP, {}))
    rows = {(r["method"], r["setup"]): (i, r) for i, r in enumerate(table["rows"], 1)}
    assert set(rows) == {("baseline", "single-task"), ("hire", "single-task"),
                         ("baseline", "multi-task rte+mrpc, annealed"), ("pals", "multi-task rte+mrpc, annealed")}
    (ib, b), (_, h) = rows["baseline", "single-task"], rows["hire", "single-task"]
    assert b["n"] == 3 and b["rte"]["mean"] == pytest.approx(67.0) and b["mrpc"]["mean"] == pytest.approx(77.0)
    assert b["settings"] == "-" and h["settings"] == "-"  # nothing but the method differs
    assert h["baseline"] == ib and b["baseline"] == ib and b["delta"] is None
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    assert h["delta"] == pytest.approx({"mean": 2.0, "lo": 2.0 - half, "hi": 2.0 + half, "n": 3})
    assert h["delta"]["lo"] == pytest.approx(-0.4841, abs=1e-3)
    assert h["x_backbone_all"] == pytest.approx(2.0)  # two single-task models
    (im, mb), (_, pals) = rows["baseline", "multi-task rte+mrpc, annealed"], rows["pals", "multi-task rte+mrpc, annealed"]
    assert pals["baseline"] == im and mb["baseline"] == im  # the multi-task baseline, not the single-task one
    assert pals["delta"] == {"mean": pytest.approx(6.0), "lo": None, "hi": None, "n": 1}
    assert pals["x_backbone_all"] == pytest.approx(1.1)
    md = report.to_markdown(table)
    assert f"Baseline of row {rows['hire', 'single-task'][0]}: row {ib} (baseline, single-task)." in md
    assert "+2.0 [-0.5, +4.5] (n=3)" in md


def test_a_multi_task_row_without_its_own_baseline_uses_the_single_task_one(mlflow_uri):
    for seed in (1, 2):
        log_run(mlflow_uri, ["method=baseline", "task=rte", f"seed={seed}"], rte(60.0 + seed))
        log_run(mlflow_uri, ["method=pals", "task.names=[rte,mrpc]", "schedule=annealed", f"seed={seed}"],
                {"eval/rte/accuracy": (63.0 + 2 * seed) / 100, "eval/mrpc/accuracy": 0.8, "eval/mrpc/f1": 0.8})
    rows = report.build(report.load_runs(mlflow_uri, EXP, {}))["rows"]
    (base,) = [i for i, r in enumerate(rows, 1) if r["method"] == "baseline"]
    (pals,) = [r for r in rows if r["method"] == "pals"]
    assert pals["baseline"] == base
    # Common task RTE only: differences 65-61=4 and 67-62=5.
    assert pals["delta"]["mean"] == pytest.approx(4.5) and pals["delta"]["n"] == 2


def test_options_varying_within_a_method_label_the_rows(mlflow_uri):
    for k in (1, 3):
        for seed in (1, 2):
            log_run(mlflow_uri, ["method=hire", f"method.gru_layers={k}", "task=rte", f"seed={seed}"], rte(60.0 + k))
    log_run(mlflow_uri, ["method=baseline", "task=rte", "seed=1"], rte(55.0))
    rows = {(r["method"], r["settings"]): r for r in report.build(report.load_runs(mlflow_uri, EXP, {}))["rows"]}
    assert set(rows) == {("baseline", "-"), ("hire", "gru_layers=1"), ("hire", "gru_layers=3")}
    assert rows["hire", "gru_layers=3"]["rte"]["mean"] == pytest.approx(63.0)
    assert rows["hire", "gru_layers=3"]["delta"]["mean"] == pytest.approx(8.0)


def test_a_seed_run_twice_counts_once_and_tasks_restricts_every_column(mlflow_uri, tmp_path, capsys):
    # The baseline ran RTE and MRPC with seeds 1-2; an ablation grid ran RTE seed 1 again (same
    # result, a deterministic rerun) and HIRE on RTE only.
    base = ["method=baseline", "backbone=minilm"]
    for seed, acc in ((1, 60.0), (2, 64.0)):
        log_run(mlflow_uri, base + ["task=rte", f"seed={seed}"], rte(acc))
        log_run(mlflow_uri, base + ["task=mrpc", f"seed={seed}"], {"eval/mrpc/accuracy": 0.9, "eval/mrpc/f1": 0.9})
        log_run(mlflow_uri, ["method=hire", "backbone=minilm", "task=rte", f"seed={seed}"], rte(acc + 3))
    log_run(mlflow_uri, base + ["task=rte", "seed=1"], rte(60.0))
    rows = {r["method"]: r for r in report.build(report.load_runs(mlflow_uri, EXP, {}))["rows"]}
    b = rows["baseline"]
    # Seeds, not runs: n = 2 and the std of (60, 64), not of (60, 60, 64).
    assert b["n"] == 2 and b["rte"]["n"] == 2
    assert b["rte"]["mean"] == pytest.approx(62.0) and b["rte"]["std"] == pytest.approx(math.sqrt(8))
    assert b["avg"]["mean"] == pytest.approx((62.0 + 90.0) / 2)  # its own tasks: not comparable to HIRE's
    # --tasks rte: one column, and every row's average is over RTE alone.
    report.main(["--uri", mlflow_uri, "--experiment", EXP, "--tasks", "rte", "--out", str(tmp_path / "rep")])
    out = {r["method"]: r for r in csv.DictReader(open(tmp_path / "rep" / "results.csv"))}
    assert "mrpc" not in out["baseline"] and float(out["baseline"]["avg"]) == pytest.approx(62.0)
    assert float(out["hire"]["avg"]) == pytest.approx(65.0) and float(out["hire"]["delta"]) == pytest.approx(3.0)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        report.main(["--uri", mlflow_uri, "--experiment", EXP, "--tasks", "rte,sst-2"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == ("deepen-report: error: --tasks 'rte,sst-2': sst-2 is not a GLUE task; "
                                               "choose from " + ", ".join(report.TASKS))
