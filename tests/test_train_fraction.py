"""data.train_fraction: a seeded fraction of every task keeps the tasks' size ratios, so the
schedules stay non-uniform in small multi-task runs (docs/methods.md, section Sampling schedules); its checks and
train.new_params_lr_scale's fail before anything loads."""
from pathlib import Path

import pytest

from conftest import cli, make_cfg, runs_of
from deepen_run.data.loaders import train_size
from deepen_run.errors import UserError
from deepen_run.run.preflight import numbers

TASKS = ["sst2", "mrpc", "rte", "stsb"]


def test_train_size_applies_the_fraction_then_the_cap():
    assert train_size(67349, None, None) == 67349
    assert train_size(67349, 0.05, None) == 3367
    assert train_size(2490, 0.05, None) == 124  # round(124.5): banker's rounding, still seeded and fixed
    assert train_size(67349, 0.05, 1000) == 1000  # the cap still caps
    assert train_size(10, 0.01, None) == 1  # never an empty task
    assert train_size(3668, 1.0, 500) == 500


@pytest.mark.parametrize("override,culprit", [
    ("data.train_fraction=0", "data.train_fraction=0"), ("data.train_fraction=1.5", "data.train_fraction=1.5"),
    ("data.train_fraction=-0.1", "data.train_fraction=-0.1"), ("data.train_fraction=nan", "data.train_fraction=nan"),
    ("train.new_params_lr_scale=0", "train.new_params_lr_scale=0"),
    ("train.new_params_lr_scale=-10", "train.new_params_lr_scale=-10"),
    ("train.steps_per_task=0", "train.steps_per_task=0"),
])
def test_bad_values_fail_with_one_line(override, culprit):
    with pytest.raises(UserError, match=culprit) as e:
        numbers(make_cfg(override))
    assert "\n" not in str(e.value)


def test_good_values_pass():
    numbers(make_cfg("data.train_fraction=1", "train.new_params_lr_scale=10", "train.steps_per_task=300"))
    numbers(make_cfg("data.train_fraction=0.05"))


@pytest.mark.e2e
def test_fractional_multitask_run_keeps_proportional_sampling(glue_dir, mlflow_uri, tmp_path):
    r = cli(f"task.names=[{','.join(TASKS)}]", "data.train_fraction=0.05", "schedule=proportional",
            "backbone=tiny", f"data.glue_dir={glue_dir}", "data.max_eval_samples=16", "data.max_seq_length=32",
            f"data.cache_dir={tmp_path}/cache", "train.max_steps=8", "train.steps_per_task=1",
            "train.eval_per_epoch=true", "train.batch_size=4", "train.log_every=4", f"tracking.uri={mlflow_uri}",
            f"hydra.run.dir={tmp_path}/run")
    assert r.returncode == 0, r.stderr[-3000:]
    client, (run,) = runs_of(mlflow_uri)
    assert run.info.status == "FINISHED" and run.data.params["data.train_fraction"] == "0.05" \
        and run.data.params["train.new_params_lr_scale"] == "1.0"
    folders = {"sst2": "SST-2", "mrpc": "MRPC", "rte": "RTE", "stsb": "STS-B"}
    full = {t: sum(1 for _ in open(Path(glue_dir, f, "train.tsv"), encoding="utf-8")) - 1 for t, f in folders.items()}
    trained = {t: train_size(n, 0.05, None) for t, n in full.items()}
    assert trained == {"sst2": 3367, "mrpc": 183, "rte": 124, "stsb": 287}
    for t in TASKS:
        assert run.data.metrics[f"data/train_examples/{t}"] == trained[t]  # what the sampler's N_i are
        hist = client.get_metric_history(run.info.run_id, f"sampling/p/{t}")
        # 4 tasks x steps_per_task=1: an epoch is 4 steps, so probabilities at steps 0 and 4.
        assert [h.step for h in hist] == [0, 4]
        assert hist[0].value == pytest.approx(trained[t] / sum(trained.values()), rel=1e-6)
    assert run.data.metrics["sampling/p/sst2"] > 0.5  # SST-2 is 85% of the trained examples
    # eval_per_epoch: one evaluation at the end of each 4-step epoch.
    assert [h.step for h in client.get_metric_history(run.info.run_id, "eval/score")] == [4, 8]
