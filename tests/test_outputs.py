"""What a run leaves behind and says at its end: no best weights for a short run unless asked,
a summary with the run's UI address, experiments set up for the classic runs table, dry runs marked."""
import json
from types import SimpleNamespace as NS

import pytest

from conftest import cli, make_cfg, runs_of
from deepen_run.run.checkpoint import keeps_best
from deepen_run.tracking.ui import KIND, VIEW_TAG

TINY = ["backbone=tiny", "task=sst2", "data.max_train_samples=32", "data.max_eval_samples=32",
        "data.max_seq_length=32", "train.batch_size=8", "train.max_steps=3"]


@pytest.mark.parametrize("save_best,save_every,total,predict,kept", [
    (None, 1000, 60, False, False),   # a demo-sized run or a sweep job: no weights
    (None, 1000, 5000, False, True),  # a long run keeps its best weights
    (None, 1000, 60, True, True),     # predict=true runs are the ones worth keeping
    (None, 0, 5000, False, False),    # no checkpoints at all asked for
    (True, 1000, 60, False, True),
    (False, 100, 5000, True, False),
])
def test_save_best_auto_and_forced(save_best, save_every, total, predict, kept):
    assert keeps_best(NS(save_best=save_best, save_every=save_every, model_selection="final"), total, predict) is kept
    # train.model_selection=best evaluates the kept weights at the end: always kept (save_best=false is refused)
    assert keeps_best(NS(save_best=save_best, save_every=save_every, model_selection="best"), total, predict)


@pytest.mark.slow
@pytest.mark.parametrize("extra,kept", [([], False), (["train.save_best=true"], True)])
def test_short_run_keeps_no_weights_and_ends_with_a_summary(glue_dir, mlflow_uri, tmp_path, extra, kept):
    run_dir = tmp_path / "run"
    r = cli(*TINY, *extra, f"data.glue_dir={glue_dir}", f"tracking.uri={mlflow_uri}", f"hydra.run.dir={run_dir}",
            env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert (run_dir / "checkpoints/best/model.safetensors").is_file() is kept
    assert not list(run_dir.glob("checkpoints/step-*"))
    assert "pytorch_model.bin" not in r.stdout + r.stderr  # Accelerate's line about a renamed folder
    client, (run,) = runs_of(mlflow_uri)
    exp = client.get_experiment(run.info.experiment_id)
    out = r.stdout.split("\nrun ")[-1]
    assert out.startswith(f"{run.info.run_name}  FINISHED  (id {run.info.run_id}")
    assert f"eval/score {run.data.metrics['eval/score']:.4f}" in out and "sst2/accuracy" in out
    assert f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs/{run.info.run_id}?workflowType=machine_learning" in out
    assert ("best weights  " + str(run_dir / "checkpoints/best") in out) is kept
    assert "metrics.json" in out and "predictions/" in out
    assert exp.tags[KIND[0]] == KIND[1]
    cols = json.loads(exp.tags[VIEW_TAG])["selectedColumns"]
    # tags only, the rounded score first: the UI puts any metric column before every tag (tracking/ui.py)
    assert cols[0] == "tags.`score`" and "tags.`method`" in cols and "tags.`duplicate_layers`" in cols
    assert not [c for c in cols if c.startswith("metrics.")]
    assert run.data.tags["dry_run"] == "false"


def test_dry_run_is_named_and_tagged(mlflow_uri, capsys):
    from deepen_run.run.preflight import check
    from deepen_run.run.runner import run

    cfg = make_cfg("backbone=tiny", "dry_run=true", f"tracking.uri={mlflow_uri}")
    run(cfg, check(cfg))
    _, (r,) = runs_of(mlflow_uri)
    assert r.info.run_name == "tiny-baseline-sst2-s42-dry" and r.data.tags["dry_run"] == "true"
    assert r.info.status == "FINISHED" and not any(k.startswith("eval/") for k in r.data.metrics)
    assert "dry run: sizes and config recorded, no training" in capsys.readouterr().out


def test_the_ui_hint_of_a_database_store_masks_its_password():
    from deepen_run.run.summary import ui_hint

    base, how = ui_hint("postgresql://alice:s3cret@db.example/mlflow")
    assert "s3cret" not in how and how == "mlflow ui --backend-store-uri 'postgresql://alice:***@db.example/mlflow'"
    assert ui_hint("sqlite:////tmp/my runs/mlflow.db")[1] == "mlflow ui --backend-store-uri 'sqlite:////tmp/my runs/mlflow.db'"
