"""data.group_by_length: transformers' LengthGroupedSampler behind make_loader, and an exact resume."""
from __future__ import annotations

import itertools
import random

import datasets
import pytest
import torch
from transformers import get_scheduler

from conftest import cli, make_cfg, runs_of
from deepen_run.model import backbone as bb
from deepen_run.data.stream import TaskStream
from deepen_run.data.loaders import make_loader


def toy_set(n: int = 400, seed: int = 0) -> datasets.Dataset:
    rng = random.Random(seed)
    ids = [[101] + [rng.randrange(1000, 2000) for _ in range(rng.randrange(1, 60))] + [102] for _ in range(n)]
    return datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids],
                                       "label": [i % 2 for i in range(n)]})


def padding(loader) -> int:
    return sum(int((b["attention_mask"] == 0).sum()) for b in loader)


def test_grouped_batches_waste_less_padding_and_cover_every_example():
    tok, ds = bb.load_tokenizer(make_cfg("backbone=tiny").backbone), toy_set()
    grouped = make_loader(ds, tok, 8, True, seed=1, group_by_length=True)
    plain = make_loader(ds, tok, 8, True, seed=1)
    assert padding(grouped) < padding(plain) / 3
    seen = sorted(int(x) for b in grouped for x in b["input_ids"][:, 1])
    assert seen == sorted(row[1] for row in ds["input_ids"])


def test_resume_continues_the_same_grouped_order_across_epochs():
    tok, ds = bb.load_tokenizer(make_cfg("backbone=tiny").backbone), toy_set(100)

    def stream(consumed: int):
        return iter(TaskStream(make_loader(ds, tok, 8, True, seed=3, group_by_length=True), 3, consumed))

    whole = [b["input_ids"].tolist() for b in itertools.islice(stream(0), 30)]  # 13 batches an epoch
    resumed = [b["input_ids"].tolist() for b in itertools.islice(stream(17), 13)]
    assert resumed == whole[17:30]
    assert whole[:13] != whole[13:26]  # the next epoch is reshuffled


def test_the_trainer_bench_job_visits_examples_in_deepen_runs_order():
    """`make bench` compares whole processes on the same batches: scripts/benchkit/trainer_job.py's
    order is the order deepen-run's prepared loader yields (and not the Trainer's own)."""
    import importlib.util
    from pathlib import Path

    import torch

    from deepen_run.precision import resolve
    from deepen_run.run.fast import make_accelerator

    path = Path(__file__).resolve().parent.parent / "scripts" / "benchkit" / "trainer_job.py"
    spec = importlib.util.spec_from_file_location("trainer_job", path)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    cfg = make_cfg("backbone=tiny")
    n, seed = 200, 42
    ids = [[101, 1000 + i, 102] for i in range(n)]  # each row's middle token is its index
    ds = datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 3] * n, "label": [0] * n})
    loader = make_accelerator(cfg.train, resolve(cfg.train).precision).prepare(make_loader(ds, bb.load_tokenizer(cfg.backbone), 8, True, seed))
    seen = [int(x) - 1000 for b in itertools.islice(iter(TaskStream(loader, seed)), n // 8) for x in b["input_ids"][:, 1]]
    assert seen == job.same_order(n, seed)
    assert seen != torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()  # the Trainer's own


def test_longest_first_evaluation_gives_predictions_labels_in_dataset_order(glue_dir, tmp_path):
    """eval_loader sorts batches by length (less padding); predict puts everything back in dataset order."""
    import torch

    from deepen_run.data.glue import get_tasks
    from deepen_run.data.loaders import eval_loader, load_task
    from deepen_run.methods import METHODS
    from deepen_run.precision import resolve
    from deepen_run.run.fast import make_accelerator
    from deepen_run.run.evaluation import predict

    cfg = make_cfg("backbone=tiny", "task=stsb", f"data.glue_dir={glue_dir}", "data.max_eval_samples=40",
                   f"data.cache_dir={tmp_path}")
    tasks = get_tasks(["stsb"])
    torch.manual_seed(0)
    model = METHODS["baseline"].build(bb.load_model(cfg.backbone), cfg.method, tasks).eval()
    tok, acc = bb.load_tokenizer(cfg.backbone), make_accelerator(cfg.train, resolve(cfg.train).precision)
    ds = load_task(tasks[0], cfg.data, tok, cfg.seed, with_train=False).dev["stsb"]
    sorted_loader, file_order = acc.prepare(eval_loader(ds, tok, 8)), acc.prepare(make_loader(ds, tok, 8, False, 0))
    assert sum(b["input_ids"].numel() for b in sorted_loader) < sum(b["input_ids"].numel() for b in file_order)
    preds, labels = predict(model, acc, sorted_loader, tasks[0], labels=True)
    want, _ = predict(model, acc, file_order, tasks[0], labels=True)
    assert labels == list(ds["label"])
    assert torch.allclose(torch.tensor(preds), torch.tensor(want), atol=1e-5)
    assert preds != sorted(preds) and preds != sorted(preds, reverse=True)


def test_an_evaluation_pass_leaves_the_training_rng_alone():
    """Training's dropout draws from torch's global RNG; a pass over an eval loader must not move it."""
    import torch

    from deepen_run.data.loaders import eval_loader

    tok = bb.load_tokenizer(make_cfg("backbone=tiny").backbone)
    loader = eval_loader(toy_set(20), tok, 8)
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    for _ in loader:
        pass
    assert torch.equal(torch.rand(3), want)


def test_gradient_accumulation_updates_once_a_step_across_loader_ends(glue_dir, mlflow_uri):
    """5 batches a pass and 2 micro-batches a step: Accelerate's default would also update at each
    loader end (mid-step) and shift every later update off the loop's steps. The logged learning rate
    after each step must be the schedule's after exactly that many updates."""
    r = cli("backbone=tiny", "task=rte", "data.max_train_samples=40", "data.max_eval_samples=16",
            "data.max_seq_length=32", "train.batch_size=8", "train.gradient_accumulation_steps=2",
            "train.max_steps=8", "train.log_every=1", "train.warmup_ratio=0.25", f"data.glue_dir={glue_dir}",
            f"tracking.uri={mlflow_uri}", env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    client, (run,) = runs_of(mlflow_uri)
    lr = float(run.data.params["train.learning_rate"])
    logged = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "train/lr"), key=lambda m: m.step)]
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    schedule = get_scheduler("linear", opt, num_warmup_steps=2, num_training_steps=8)
    expected = []
    for _ in range(8):
        opt.step()
        schedule.step()
        expected.append(schedule.get_last_lr()[0])
    assert logged == pytest.approx(expected, rel=1e-6)
