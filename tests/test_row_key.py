"""deepen-report keys a row by what changes the experiment (deepen_run/report/rows.py): the data by
its fingerprint (the data_fingerprint tag, deepen_run/data/fingerprint.py data_id), not by how the
folder of GLUE is spelled or where it is; folders are recorded resolved (config/redact.py)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import cli, make_cfg

from deepen_run.config.redact import public_config
from deepen_run.report import main as report
from deepen_run.run.names import tags_for
from deepen_run.tracking.store import Tracker, flatten

EXP = "row-key"


def log_run(uri, overrides, acc, fingerprint=None):
    cfg = make_cfg(*overrides, f"tracking.uri={uri}", f"tracking.experiment={EXP}")
    t = Tracker(uri, EXP)
    t.start("r", tags_for(cfg) | ({"data_fingerprint": fingerprint} if fingerprint else {}))
    t.log_params(flatten(public_config(cfg)))
    task = cfg.task.names[0]
    t.log_metrics({f"eval/{task}/accuracy": acc / 100, "params/total": 2.3e7, "params/trainable": 2.3e7,
                   "params/ratio": 1.0}, 1)
    t.end("FINISHED")


def test_a_folder_is_recorded_resolved(tmp_path):
    spelled = tmp_path / "a" / ".." / "glue"
    (tmp_path / "glue").mkdir()
    (tmp_path / "a").mkdir()
    params = flatten(public_config(make_cfg(f"data.glue_dir={spelled}", "task=rte")))
    assert params["data.glue_dir"] == os.path.realpath(tmp_path / "glue")
    # a folder that is not there (the Hub's id, a typo caught later) is recorded as given
    assert flatten(public_config(make_cfg("data.glue_dir=/no/such/glue")))["data.glue_dir"] == "/no/such/glue"


def test_the_data_is_keyed_by_its_fingerprint_not_its_folder(mlflow_uri, tmp_path):
    for seed in (1, 2):  # one copy of GLUE in two places, same files: one row, sst2 and rte its columns
        log_run(mlflow_uri, ["task=rte", f"seed={seed}", "data.glue_dir=/data/glue"], 60.0 + seed, "aaa")
        log_run(mlflow_uri, ["task=rte", f"seed={seed + 2}", f"data.glue_dir={tmp_path}/x"], 62.0, "aaa")
        log_run(mlflow_uri, ["task=sst2", f"seed={seed}", "data.glue_dir=/elsewhere/glue"], 80.0, "sss")
    (row,) = report.build(report.load_runs(mlflow_uri, EXP, {}))["rows"]
    assert row["n"] == 4 and row["settings"] == "-" and row["sst2"]["mean"] == pytest.approx(80.0)
    # an edited copy of RTE with every setting equal: its own row, labelled by the fingerprint
    for seed in (1, 2):
        log_run(mlflow_uri, ["task=rte", f"seed={seed}", "data.glue_dir=/data/glue"], 70.0, "bbb")
    rows = report.build(report.load_runs(mlflow_uri, EXP, {"task": "rte"}))["rows"]
    assert sorted((r["settings"], r["rte"]["mean"]) for r in rows) == \
        [("data.fingerprint=aaa", pytest.approx(61.75)), ("data.fingerprint=bbb", pytest.approx(70.0))]


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_demo_and_a_run_on_a_differently_spelled_glue_are_one_row_and_register(glue_dir, tmp_path, capsys):
    """The README's `export DEEPEN_GLUE_DIR=$PWD/../shared/glue` beside the Makefile's resolved path:
    one row of deepen-report, and its `--register` line works (it once said "the report has 2 rows")."""
    copy = tmp_path / "copy" / "glue"
    shutil.copytree(Path(glue_dir) / "SST-2", copy / "SST-2")
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    demo = ["method=hire", "task=sst2", "backbone=tiny", "data.max_train_samples=32", "data.max_eval_samples=32",
            "data.max_seq_length=32", "train.max_steps=2", "train.batch_size=8", "train.save_best=true",
            f"tracking.uri={uri}"]
    for n, (spelled, seed) in enumerate(((str(Path(glue_dir).resolve()), 1),
                                         (f"{tmp_path}/copy/../copy/glue", 2))):
        r = cli(*demo, f"seed={seed}", f"hydra.run.dir={tmp_path}/run{n}",
                env={"DEEPEN_GLUE_DIR": spelled, "OMP_NUM_THREADS": "1"})
        assert r.returncode == 0, r.stderr[-3000:]
    table = report.build(report.load_runs(uri, "deepen-run", {"task": "sst2", "method": "hire"}))
    (row,) = table["rows"]
    assert row["n"] == 2 and "glue" not in row["settings"], row["settings"]
    report.main(["--uri", uri, "--tag", "task=sst2", "--tag", "method=hire", "--register", "sst2-hire"])
    assert "as sst2-hire version 1, alias champion" in capsys.readouterr().out
    run = json.loads((tmp_path / "run0" / "run.json").read_text())["run_id"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    assert client.get_run(run).data.params["data.glue_dir"] == str(Path(glue_dir).resolve())
    assert client.get_model_version_by_alias("sst2-hire", "champion").tags["method"] == "hire"
