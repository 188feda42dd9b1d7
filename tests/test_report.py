"""deepen-report as the study's table: only runs that share every setting but the seed are averaged
together, dry runs stay out, and the paired delta-vs-baseline interval is right on known numbers.
Runs are written to a real MLflow store through the Tracker with the real composed configs as params."""
import csv
import math

import pytest
from scipy import stats

from conftest import make_cfg
from deepen_run.report import main as report
from deepen_run.config.redact import public_config
from deepen_run.run.names import tags_for
from deepen_run.tracking.store import Tracker, flatten
import forkserver

EXP = "study-test"


def log_run(uri, overrides, metrics, status="FINISHED", extra_tags=None, chosen=None):
    """chosen: the params a run logs about its own choices (train/unpad, ..., run/fast.py)."""
    cfg = make_cfg(*overrides, f"tracking.uri={uri}", f"tracking.experiment={EXP}")
    t = Tracker(uri, EXP)
    t.start("r", tags_for(cfg) | (extra_tags or {}))
    t.log_params(flatten(public_config(cfg)) | (chosen or {}))
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



def test_a_duplicated_row_pairs_with_its_plain_baseline_whatever_the_run_explains_of_its_choices(mlflow_uri):
    """A run logs why it chose and what the choice touched (train/unpad_linears: 36 Linears unpadded
    in MiniLM, 42 with layer 2 copied). As part of the key, that count kept every duplicated row from
    its plain baseline ("- (no baseline row)") and cluttered every label."""
    def chosen(linears):
        return {"train/unpad": "on", "train/unpad_reason": "auto: bf16 on a CPU", "train/unpad_linears": str(linears)}

    for seed in (1, 2):
        log_run(mlflow_uri, ["method=baseline", "task=rte", f"seed={seed}"], rte(60.0 + seed), chosen=chosen(36))
        log_run(mlflow_uri, ["method=hire", "task=rte", "backbone.duplicate_layers=[2]", f"seed={seed}"],
                rte(63.0 + 2 * seed), chosen=chosen(42))
    rows = report.build(report.load_runs(mlflow_uri, EXP, {}))["rows"]
    (base,) = [r for r in rows if r["method"] == "baseline"]
    (hire,) = [r for r in rows if r["method"] == "hire"]
    assert hire["baseline"] == base["id"] and hire["delta"]["mean"] == pytest.approx(4.5)
    assert "unpad" not in hire["settings"] + base["settings"], (hire["settings"], base["settings"])

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


def test_backbone_path_and_glue_dir_separate_rows(mlflow_uri, tmp_path):
    # Another checkpoint or another copy of GLUE is another experiment, even with every other setting equal.
    other = tmp_path / "glue2"
    for seed in (1, 2):
        log_run(mlflow_uri, ["task=rte", f"seed={seed}"], rte(60.0))
        log_run(mlflow_uri, ["task=rte", f"seed={seed}", "backbone.path=/ckpt/minilm-ft"], rte(70.0))
        log_run(mlflow_uri, ["task=rte", f"seed={seed}", f"data.glue_dir={other}"], rte(80.0))
    rows = report.build(report.load_runs(mlflow_uri, EXP, {}))["rows"]
    assert sorted(r["rte"]["mean"] for r in rows) == pytest.approx([60.0, 70.0, 80.0])
    assert all(r["n"] == 2 for r in rows)
    labels = " | ".join(r["settings"] for r in rows)
    assert "backbone.path=/ckpt/minilm-ft" in labels and f"data.glue_dir={other}" in labels


def test_an_ambiguous_baseline_is_an_error_naming_the_candidates_and_the_flag(mlflow_uri, capsys):
    for seed, (mean_pool, pooler, hire) in zip((1, 2, 3), ((80.0, 60.0, 82.0), (81.0, 62.0, 84.0), (79.0, 61.0, 80.0))):
        log_run(mlflow_uri, ["method=baseline", "method.pooling=mean", "task=rte", f"seed={seed}"], rte(mean_pool))
        log_run(mlflow_uri, ["method=baseline", "method.pooling=pooler", "task=rte", f"seed={seed}"], rte(pooler))
        log_run(mlflow_uri, ["method=hire", "task=rte", f"seed={seed}"], rte(hire))
    args = ["--uri", mlflow_uri, "--experiment", EXP]
    with pytest.raises(SystemExit) as e:
        report.main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after MLflow's own store-creation log
    assert err.startswith("deepen-report: error: row 3 (hire, single-task, -) has 2 candidate baselines: "
                          "row 1 (pooling=mean), row 2 (pooling=pooler); pick one with --baseline")
    runs = report.load_runs(mlflow_uri, EXP, {})
    for pick in ("pooling=mean", "1"):
        rows = report.build(runs, baselines=[pick])["rows"]
        assert rows[2]["baseline"] == 1 and rows[2]["delta"]["mean"] == pytest.approx(2.0)
        assert rows[0]["baseline"] == 1 and rows[1]["baseline"] == 2  # a baseline row is its own
    # A named contrast: the two poolings, paired by seed (differences 20, 19, 18).
    table = report.build(runs, baselines=["pooling=mean"], contrasts=["pooling=mean:pooling=pooler"])
    (c,) = [c for c in table["contrasts"] if c["a"] == 1 and c["b"] == 2]
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    assert c["task"] == "rte" and c["n"] == 3 and c["mean"] == pytest.approx(19.0)
    assert (c["lo"], c["hi"]) == (pytest.approx(19.0 - half), pytest.approx(19.0 + half))
    assert c["p"] == pytest.approx(stats.ttest_1samp([20.0, 19.0, 18.0], 0).pvalue)
    with pytest.raises(report.UserError, match="must match exactly one row, it matches row 1"):
        report.build(runs, baselines=["pooling=mean"], contrasts=["method=baseline:method=hire"])


def test_holm_adjusts_over_every_contrast_of_the_report():
    from deepen_run.report.contrasts import holm

    # m = 4 (None is no test): sorted 0.01, 0.02, 0.03, 0.04 -> 0.04, 0.06, 0.06 (monotone), 0.06.
    assert holm([0.04, None, 0.01, 0.03, 0.02]) == [pytest.approx(0.06), None, pytest.approx(0.04),
                                                    pytest.approx(0.06), pytest.approx(0.06)]
    assert holm([0.5, 0.9]) == [pytest.approx(1.0), pytest.approx(1.0)]


@pytest.mark.parametrize("flag", ["--contrast", "--power", "--secondary"])
def test_a_named_contrast_of_rows_without_a_common_seed_is_refused(flag, tmp_path, capsys):
    # Rows 2 and 3 ran seeds 1-3 and 4-6: no pair. The contrast once vanished from the table (exit 0),
    # which reads as if it had been tested.
    path = tmp_path / "seeds.csv"
    lines = ["row,backbone,method,setup,settings,task,seed,value"]
    for row, method, seeds in ((1, "baseline", (1, 2, 3, 4, 5, 6)), (2, "hire", (1, 2, 3)), (3, "pals", (4, 5, 6))):
        lines += [f"{row},minilm,{method},single-task,-,rte,{s},{60 + row + s % 2}" for s in seeds]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SystemExit) as e:
        report.main(["--from-csv", str(path), flag, "2:3"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and f"{flag} 2:3: rows 2 and 3 share" in err, err
    with pytest.raises(SystemExit):  # a row against itself: sd 0, "fully powered", means nothing
        report.main(["--from-csv", str(path), flag, "2:2"])
    assert "compares row 2 with itself" in capsys.readouterr().err
    report.main(["--from-csv", str(path), flag, "2:1"])  # seeds 1-3 in common: fine
    out = capsys.readouterr().out
    assert "| 2 | 1 | rte |" in out and "| 2 | 1 | avg |" not in out  # one task: no avg line repeating it


@pytest.mark.parametrize("args, culprit", [(["--register", "team/sst2"], "no '/' or ':'"),
                                           (["--seeds-csv", "{dir}"], "--seeds-csv {dir} is a folder"),
                                           (["--submission", "{dir}"], "--submission {dir} is a folder")])
def test_output_names_are_checked_before_the_store_is_read(args, culprit, mlflow_uri, tmp_path, capsys):
    # Each once ended in a traceback (MlflowException, IsADirectoryError), the first after the table.
    with pytest.raises(SystemExit) as e:
        report.main(["--uri", mlflow_uri, *(a.format(dir=tmp_path) for a in args)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and culprit.format(dir=tmp_path) in err, err


def test_an_undefined_metric_counts_as_zero_as_in_the_runs_eval_score(mlflow_uri):
    # Seed 2's STS-B prediction collapsed to a constant: Pearson and Spearman logged as NaN, which
    # its eval/score counts as 0. The report must count that seed too, not drop it from the row.
    nan = float("nan")
    for seed, (p, s) in ((1, (0.8, 0.7)), (2, (nan, nan))):
        log_run(mlflow_uri, ["method=hire", "task=stsb", f"seed={seed}"], {"eval/stsb/pearson": p, "eval/stsb/spearmanr": s})
    log_run(mlflow_uri, ["method=baseline", "task=stsb", "seed=1"], {"eval/stsb/pearson": 0.5, "eval/stsb/spearmanr": 0.5})
    log_run(mlflow_uri, ["method=baseline", "task=stsb", "seed=2"], {"eval/stsb/pearson": 0.4, "eval/stsb/spearmanr": 0.6})
    rows = {r["method"]: r for r in report.build(report.load_runs(mlflow_uri, EXP, {}))["rows"]}
    hire = rows["hire"]
    assert hire["n"] == 2 and hire["stsb"]["mean"] == pytest.approx(37.5)  # (75 + 0) / 2
    assert hire["delta"]["n"] == 2 and hire["delta"]["mean"] == pytest.approx((25.0 - 50.0) / 2)


def test_register_picks_the_best_run_of_a_row_whose_draw_follows_the_seed(mlflow_uri):
    # method.random_seed=${seed}: each run's own key says random_seed=1, =2; the row folds them into
    # random_seed=seed. --register once matched runs by their own key and found none.
    from deepen_run.report.register import best_run

    for seed, acc in ((1, 60.0), (2, 66.0), (3, 63.0)):
        log_run(mlflow_uri, ["method=hire", "method.importance=random", f"method.random_seed={seed}", "task=rte",
                             f"seed={seed}"], rte(acc) | {"eval/score": acc / 100}, extra_tags={"model_id": f"m-{seed}"})
    runs = report.load_runs(mlflow_uri, EXP, {})
    (row,) = report.build(runs)["rows"]
    assert row["n"] == 3 and row["config"]["method.random_seed"] == "seed"
    assert best_run(runs, row)["tags"]["model_id"] == "m-2"


def test_a_multi_task_epoch_length_does_not_split_single_task_rows(mlflow_uri):
    # train.steps_per_task sizes a multi-task epoch only: a single-task run ignores it, so the same
    # experiment run from a PALs preset (300) and without it (null) is one row.
    for seed, steps in ((1, "300"), (2, "null")):
        log_run(mlflow_uri, ["method=baseline", "task=rte", f"seed={seed}", f"train.steps_per_task={steps}"],
                rte(60.0 + seed))
    log_run(mlflow_uri, ["method=pals", "task.names=[rte,mrpc]", "schedule=annealed", "seed=1",
                         "train.steps_per_task=300"],
            {"eval/rte/accuracy": 0.65, "eval/mrpc/accuracy": 0.8, "eval/mrpc/f1": 0.8})
    rows = report.build(report.load_runs(mlflow_uri, EXP, {}))["rows"]
    (base,) = [r for r in rows if r["method"] == "baseline"]
    (pals,) = [r for r in rows if r["method"] == "pals"]
    assert base["n"] == 2 and pals["baseline"] == base["id"]
    assert "steps_per_task" not in base["settings"] and "train.steps_per_task" in pals["config"]


def test_a_seed_run_twice_is_shown_and_marked_when_its_values_differ(mlflow_uri, tmp_path):
    for seed, acc in ((1, 60.0), (2, 64.0)):
        log_run(mlflow_uri, ["task=rte", f"seed={seed}"], rte(acc))
    log_run(mlflow_uri, ["task=rte", "seed=1"], rte(60.0))  # a deterministic rerun: agrees
    log_run(mlflow_uri, ["task=rte", "seed=2"], rte(66.0))  # disagrees
    table = report.build(report.load_runs(mlflow_uri, EXP, {}))
    (row,) = table["rows"]
    assert row["n"] == 2 and row["per_seed"]["rte"] == {"1": pytest.approx(60.0), "2": pytest.approx(65.0)}
    md = report.to_markdown(table)
    assert md.splitlines()[2].startswith("| 1† | ")
    assert "Row 1: seed 1 of rte ran 2 times, same value (60.00, 60.00); counted once." in md
    assert "† Row 1: seed 2 of rte ran 2 times with different values (64.00, 66.00); their mean is used." in md
    lines = list(csv.DictReader(report.seeds_csv(table).splitlines()))
    assert [(x["task"], x["seed"], float(x["value"]), x["runs"]) for x in lines] == \
        [("rte", "1", 60.0, "2"), ("rte", "2", 65.0, "2")]


TINY = ["backbone=tiny", "train.max_steps=2", "train.batch_size=8", "train.learning_rate=1e-3",
        "data.max_train_samples=32", "data.max_eval_samples=64", "data.max_seq_length=32"]


@pytest.mark.slow
@pytest.mark.subprocess
def test_json_contrasts_are_recomputed_from_per_seed_which_equals_mlflow(tmp_path, glue_dir):
    import json

    from conftest import cli, runs_of

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    r = cli("-m", "method=baseline,hire", "seed=1,2,3", "task=sst2,stsb", *TINY, f"tracking.uri={uri}",
            f"hydra.sweep.dir={tmp_path}/sweep")
    assert r.returncode == 0, r.stderr[-3000:]
    rep = report_cli("--uri", uri, "--json", "--seeds-csv", str(tmp_path / "seeds.csv"),
                     "--contrast", "method=hire:method=baseline")
    assert rep.returncode == 0, rep.stderr[-3000:]
    out = json.loads(rep.stdout)
    rows = {r["method"]: r for r in out["rows"]}
    assert set(rows) == {"baseline", "hire"} and all(r["n"] == 3 for r in rows.values())
    # per_seed: the runs' own logged metrics, read back from MLflow (x100; STS-B: Pearson/Spearman mean).
    _, runs = runs_of(uri)
    for run in (x for x in runs if x.data.tags.get("sweep_role") == "child"):
        m, t, seed = run.data.metrics, run.data.tags["task"], run.data.tags["seed"]
        want = 100 * (m["eval/sst2/accuracy"] if t == "sst2" else (m["eval/stsb/pearson"] + m["eval/stsb/spearmanr"]) / 2)
        assert rows[run.data.tags["method"]]["per_seed"][t][seed] == pytest.approx(want, abs=1e-9)
    # Every contrast, recomputed from per_seed with scipy: the paired t interval and its p.
    cs = {c["task"]: c for c in out["contrasts"]}
    assert set(cs) == {"sst2", "stsb", "avg"} and len(out["contrasts"]) == 3  # hire:baseline is the default one
    a, b = rows["hire"], rows["baseline"]
    diffs = {t: [a["per_seed"][t][s] - b["per_seed"][t][s] for s in ("1", "2", "3")] for t in ("sst2", "stsb")}
    diffs["avg"] = [(x + y) / 2 for x, y in zip(diffs["sst2"], diffs["stsb"])]
    ps = []
    for task, d in diffs.items():
        c, t = cs[task], stats.ttest_1samp(d, 0)
        ci = t.confidence_interval(0.95)
        assert (c["a"], c["b"], c["n"]) == (a["id"], b["id"], 3)
        assert c["mean"] == pytest.approx(sum(d) / 3)
        assert (c["lo"], c["hi"], c["p"]) == (pytest.approx(ci.low), pytest.approx(ci.high), pytest.approx(t.pvalue))
        ps.append((t.pvalue, task))
    for rank, (p, task) in enumerate(sorted(ps)):  # Holm over the 3: the k-th smallest times (3 - k), monotone
        assert cs[task]["p_holm"] >= min(1.0, (3 - rank) * p) - 1e-12
    lines = list(csv.DictReader(open(tmp_path / "seeds.csv")))
    assert len(lines) == 2 * 2 * 3  # (row, task, seed)
    assert {(x["method"], x["task"], x["seed"]): float(x["value"]) for x in lines} == \
        {(m, t, s): pytest.approx(rows[m]["per_seed"][t][s]) for m in rows for t in ("sst2", "stsb") for s in "123"}
    # The CSV carries each row's whole key: --from-csv rebuilds the store's rows, every setting but
    # where this machine keeps GLUE, what the run chose for itself (train/...) and the settings added
    # later, at their defaults (rows.ADDED_LATER).
    from deepen_run.report import from_csv
    from deepen_run.report.rows import ADDED_LATER

    def set_by_study(cfg: dict) -> dict:
        return {k: v for k, v in cfg.items() if k not in from_csv.LOCAL and not k.startswith(from_csv.CHOSEN)
                and ADDED_LATER.get(k) != v}

    back, _ = from_csv.load(tmp_path / "seeds.csv")
    assert [(r["config"], r["per_seed"]) for r in back] == \
        [(set_by_study(r["config"]), r["per_seed"]) for r in out["rows"]]
    assert any(k.startswith(from_csv.CHOSEN) for k in out["rows"][0]["config"])  # there were some to drop


def report_cli(*args: str):
    """deepen-report in a fresh process, as a user runs it (it takes no Hydra overrides)."""
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("deepen-report")
    return forkserver.run([str(exe), *args], timeout=600)


def git(repo, *args) -> str:
    import subprocess

    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_row_of_two_commits_is_marked_and_its_footnote_names_them(tmp_path, glue_dir, capsys):
    """The real mechanism: runs record the commit of the code they ran (git rev-parse HEAD where
    deepen_run lives). A copy of the package in a fresh git repo runs seed 1, a second commit is
    made, and the same seed and config runs again."""
    import shutil

    from conftest import cli
    from deepen_run.config.schema import ROOT

    code = tmp_path / "code"
    for part in ("deepen_run", "conf"):
        shutil.copytree(ROOT / part, code / part, ignore=shutil.ignore_patterns("__pycache__"))
    git(code, "init", "-q")
    git(code, "add", "-A")
    git(code, "commit", "-qm", "first")
    uri, commits = f"sqlite:///{tmp_path}/mlflow.db", []
    for _ in range(2):
        if commits:
            git(code, "commit", "-q", "--allow-empty", "-m", "second")
        commits.append(git(code, "rev-parse", "HEAD"))
        r = cli("task=rte", "seed=1", *TINY, f"tracking.uri={uri}", env={"PYTHONPATH": str(code)})
        assert r.returncode == 0, r.stderr[-3000:]
    report.main(["--uri", uri])  # the command itself runs in test_json_contrasts_...
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[2].startswith("| 1* | tiny | baseline |")  # one row, marked
    (note,) = [ln for ln in lines if ln.startswith("* Row 1 mixes")]
    assert commits[0] in note and commits[1] in note and commits[0] != commits[1]
    assert "Row 1: seed 1 of rte ran 2 times, same value" in out  # the seed is shown, counted once


def test_contrasts_become_a_figure_labelled_by_what_tells_the_rows_apart(mlflow_uri, tmp_path):
    from deepen_run.report.figure import contrast_label

    for seed, (base, hire) in zip((1, 2, 3), ((70.0, 72.0), (72.0, 73.0), (74.0, 77.0))):
        for method, acc in (("baseline", base), ("hire", hire)):
            log_run(mlflow_uri, [f"method={method}", "backbone=minilm", f"seed={seed}", "task=rte",
                                 "train.max_steps=60"], rte(acc))
        log_run(mlflow_uri, ["method=hire", "method.importance=mean", "backbone=minilm", f"seed={seed}", "task=rte",
                             "train.max_steps=60"], rte(hire - 1))
    runs = report.load_runs(mlflow_uri, EXP, {})
    table = report.build(runs, contrasts=["importance=dynamic:importance=mean"])
    rows = {r["settings"]: r for r in table["rows"]}
    dyn, mean = rows["importance=dynamic"], rows["importance=mean"]
    assert contrast_label(dyn, mean) == f"{dyn['id']}: importance=dynamic  -  {mean['id']}: importance=mean"
    base = next(r for r in table["rows"] if r["method"] == "baseline")
    assert contrast_label(dyn, base) == f"{dyn['id']}: hire importance=dynamic  -  {base['id']}: baseline"
    assert any(c["lo"] is None for c in table["contrasts"])  # dynamic - mean is 1 for every seed: no interval
    files = report.write(table, tmp_path / "with")
    assert tmp_path / "with" / "contrasts.png" in files and (tmp_path / "with" / "contrasts.png").stat().st_size > 0
    files = report.write(report.build(runs, contrasts=[], default_contrasts=False), tmp_path / "without")
    assert [f.name for f in files] == ["results.md", "results.csv", "results.png"]


def test_one_contrast_says_there_is_nothing_to_adjust():
    """Holm over one reading is the reading's own p: the note said "adjusted over the 1 contrasts"."""
    from deepen_run.report.output import contrasts_markdown

    one = {"a": 2, "b": 1, "task": "rte", "n": 2, "mean": -0.8, "lo": -10.7, "hi": 9.1, "p": 0.5, "p_holm": 0.5}
    assert "p Holm: p itself (one reading: nothing to adjust over);" in contrasts_markdown({"contrasts": [one]})
    two = contrasts_markdown({"contrasts": [one, one | {"task": "avg"}]})
    assert "p Holm: adjusted over the 2 contrasts with a p;" in two
