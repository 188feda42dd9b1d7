"""method=duplicate (the baseline on a backbone deepened by deepen_run/model/duplication.py, a preset): layer surgery
contracts on a tiny random BERT, and one short MiniLM run."""
import pytest
import torch
from transformers import AutoModel

from conftest import cli, make_cfg, runs_of, token_batch
from deepen_run.model import backbone as bb
from deepen_run.model import duplication
from deepen_run.errors import UserError
from deepen_run.data.glue import get_tasks
from deepen_run.model.layers import layer_order, original_positions, sources
from deepen_run.methods import METHODS
from deepen_run.run.preflight import check


def build(layers, seed=0):
    cfg = make_cfg("backbone=tiny", "method=duplicate", f"method.layers=[{','.join(map(str, layers))}]")
    torch.manual_seed(seed)
    backbone = bb.load_model(cfg.backbone)
    original = [{k: v.clone() for k, v in layer.state_dict().items()} for layer in backbone.encoder.layer]
    duplication.apply(backbone, cfg)  # the runner's step before any method builds
    model = METHODS["duplicate"].build(backbone, cfg.method, get_tasks(["sst2"]))
    return model, original


def positions(model):
    """Positions of the original layers in the deeper stack, from the source list the backbone carries."""
    return original_positions(sources(model.backbone))


def same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_depth_copies_and_bookkeeping():
    model, original = build([1, 0])
    layers = model.backbone.encoder.layer
    assert len(layers) == 4 and model.backbone.config.num_hidden_layers == 4  # L + k
    # New stack: 0, copy of 0, 1, copy of 1; originals keep their pretrained weights.
    for pos, src in enumerate([0, 0, 1, 1]):
        assert all(torch.equal(layers[pos].state_dict()[k], v) for k, v in original[src].items())
    assert positions(model) == [0, 2]
    # Parameters are not shared between a layer and its copy.
    ptrs = [{p.data_ptr() for p in layer.parameters()} for layer in layers]
    assert not ptrs[0] & ptrs[1] and not ptrs[2] & ptrs[3]
    assert [layer.attention.self.layer_idx for layer in layers] == [0, 1, 2, 3]


def test_listing_a_layer_twice_gives_two_copies():
    model, _ = build([1, 1])
    layers = model.backbone.encoder.layer
    assert len(layers) == 4
    assert same(layers[1], layers[2]) and same(layers[1], layers[3])
    assert len({id(layers[i]) for i in (1, 2, 3)}) == 3
    assert positions(model) == [0, 1]


def test_original_positions_reproduce_the_pretrained_model():
    torch.manual_seed(0)
    plain = bb.load_model(make_cfg("backbone=tiny").backbone).eval()
    x = token_batch()
    with torch.no_grad():
        want = plain(**x).last_hidden_state
    model, _ = build([0, 1, 1])
    model.eval()
    with torch.no_grad(), layer_order(model.backbone, positions(model)):
        got = model.backbone(**x).last_hidden_state
        assert model.backbone.config.num_hidden_layers == 2
    assert torch.allclose(got, want, atol=1e-6)
    assert model.backbone.config.num_hidden_layers == 5  # restored after the context
    with torch.no_grad():
        assert not torch.allclose(model.backbone(**x).last_hidden_state, want, atol=1e-4)


def test_copy_and_source_train_independently():
    model, _ = build([0])
    src, cp = model.backbone.encoder.layer[0], model.backbone.encoder.layer[1]
    # A step that only updates the copy leaves its source unchanged.
    before = {k: v.clone() for k, v in src.state_dict().items()}
    opt = torch.optim.SGD(cp.parameters(), lr=1.0)
    model("sst2", **token_batch()).logits.sum().backward()
    opt.step()
    assert all(torch.equal(src.state_dict()[k], v) for k, v in before.items())
    assert not same(src, cp)
    # A step on the whole model moves both, differently (they get different gradients).
    model, _ = build([0])
    src, cp = model.backbone.encoder.layer[0], model.backbone.encoder.layer[1]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model("sst2", **token_batch()).logits.sum().backward()
    assert not torch.equal(src.intermediate.dense.weight.grad, cp.intermediate.dense.weight.grad)
    opt.step()
    assert not same(src, cp)


def test_save_pretrained_round_trip(tmp_path):
    model, _ = build([1, 0, 1])
    backbone = model.backbone.eval()
    backbone.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path).eval()
    assert loaded.config.num_hidden_layers == 5 and len(loaded.encoder.layer) == 5
    assert [layer.attention.self.layer_idx for layer in loaded.encoder.layer] == list(range(5))
    with torch.no_grad():
        a, b = backbone(**token_batch()), loaded(**token_batch())
    assert torch.equal(a.last_hidden_state, b.last_hidden_state)
    assert torch.equal(a.pooler_output, b.pooler_output)


@pytest.mark.parametrize("layers", [[2], [0, -1], [5, 1]])
def test_invalid_indices_name_the_valid_range(layers):
    with pytest.raises(UserError, match=r"valid indices are 0\.\.1"):
        build(layers)


def test_invalid_indices_fail_in_the_cheap_checks(glue_dir):
    # preflight.check() runs before any weights load; MiniLM's depth comes from its config.json.
    cfg = make_cfg("backbone=minilm", "method=duplicate", "method.layers=[2,6]", f"data.glue_dir={glue_dir}")
    with pytest.raises(UserError, match=r"method.layers=\[2, 6\]: \[6\] out of range.*0\.\.5"):
        check(cfg)
    check(make_cfg("backbone=minilm", "method=duplicate", "method.layers=[0,5,5]", f"data.glue_dir={glue_dir}"))


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.subprocess
def test_minilm_run_records_depth_and_cosine(glue_dir, mlflow_uri):
    r = cli("method=duplicate", "method.layers=[2]", "task=sst2", "backbone=minilm", f"data.glue_dir={glue_dir}",
            "data.max_train_samples=32", "data.max_eval_samples=32", "backbone.cosine_samples=32",
            "train.max_steps=2", "train.batch_size=8", f"tracking.uri={mlflow_uri}")
    assert r.returncode == 0, r.stderr[-3000:]
    client, (run,) = runs_of(mlflow_uri)
    m = run.data.metrics
    assert m["model/num_layers"] == 7
    # Duplicating a middle layer of a pretrained encoder moves its output, but not far.
    assert 0.5 < m["duplicate/cosine_before_finetune"] < 0.9999
    assert run.data.tags["method"] == "duplicate" and run.data.tags["duplicate.layers"] == "[2]"
    assert "eval/sst2/accuracy" in m
    # The copies are counted apart from what a method adds (params/method: nothing, as the baseline).
    assert m["params/duplicated"] == 1774464  # one MiniLM layer: attention 4*(384*384+384) + 2 LN + FFN
    assert m["params/method"] == 0


@pytest.mark.parametrize("method", list(METHODS))
def test_gated_copies_compute_the_original_function_at_step_0(method):
    # backbone.duplicate_init=gated: h + g (copy(h) - h) with g = 0 is the identity, for every method;
    # each gate is a new parameter (new_params_lr_scale) and learns from the first step.
    from deepen_run.model import steps as backbone_steps
    from deepen_run.model.heads import new_parameters
    from deepen_run.run.train import optimizer_for

    torch.manual_seed(0)
    plain = bb.load_model(make_cfg("backbone=tiny").backbone).eval()
    x = token_batch()
    with torch.no_grad():
        want = plain(**x, output_hidden_states=True)
    # LoRA freezes the encoder by default: here it trains it, so the copies' learning rate is checked too.
    cfg = make_cfg("backbone=tiny", f"method={method}", "backbone.duplicate_layers=[0,1,1]",
                   "backbone.duplicate_init=gated", "train.new_params_lr_scale=10",
                   *(["method.train_backbone=true"] if method == "lora" else []))
    torch.manual_seed(0)
    backbone = bb.load_model(cfg.backbone)
    loaded = tuple(backbone.parameters())
    added = backbone_steps.apply(backbone, cfg)
    assert len(added.new) == 3 and all(g.item() == 0 for g in added.new)
    model = METHODS[method].build(backbone, cfg.method, get_tasks(["sst2"])).eval()
    backbone_steps.train_new(added)  # as the runner does: where a method froze the backbone (LoRA), the gates still train
    with torch.no_grad():
        got = model.backbone(**x, output_hidden_states=True)
    assert torch.equal(got.last_hidden_state, want.last_hidden_state)
    # hidden_states (what HIRE reads) carry the gated outputs: a copy's equals its source's.
    assert torch.equal(got.hidden_states[2], want.hidden_states[1])
    assert torch.equal(got.hidden_states[4], got.hidden_states[5])
    new = new_parameters(model, loaded, added)
    opt = optimizer_for(model, cfg.train, "cpu", new)
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    assert all(lr_of[id(g)] == pytest.approx(10 * cfg.train.learning_rate) for g in added.new)
    assert all(lr_of[id(p)] == pytest.approx(cfg.train.learning_rate) for p in added.copied)
    model.train()
    model("sst2", **x).logits.sum().backward()
    assert all(g.grad is not None and g.grad.item() != 0 for g in added.new)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.subprocess
def test_minilm_gated_copies_start_at_the_original_function(glue_dir, mlflow_uri):
    r = cli("backbone.duplicate_layers=[2]", "backbone.duplicate_init=gated", "task=rte", "backbone=minilm",
            f"data.glue_dir={glue_dir}", "data.max_train_samples=16", "data.max_eval_samples=16",
            "backbone.cosine_samples=16", "train.max_steps=1", "train.batch_size=8", f"tracking.uri={mlflow_uri}")
    assert r.returncode == 0, r.stderr[-3000:]
    _, (run,) = runs_of(mlflow_uri)
    assert run.data.metrics["duplicate/cosine_before_finetune"] >= 0.99999
    assert run.data.metrics["model/num_layers"] == 7 and run.data.params["backbone.duplicate_init"] == "gated"
