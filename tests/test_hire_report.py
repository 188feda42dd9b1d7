"""HIRE's report reads the importances the evaluation already computed: no forward pass of its own,
and the numbers of a separate importance pass over the dev sets (mean alpha per task over its whole
dev set; the first method.report_examples examples with their text and label), read back from MLflow.
A tiny random 4-layer BERT on real SST-2 and STS-B dev rows, in batches that need padding."""
import csv

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import make_cfg
from deepen_run.model import backbone as bb
from deepen_run.data import loaders as gd
from deepen_run.precision import resolve
from deepen_run.run.context import RunState
from deepen_run.run.evaluation import evaluate
from deepen_run.run.fast import make_accelerator
from deepen_run.data.glue import get_tasks
from deepen_run.methods.hire.report import snippet
from deepen_run.methods.hire import model as hire
from deepen_run.run.evaluation import batch_inputs
from deepen_run.tracking.store import Tracker

TASKS = ["sst2", "stsb"]
BATCH, SAMPLE = 8, 12  # the first SAMPLE examples span two batches


def test_report_uses_the_evaluation_and_matches_a_separate_pass(glue_dir, mlflow_uri, tmp_path):
    cfg = make_cfg("backbone=tiny", "backbone.num_hidden_layers=4", "method=hire", f"task.names=[{','.join(TASKS)}]",
                   f"data.glue_dir={glue_dir}", "data.max_eval_samples=20", "data.max_seq_length=32",
                   f"train.eval_batch_size={BATCH}", f"method.report_examples={SAMPLE}", f"data.cache_dir={tmp_path}")
    tasks = get_tasks(TASKS)
    torch.manual_seed(0)
    model = hire.build(bb.load_model(cfg.backbone), cfg.method, tasks)
    tok = bb.load_tokenizer(cfg.backbone)
    data = {t.name: gd.load_task(t, cfg.data, tok, cfg.seed, with_train=False) for t in tasks}
    acc = make_accelerator(cfg.train, resolve(cfg.train).precision)
    dev = {name: acc.prepare(gd.eval_loader(ds, tok, BATCH))  # longest first, as a run evaluates
           for d in data.values() for name, ds in d.dev.items()}
    forwards = []
    model.backbone.register_forward_hook(lambda *_: forwards.append(1))  # any pass over the dev sets
    ev = evaluate(model, acc, dev, {name: d.spec for d in data.values() for name in d.dev})
    assert len(forwards) == sum(len(dl) for dl in dev.values())

    tracker = Tracker(mlflow_uri, "hire-report")
    tracker.check()
    tracker.start("report", {})
    hire.after_train(model, RunState(cfg, tasks, model, None, (), acc, tracker, resolve(cfg.train), tokenizer=tok,
                                     data=data, evaluation=ev))
    tracker.end("FINISHED")
    assert len(forwards) == sum(len(dl) for dl in dev.values())  # the report ran nothing through the model

    client = MlflowClient(mlflow_uri)
    run = client.get_run(tracker.run_id)
    with open(client.download_artifacts(tracker.run_id, "hire/examples.csv", str(tmp_path))) as fh:
        examples = list(csv.DictReader(fh))
    model.eval()
    for spec in tasks:  # the separate pass the report used to make
        ds = data[spec.name].dev[spec.name]
        batches = list(gd.make_loader(ds, tok, BATCH, False, cfg.seed))
        with torch.no_grad():
            alpha = torch.cat([model(spec.name, **batch_inputs(b)).extras["alpha"] for b in batches])
        assert alpha.shape == (20, 3)
        for j, name in enumerate(model.layer_names):
            assert run.data.metrics[f"hire/{spec.name}/{name}"] == pytest.approx(float(alpha[:, j].mean()), abs=1e-6)
        texts = [t for b in batches for t in tok.batch_decode(b["input_ids"], skip_special_tokens=True)][:SAMPLE]
        rows = [e for e in examples if e["task"] == spec.name]
        assert [e["text"] for e in rows] == [snippet(t, 120) for t in texts]
        assert [float(e["label"]) for e in rows] == pytest.approx(list(ds["label"][:SAMPLE]))
        for e, a in zip(rows, alpha[:SAMPLE]):
            assert [float(e[f"layer_{c}"]) for c in model.layer_labels] == pytest.approx(a.tolist(), abs=1e-6)
    arts = {a.path for a in client.list_artifacts(tracker.run_id, "hire")} | \
        {a.path for a in client.list_artifacts(tracker.run_id, "hire/examples")}
    assert {"hire/importance.png", "hire/importance.csv", "hire/examples/sst2.png", "hire/examples/stsb.png"} <= arts
