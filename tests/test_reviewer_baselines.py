"""The reviewer's baselines (issue #59): ELMo's scalar mix beside HIRE, per-task LoRA through peft beside
PALs, LLaMA Pro's train-only-the-copies beside duplication, DenseFormer's depth-weighted average. Unit
contracts on tiny random models; real runs (tiny and MiniLM) read back from a real MLflow store. The
runs on every family are in tests/test_families.py; LoRA's saved adapters in tests/test_lora_export.py."""
from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
import torch

from conftest import cli, make_cfg, runs_of, token_batch
from deepen_run.data.glue import get_tasks
from deepen_run.errors import UserError
from deepen_run.methods import METHODS
from deepen_run.model import adapter, probe, steps
from deepen_run.model.families import FAMILIES
from deepen_run.model.heads import new_parameters, param_report
from deepen_run.run.optim import optimizer_for

TASKS = get_tasks(["sst2", "rte"])
TINY = ["backbone=tiny", "task=rte", "train.max_steps=3", "data.max_train_samples=16", "data.max_eval_samples=8",
        "data.max_seq_length=32", "train.batch_size=4", "train.eval_batch_size=16", "train.mixed_precision=no"]


def built(*over: str, tasks=TASKS):
    cfg = make_cfg("backbone=tiny", *over)
    torch.manual_seed(0)
    backbone, loaded, added = steps.load(cfg)
    model = METHODS[cfg.method.name].build(backbone, cfg.method, tasks)
    steps.train_new(added)
    return cfg, model, loaded, added


def run_in_process(cfg, uri):
    from deepen_run.run.preflight import check
    from deepen_run.run.runner import run

    run(cfg, check(cfg))
    return runs_of(uri)[1][-1]


def artifact(uri: str, run, path: str) -> Path:
    from mlflow import MlflowClient

    return Path(MlflowClient(uri).download_artifacts(run.info.run_id, path))


# Scalar mix

def test_scalar_mix_starts_uniform_and_keeps_one_mix_per_task():
    _, model, _, _ = built("method=scalar_mix")
    assert set(model.mix) == {"sst2", "rte"}
    for mix in model.mix.values():
        assert torch.allclose(mix.weights(), torch.full((2,), 0.5)) and mix.gamma.item() == 1.0
    model.eval()
    before = {t: model(t, **token_batch()).logits for t in ("sst2", "rte")}
    with torch.no_grad():
        model.mix["sst2"].scalars[0] += 3.0
    assert torch.equal(model("rte", **token_batch()).logits, before["rte"])
    assert not torch.allclose(model("sst2", **token_batch()).logits, before["sst2"])
    assert model.layer_labels == ["1", "2"]
    _, emb, _, _ = built("method=scalar_mix", "method.include_embeddings=true")
    assert emb.layer_labels == ["0", "1", "2"]


def test_hire_and_scalar_mix_figures_share_their_axes():
    """The weight figures read side by side: both on every hidden state of the (deepened) backbone,
    the layers a method does not weigh grey and unannotated, each coloured white at its own uniform."""
    from deepen_run.methods.hire.report import heatmap

    figs = {}
    for method in ("hire", "scalar_mix"):
        _, model, _, _ = built(f"method={method}", "backbone.duplicate_layers=[1]")
        n = len(model.layer_labels)
        figs[method] = (heatmap([[1 / n] * n], ["rte"], model.layer_labels, method, "task", model.labels), n)
    (hire, n_hire), (mix, n_mix) = figs["hire"], figs["scalar_mix"]
    ticks = [[t.get_text() for t in f.axes[0].get_xticklabels()] for f in (hire, mix)]
    assert ticks[0] == ticks[1] == ["0", "1", "2", "2'"], ticks  # index 1 is layer 2
    assert hire.axes[0].get_xlim() == mix.axes[0].get_xlim()
    assert n_hire < n_mix  # HIRE weighs the intermediate layers only: the rest are grey, without a number
    assert len(hire.axes[0].texts) == n_hire and len(mix.axes[0].texts) == n_mix
    assert [im.norm(1 / n) for im, n in ((hire.axes[0].images[0], n_hire), (mix.axes[0].images[0], n_mix))] == [0.5, 0.5]


# LoRA through peft

def test_lora_is_peft_with_one_adapter_per_task_and_its_closed_form_size():
    from peft.tuners.lora import LoraLayer

    from deepen_run.methods.lora.model import matched_rank

    fresh = make_cfg("backbone=tiny")
    torch.manual_seed(0)
    plain = steps.load(fresh)[0]
    mods = dict(plain.named_modules())
    targets = adapter.lora_targets(plain)
    assert targets == [f"encoder.layer.{i}.attention.self.{m}" for i in (0, 1) for m in ("query", "value")]
    rank = matched_rank(plain)
    cfg, model, loaded, added = built("method=lora")
    assert model.rank == rank
    wrapped = [m for m in model.backbone.modules() if isinstance(m, LoraLayer)]
    assert len(wrapped) == len(targets) and all(set(m.lora_A) == {"sst2", "rte"} for m in wrapped)
    closed = len(TASKS) * rank * sum(mods[n].in_features + mods[n].out_features for n in targets)
    r = param_report(model, sum(p.numel() for p in loaded))
    assert r["params/method"] == closed
    # Backbone frozen by default: the adapters and the heads train, nothing else.
    assert r["params/trainable"] == closed + r["params/heads"]
    assert {id(p) for p in new_parameters(model, loaded, added)} == {id(p) for p in model.parameters() if p.requires_grad}
    _, both, _, _ = built("method=lora", "method.train_backbone=true", "method.rank=4")
    assert all(p.requires_grad for p in both.parameters())


def test_one_tasks_adapter_leaves_another_tasks_outputs_alone():
    _, model, _, _ = built("method=lora", "method.rank=4")
    model.eval()
    before = {t: model(t, **token_batch()).logits for t in ("sst2", "rte")}
    with torch.no_grad():
        for n, p in model.backbone.named_parameters():
            if "lora_B.sst2" in n:
                p.add_(0.5)
    assert torch.equal(model("rte", **token_batch()).logits, before["rte"])
    assert not torch.allclose(model("sst2", **token_batch()).logits, before["sst2"])
    # Routing a task keeps what trains as built (peft's set_adapter alone would freeze the other adapter).
    assert all(p.requires_grad for p in model.lora_parameters())


# Train only the copies (LLaMA Pro)

@pytest.mark.parametrize("method", ["baseline", "lora", "scalar_mix"])
@pytest.mark.parametrize("init", ["plain", "gated"])
def test_only_the_copies_train_and_the_originals_stay_bit_identical(method, init):
    cfg, model, loaded, added = built(f"method={method}", "backbone.duplicate_layers=[1]", f"backbone.duplicate_init={init}",
                                      "backbone.duplicate_train=copies", "train.new_params_lr_scale=10")
    copies = [*added.copied, *added.new]
    r = param_report(model, sum(p.numel() for p in loaded), sum(p.numel() for p in copies))
    method_own = sum(p.numel() for p in model.new_parameters()) - r["params/heads"]
    assert r["params/trainable"] == sum(p.numel() for p in copies) + r["params/heads"] + method_own
    originals = {n: p.detach().clone() for n, p in model.backbone.named_parameters() if any(p is q for q in loaded)}
    assert originals and all(not p.requires_grad for p in loaded)
    start = {id(p): p.detach().clone() for p in added.copied}
    opt = optimizer_for(model, cfg.train, "cpu", new_parameters(model, loaded, added))
    model.train()
    for _ in range(3):
        for task in ("sst2", "rte"):
            opt.zero_grad()
            model(task, **token_batch()).logits.float().pow(2).mean().backward()
            opt.step()
    now = dict(model.backbone.named_parameters())
    assert all(torch.equal(now[n], v) for n, v in originals.items())
    if init == "plain":  # a gated copy's weights wait for their gate to open
        assert any(not torch.equal(p, start[id(p)]) for p in added.copied)


def test_copies_without_layers_to_copy_is_refused_before_weights_load():
    from deepen_run.run.preflight import check

    with pytest.raises(UserError, match="backbone.duplicate_train=copies.*duplicate_layers is empty"):
        check(make_cfg(*TINY, "backbone.duplicate_train=copies"))


# DenseFormer's depth-weighted average

@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_dwa_is_the_pretrained_function_at_step_0(family):
    torch.manual_seed(0)
    ref = steps.load(make_cfg("backbone=tiny", f"backbone.model_type={family}"))[0].eval()
    torch.manual_seed(0)
    deep, _, added = steps.load(make_cfg("backbone=tiny", f"backbone.model_type={family}", "backbone.dwa=true"))
    deep.eval()
    x = adapter.inputs(deep, **token_batch())
    a, b = ref(**x).last_hidden_state, deep(**x).last_hidden_state
    assert probe.cosine_per_example(a, b, x["attention_mask"]).min() >= 0.99999
    assert [p.numel() for p in added.new] == [2, 3]  # layer i reads i + 2 states: L (L + 3) / 2 in all
    with torch.no_grad():  # its weights do enter: reading the embeddings changes the output
        added.new[1][0] += 0.5
    assert not torch.allclose(deep(**x).last_hidden_state, a)


@pytest.mark.parametrize("over", [["method=baseline", "backbone.dwa=true"], ["method=scalar_mix"], ["method=lora"],
                                  ["method=baseline", "backbone.duplicate_layers=[1]", "backbone.duplicate_train=copies"],
                                  ["method=hire"], ["method=pals"]], ids=" ".join)
def test_each_arms_model_loads_its_own_safetensors_as_a_resume_does(tmp_path, over):
    """A resume loads the checkpoint's model.safetensors into the model (Accelerate's load_state, through
    safetensors' load_model). DWA's weights once were views of a larger tensor, which it refuses, and a
    stopped Study IV job could not resume: every arm of the study is held to the round trip."""
    from safetensors.torch import load_model, save_model

    model = built(*over)[1]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    save_model(model, str(tmp_path / "model.safetensors"))
    fresh = built(*over)[1]
    load_model(fresh, str(tmp_path / "model.safetensors"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))


# Real runs

@pytest.mark.slow
def test_scalar_mix_copies_and_dwa_runs_record_their_figures(mlflow_uri, glue_dir):
    r = run_in_process(make_cfg(*TINY, "method=scalar_mix", "backbone.dwa=true", f"tracking.uri={mlflow_uri}"),
                       mlflow_uri)
    assert r.info.status == "FINISHED" and r.data.metrics["scalar_mix/rte/gamma"] > 0
    assert sum(r.data.metrics[f"scalar_mix/rte/layer_{j}"] for j in (1, 2)) == pytest.approx(1.0)
    rows = list(csv.DictReader(io.StringIO(artifact(mlflow_uri, r, "scalar_mix/weights.csv").read_text())))
    assert [row["task"] for row in rows] == ["rte"]
    assert artifact(mlflow_uri, r, "scalar_mix/weights.png").stat().st_size > 0
    assert artifact(mlflow_uri, r, "dwa/weights.png").stat().st_size > 0
    dwa = list(csv.DictReader(io.StringIO(artifact(mlflow_uri, r, "dwa/weights.csv").read_text())))
    assert [row["layer"] for row in dwa] == ["1", "2"] and "from_0" in dwa[1]
    c = run_in_process(make_cfg(*TINY, "backbone.duplicate_layers=[1]", "backbone.duplicate_init=gated",
                                "backbone.duplicate_train=copies", f"tracking.uri={mlflow_uri}"), mlflow_uri)
    m = c.data.metrics
    assert c.info.status == "FINISHED" and m["params/trainable"] == m["params/duplicated"] + m["params/heads"]


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_sweep_over_baseline_hire_and_scalar_mix_is_one_parent_with_three_rows(tmp_path, glue_dir):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    r = cli("-m", "+arm=baseline,hire,scalar_mix", "seed=1,2", *TINY, f"data.glue_dir={glue_dir}",
            f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path}/sweep")
    assert r.returncode == 0, r.stderr[-3000:]
    _, runs = runs_of(uri)
    parents = [x for x in runs if x.data.tags.get("sweep_role") == "parent"]
    assert len(parents) == 1
    table = artifact(uri, parents[0], "report/results.csv").read_text()
    rows = list(csv.DictReader(io.StringIO(table)))
    assert len(rows) == 3, table
    children = [x for x in runs if x.data.tags.get("sweep_role") == "child"]
    hire = next(x for x in children if x.data.params["method.name"] == "hire")
    mix = next(x for x in children if x.data.params["method.name"] == "scalar_mix")
    # The two weight figures share their axes: tasks x backbone layers, labelled alike.
    assert {k.rsplit("/", 1)[-1] for k in hire.data.metrics if k.startswith("hire/rte/")} <= \
        {k.rsplit("/", 1)[-1] for k in mix.data.metrics if k.startswith("scalar_mix/rte/layer_")}
