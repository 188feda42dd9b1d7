"""train.layer_decay: each pretrained parameter's learning rate by its depth, as docs/configuration.md
states; new parameters at new_params_lr_scale x lr; with every method (deepen_run/run/optim.py)."""
import re

import pytest
from conftest import make_cfg

from deepen_run.data.glue import get_tasks
from deepen_run.methods import METHODS
from deepen_run.model import steps as backbone_steps
from deepen_run.model.heads import new_parameters
from deepen_run.run.train import optimizer_for

LR, DECAY, SCALE = 1e-3, 0.9, 10.0


def built(*overrides):
    cfg = make_cfg("backbone=tiny", "task=rte", "backbone.num_hidden_layers=3", f"train.learning_rate={LR}",
                   f"train.new_params_lr_scale={SCALE}", *overrides)
    backbone, loaded, added = backbone_steps.load(cfg)
    model = METHODS[cfg.method.name].build(backbone, cfg.method, get_tasks(list(cfg.task.names)))
    return cfg, model, new_parameters(model, loaded, added)


@pytest.mark.parametrize("extra", [("method=baseline",), ("method=hire",), ("method=pals",),
                                   ("method=baseline", "backbone.duplicate_layers=[1]"),
                                   ("method=hire", "backbone.duplicate_layers=[0]", "backbone.duplicate_init=gated")])
def test_each_layer_group_gets_the_documented_rate(extra):
    cfg, model, new = built(f"train.layer_decay={DECAY}", *extra)
    opt = optimizer_for(model, cfg.train, "cpu", new)
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    new_ids = {id(p) for p in new}
    L = len(model.backbone.encoder.layer)
    assert L == 3 + len(cfg.backbone.duplicate_layers)
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        layer = re.search(r"backbone\.encoder\.layer\.(\d+)\.", name)
        if id(p) in new_ids:
            want = LR * SCALE
        elif layer:
            want = LR * DECAY ** (L - int(layer.group(1)))
            seen.add(int(layer.group(1)))
        elif "backbone.embeddings." in name:
            want = LR * DECAY ** (L + 1)
            seen.add("emb")
        else:  # the pooler
            want = LR
        assert lr_of[id(p)] == pytest.approx(want), name
    assert seen == {*range(L), "emb"}
    # the top layer at lr x decay, the first at decay^L: rates really differ by depth
    assert len({round(g["lr"], 12) for g in opt.param_groups}) >= L + 2


def test_off_by_default_and_bad_values_fail_before_loading(tmp_path):
    cfg, model, new = built("method=pals")
    opt = optimizer_for(model, cfg.train, "cpu", new)
    assert {round(g["lr"], 12) for g in opt.param_groups} == {LR, LR * SCALE}
    from deepen_run.errors import UserError
    from deepen_run.run.preflight import numbers

    with pytest.raises(UserError, match=r"train.layer_decay=0.0 must be in \(0, 1\]"):
        numbers(make_cfg("backbone=tiny", "task=rte", "train.layer_decay=0"))
