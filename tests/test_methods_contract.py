"""Contracts every registered method keeps, on a tiny random BERT (a new method is tested here
automatically): builds from its YAML, right output shapes per task, gradients flow into what
trains, and the parameter report adds up."""
import pytest
import torch

from conftest import make_cfg
from deepen_run import backbone as bb
from deepen_run.glue import get_tasks
from deepen_run.methods import METHODS
from deepen_run.model import count, param_report
from deepen_run.train import optimizer_for

TASKS = ["sst2", "stsb", "rte"]


def build(method: str, *extra):
    cfg = make_cfg("backbone=tiny", f"method={method}", f"task.names=[{','.join(TASKS)}]", *extra)
    torch.manual_seed(0)
    backbone = bb.load_model(cfg.backbone)
    n = count(backbone)
    model = METHODS[method].build(backbone, cfg.method, get_tasks(TASKS))
    return model, n


def batch(B=3, T=9):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 2000, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


@pytest.mark.parametrize("method", list(METHODS))
def test_method_yaml_name_and_module_agree(method):
    assert make_cfg(f"method={method}").method.name == method
    assert METHODS[method].__name__.rsplit(".", 1)[-1] == method


@pytest.mark.parametrize("method", list(METHODS))
def test_output_shapes(method):
    model, _ = build(method)
    model.eval()
    for task, n in [("sst2", 2), ("stsb", 1), ("rte", 2)]:
        assert model(task, **batch()).shape == (3, n)


@pytest.mark.parametrize("method", list(METHODS))
def test_trainable_parameters_get_gradients(method):
    model, _ = build(method)
    model.train()
    model("sst2", **batch()).sum().backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable
    # The active task's head and the backbone's top layer (if it trains) get gradients.
    assert model.heads["sst2"][1].weight.grad is not None
    assert model.heads["rte"][1].weight.grad is None  # another task's head is untouched


@pytest.mark.parametrize("method", list(METHODS))
def test_param_report_adds_up(method):
    model, n = build(method)
    r = param_report(model, n)
    assert r["params/backbone"] == n
    assert r["params/backbone"] + r["params/method"] + r["params/heads"] == r["params/total"]
    assert r["params/heads"] == sum(p.numel() for p in model.heads.parameters())
    assert r["params/trainable"] <= r["params/total"]
    assert r["params/ratio"] == pytest.approx(r["params/total"] / n)


def test_baseline_adds_nothing_but_heads():
    model, n = build("baseline")
    r = param_report(model, n)
    assert r["params/method"] == 0
    assert r["params/heads"] == (32 * 2 + 2) * 2 + (32 + 1)  # sst2, rte: 2 labels; stsb: 1 output


@pytest.mark.parametrize("scale", [1.0, 10.0])
@pytest.mark.parametrize("method", list(METHODS))
def test_new_parameters_get_the_same_lr_rule_in_every_method(method, scale):
    # Fair comparisons: whatever the method, what starts from scratch (everything outside the
    # backbone: heads, HIRE's GRUs, PALs) trains at lr x scale, the pretrained backbone at lr.
    extra = ["method.layers=[0]"] if method == "duplicate" else []
    model, _ = build(method, f"train.new_params_lr_scale={scale}", *extra)
    tcfg = make_cfg(f"train.new_params_lr_scale={scale}").train
    lr = tcfg.learning_rate
    opt = optimizer_for(model, tcfg, "cpu")
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    backbone = {id(p) for p in model.backbone.parameters()}
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert len(lr_of) == len(trainable)  # every trainable tensor is in exactly one group
    new = [n for n, p in trainable if id(p) not in backbone]
    assert any(n.startswith("heads.") for n in new)
    for n, p in trainable:
        want = lr if id(p) in backbone else scale * lr
        assert lr_of[id(p)] == pytest.approx(want), (n, lr_of[id(p)], want)
    for head in model.heads.values():
        assert all(lr_of[id(p)] == pytest.approx(scale * lr) for p in head.parameters())
    if hasattr(model.backbone, "pooler") and model.backbone.pooler is not None:
        assert lr_of[id(model.backbone.pooler.dense.weight)] == pytest.approx(lr)  # pretrained
    method_new = {n.split(".")[0] for n in new} - {"heads"}
    assert method_new == {"hire": {"hire"}, "pals": {"pals"}}.get(method, set())
