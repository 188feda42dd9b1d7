"""A sweep's answer on its parent run (deepen_run/sweep/summary.py): its name, its run note (the
report's table, kept up to date), its figure, the children's names and tags, the compare link, and
a baseline trained once per seed beside two HIRE settings (arm presets). Real MLflow stores, the
real CLI, the tiny random BERT on real GLUE RTE files."""
import json
import re
import time

import pytest

from conftest import HANG, cli, runs_of
from deepen_run.report import main as report
from deepen_run.sweep import summary as sweep_summary
from deepen_run.tracking import ui
from deepen_run.tracking.store import Tracker, find_runs

TINY = ["task=rte", "backbone=tiny", "train.max_steps=2", "train.batch_size=8", "train.learning_rate=1e-3",
        "data.max_train_samples=32", "data.max_eval_samples=64", "data.max_seq_length=32"]


@pytest.fixture(scope="module")
def arm_sweep(tmp_path_factory, glue_dir):
    tmp = tmp_path_factory.mktemp("arms")
    uri = f"sqlite:///{tmp}/mlflow.db"
    r = cli("-m", "+arm=baseline,hire_g1,hire_g2", "seed=1,2", *TINY, f"data.glue_dir={glue_dir}",
            f"tracking.uri={uri}", f"hydra.sweep.dir={tmp}/sweep")
    assert r.returncode == 0, r.stderr[-3000:]
    return uri, r


def parent_and_children(uri: str):
    client, runs = runs_of(uri)
    parent = next(x for x in runs if x.data.tags["sweep_role"] == "parent")
    return client, parent, [x for x in runs if x.data.tags["sweep_role"] == "child"]


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_baseline_beside_two_hire_settings_is_one_sweep_of_six_runs(arm_sweep, capsys):
    uri, _ = arm_sweep
    _, parent, children = parent_and_children(uri)
    assert len(children) == 6  # the baseline once per seed, not once per HIRE setting
    report.main(["--uri", uri, "--sweep-id", parent.data.tags["sweep_id"]])
    md = capsys.readouterr().out
    rows = {(c[2], c[4]): c for c in (ln.strip("|").split("|") for ln in md.splitlines() if ln.startswith("| "))}
    rows = {(m.strip(), s.strip()): [x.strip() for x in c] for (m, s), c in rows.items()}
    assert rows[("baseline", "-")][7] == "(baseline)"
    for g in ("1", "2"):
        delta = rows[("hire", f"gru_layers={g}")][7]
        assert re.match(r"[+-]\d+\.\d( \[.*\])? \(n=2\)$", delta), delta  # no interval when the diffs agree


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_parent_answers_the_sweep(arm_sweep, capsys):
    uri, r = arm_sweep
    client, parent, children = parent_and_children(uri)
    # The name says what was swept; the children's names start with their swept values.
    assert parent.info.run_name == "tiny rte | arm=baseline,hire_g1,hire_g2 × seed=1,2"
    for c in children:
        assert c.info.run_name.startswith(f"arm={c.data.tags['arm']} seed={c.data.tags['seed']} · tiny-")
    # The note holds deepen-report's table for this sweep, the same cells.
    note = parent.data.tags[sweep_summary.NOTE]
    report.main(["--uri", uri, "--sweep-id", parent.data.tags["sweep_id"]])
    table = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ")]
    assert len(table) >= 4 and all(ln in note for ln in table)  # the rows (and the contrasts below them)
    assert note.startswith(f"**Sweep {parent.data.tags['sweep_id']}** (FINISHED): 6 of 6 jobs finished")
    # One figure among its artifacts, the report's table beside it.
    files = [a.path for top in client.list_artifacts(parent.info.run_id) if top.is_dir
             for a in client.list_artifacts(parent.info.run_id, top.path)]
    assert [f for f in files if f.endswith(".png")] == [sweep_summary.FIGURE]
    assert {"report/results.md", "report/results.csv"} <= set(files)
    assert "the sweep's report failed" not in r.stderr and "run note was not" not in r.stderr, r.stderr[-2000:]
    # The last console lines: the compare view of all six children, then the parent.
    last = r.stdout.rstrip().splitlines()[-3:]
    assert "compare-runs?runs=" in last[0] and all(c.info.run_id in last[0] for c in children)
    assert parent.info.run_id in last[1] and parent.data.tags["sweep_id"] in last[2]
    # The runs table opens with the rounded score, then the swept keys.
    exp = client.get_experiment(parent.info.experiment_id)
    assert json.loads(exp.tags[ui.VIEW_TAG])["selectedColumns"][:3] == \
        ["tags.`score`", "tags.`arm`", "tags.`seed`"]
    # The parent's own row, collapsed, reads as the sweep (sweep/summary.py parent_tags), not "-" in every cell.
    best = max(float(c.data.tags["score"]) for c in children)
    assert parent.data.tags["score"] == f"best {best:.4f} (6 of 6 runs)"
    assert (parent.data.tags["arm"], parent.data.tags["seed"]) == ("baseline,hire_g1,hire_g2", "1,2")


def _child(tracker_uri, sweep_id, parent_id, seed, gru, acc, job=None, status="FINISHED"):
    t = Tracker(tracker_uri, "deepen-run")
    t.start(f"c{seed}{gru}", {"mlflow.parentRunId": parent_id, "sweep_id": sweep_id, "sweep_role": "child",
                              "task": "rte", "method": "hire", "backbone": "tiny", "seed": str(seed),
                              "method.gru_layers": str(gru)} | ({"sweep_job": str(job)} if job is not None else {}))
    t.log_params({"method.name": "hire", "backbone.name": "tiny", "method.gru_layers": gru, "seed": seed})
    t.log_metrics({"eval/rte/accuracy": acc, "eval/score": acc}, 1)
    t.end(status)


def test_the_note_follows_the_children_as_they_finish(mlflow_uri, tmp_path):
    """The launching process's job watcher rebuilds the note when a job's outcome file appears."""
    import threading

    from deepen_run.sweep.outcomes import Counts, watch

    params = {"method.gru_layers": "1,2", "seed": "1,2", "sweep.overrides": "method.gru_layers=1,2 seed=1,2"}
    tracker = Tracker(mlflow_uri, "deepen-run")
    parent = tracker.start("p", {"sweep_id": "s1", "sweep_role": "parent"})
    info = {"sweep_id": "s1", "parent_run_id": parent, "uri": mlflow_uri, "experiment": "deepen-run",
            "n_jobs": 4, "dir": str(tmp_path), "params": params}
    (tmp_path / "deepen_jobs").mkdir()
    sweep_summary.start(info, tracker)
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(Counts(tmp_path, 4, tracker), stop,
                                                   lambda: sweep_summary.update(info, tracker)), daemon=True)
    watcher.start()
    try:
        note = lambda: tracker.client.get_run(parent).data.tags[sweep_summary.NOTE]  # noqa: E731
        assert "0 of 4 jobs finished" in note() and "appears here as jobs finish" in note()
        for k, (seed, gru, acc) in enumerate([(1, 1, 0.5), (2, 1, 0.6), (1, 2, 0.7)]):
            _child(mlflow_uri, "s1", parent, seed, gru, acc)
            outcome = {"status": "FINISHED", "name": f"c{seed}{gru}", "score": acc, "seconds": 1.0}
            (tmp_path / "deepen_jobs" / f"{k}.json").write_text(json.dumps(outcome))
            t0 = time.time()
            while f"{k + 1} of 4 jobs finished" not in note():
                assert time.time() - t0 < HANG, note()
                time.sleep(0.2)
        assert "| 55.0 ± 7.1 |" in note() and "| 70.0 |" in note()  # gru_layers=1 over 2 seeds, =2 over 1
    finally:
        stop.set()
        watcher.join()
        sweep_summary.finish(info, tracker, "FINISHED", show_table=False)
    figs = [a.path for a in tracker.client.list_artifacts(parent, "sweep")]
    assert figs == [sweep_summary.FIGURE]


def _runs(points):
    return [{"status": "FINISHED", "metrics": {"eval/score": s}, "tags": tags} for tags, s in points]


def test_the_figure_is_a_line_for_one_key_and_a_heatmap_for_two():
    from deepen_run.sweep.figure import figure

    one = figure(_runs([({"method.gru_layers": g, "seed": s}, 0.5 + 0.1 * int(g) + 0.01 * s)
                        for g in ("1", "2", "10") for s in (1, 2)]),
                 list(sweep_summary.swept({"method.gru_layers": "1,2,10", "seed": "1,2"})))
    ax = one.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "10"]  # numeric order, not text order
    assert ax.lines[0].get_ydata().tolist() == pytest.approx([0.615, 0.715, 1.515])  # the means over seeds
    two = figure(_runs([({"method.gru_layers": g, "method.importance": i, "seed": "1"}, 0.5)
                        for g in ("1", "2") for i in ("dynamic", "mean")]),
                 list(sweep_summary.swept({"method.gru_layers": "1,2", "method.importance": "dynamic,mean",
                                           "seed": "1"})))
    assert two.axes[0].images and two.axes[0].get_xlabel() == "method.gru_layers"


def test_names_and_tags_of_a_sweep():
    from conftest import make_cfg

    params = {"method.gru_layers": "1,2", "seed": "1,2", "method.layers": "[2,3]", "task": "rte",
              "sweep.overrides": "x"}
    cfg = make_cfg("method=hire", "task=rte", "backbone=tiny")
    assert sweep_summary.parent_name(cfg, params) == "tiny hire rte | gru_layers=1,2 × seed=1,2"
    info = {"params": params}
    job = ["method.gru_layers=2", "seed=1", "method.layers=[2,3]", "task=rte"]
    assert sweep_summary.child_tags(info, job) == {"method.gru_layers": "2"}  # seed is a tag already
    assert sweep_summary.child_name("tiny-hire-rte-s1", 1, info, job) == "gru_layers=2 seed=1 · tiny-hire-rte"
    assert sweep_summary.parent_name(cfg, {"arm": "baseline,hire_g1"}) == "tiny rte | arm=baseline,hire_g1"
    # An Optuna draw: 4 digits in the name, every digit in the tag; a value as typed stays as it is.
    drawn, lr = {"params": {"train.learning_rate": "interval(1e-5,1e-4)"}}, "train.learning_rate=2.6122937099604327e-05"
    assert sweep_summary.child_name("tiny-hire-rte-s1", 1, drawn, [lr]) == "learning_rate=2.612e-05 · tiny-hire-rte-s1"
    assert sweep_summary.child_tags(drawn, [lr]) == {"train.learning_rate": "2.6122937099604327e-05"}
    typed = {"params": {"train.learning_rate": "1e-4,3e-4"}}
    assert sweep_summary.child_name("x", 1, typed, ["train.learning_rate=1e-4"]) == "learning_rate=1e-4 · x"


def test_empty_delta_says_why(mlflow_uri):
    from test_report import EXP, log_run, rte

    for seed, acc in ((1, 60.0), (2, 62.0)):
        log_run(mlflow_uri, ["method=hire", "task=rte", "backbone=tiny", f"seed={seed}"], rte(acc))
    md = report.to_markdown(report.build(find_runs(mlflow_uri, EXP)))
    assert "| - (no baseline row) |" in md and "+arm=baseline,hire_g1,hire_g2" in md



def test_an_empty_delta_of_seeds_split_across_tasks_says_so(mlflow_uri):
    """The README's pass (SST-2 at seed 42, RTE at seeds 1 and 2, for both methods) shares seeds per task
    but no seed with both tasks: the footnote said "run the baseline with the row's seeds", which it had."""
    from test_report import EXP, log_run, rte

    for method in ("baseline", "hire"):
        for seed in (1, 2):
            log_run(mlflow_uri, [f"method={method}", "task=rte", "backbone=tiny", f"seed={seed}"], rte(60.0 + seed))
        log_run(mlflow_uri, [f"method={method}", "task=sst2", "backbone=tiny", "seed=42"],
                {k.replace("rte", "sst2"): v for k, v in rte(80.0).items()})
    md = report.to_markdown(report.build(find_runs(mlflow_uri, EXP)))
    assert "| - (no seed shared with its baseline) |" in md
    assert "no seed has scores in both rows on every task they share" in md


def test_the_swept_values_are_what_ran_and_the_command_pastes():
    """A study preset's grid narrowed on the command line (`task=rte seed=1,2` over its sweeper params):
    the command line's values are the sweep's, as Hydra applies them; the note's command, split as a
    shell splits it, is the command line again (a value with a space included), less the sweep dir."""
    import shlex

    from omegaconf import OmegaConf

    from deepen_run.sweep.callback import sweep_params

    task = ["+study=cpu_single", "task=rte", "seed=1,2", "tracking.experiment=my exp"]
    hydra = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweep.dir=/tmp/s", "hydra.mode=MULTIRUN"]
    config = OmegaConf.create({"hydra": {"overrides": {"task": task, "hydra": hydra},
                                         "sweeper": {"params": {"task": "cola,rte", "seed": "1,2,3"}}}})
    params = sweep_params(config)
    assert params["task"] == "rte" and params["seed"] == "1,2"
    assert sweep_summary.swept(params) == {"seed": "1,2"}
    assert shlex.split(sweep_summary.command(params)) == ["deepen-run", "-m", *task, *hydra[:2]]


def test_a_job_run_again_by_a_resume_counts_once(mlflow_uri):
    """Job 2 FAILED, then the resumed sweep ran it again and it FINISHED: the note says 2 of 2 finished
    and none failed, and the compare link lists the two runs that stand, not the superseded one."""
    params = {"seed": "1,2", "sweep.overrides": "seed=1,2"}
    tracker = Tracker(mlflow_uri, "deepen-run")
    parent = tracker.start("p", {"sweep_id": "s2", "sweep_role": "parent"})
    info = {"sweep_id": "s2", "parent_run_id": parent, "uri": mlflow_uri, "experiment": "deepen-run", "n_jobs": 2,
            "params": params}
    _child(mlflow_uri, "s2", parent, 1, 1, 0.5, job=0)
    _child(mlflow_uri, "s2", parent, 2, 1, 0.0, job=1, status="FAILED")
    _child(mlflow_uri, "s2", parent, 2, 1, 0.6, job=1)
    sweep_summary.update(info, tracker, "FINISHED")
    note = tracker.client.get_run(parent).data.tags[sweep_summary.NOTE]
    assert "2 of 2 jobs finished, 0 failed or killed" in note, note
    standing = [r["run_id"] for r in sweep_summary.current_children(info)]
    everyone = [r["run_id"] for r in find_runs(mlflow_uri, "deepen-run", {"sweep_id": "s2", "sweep_role": "child"})]
    assert len(standing) == 2 and standing == [everyone[0], everyone[2]]
    link = sweep_summary.links(info, tracker).splitlines()[0]
    assert everyone[2] in link and everyone[1] not in link


def test_a_sweep_of_dry_runs_over_two_keys_ends_with_its_links_and_no_figure(tmp_path, glue_dir):
    """Dry runs finish with no eval/score: no heatmap to draw (it was a TypeError that took the
    links with it), and the note says why there is no table instead of 'no finished job yet'."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    r = cli("-m", "dry_run=true", "method=hire", "method.gru_layers=1,2", "train.learning_rate=1e-5,2e-5",
            *[x for x in TINY if not x.startswith("train.learning_rate")], f"data.glue_dir={glue_dir}",
            f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path}/sweep")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr[-3000:]
    assert "the sweep's parent" in r.stdout and "compare the children" in r.stdout
    jobs = [ln for ln in r.stdout.splitlines() if "] FINISHED " in ln]  # each job's line: no eval/score=nan
    assert len(jobs) == 4 and all("a dry run: no eval/score" in ln and "nan" not in ln for ln in jobs), r.stdout
    client, runs = runs_of(uri)
    (parent,) = [x for x in runs if x.data.tags.get("sweep_role") == "parent"]
    note = parent.data.tags[sweep_summary.NOTE]
    assert "4 of 4 jobs finished" in note and "No finished job has an eval/score" in note, note
    assert sweep_summary.FIGURE not in [a.path for a in client.list_artifacts(parent.info.run_id, "sweep")]
