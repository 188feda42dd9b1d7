"""method=hire on a tiny random 4-layer BERT (J = 3 extracted layers): importances, padding
invariance, what trains, the parameter count, config errors; plus one MiniLM run whose
importance artifacts are read back from MLflow."""
import csv

import pytest
import torch
from hydra.errors import ConfigCompositionException

from conftest import cli, make_cfg, runs_of
from deepen_run.model import backbone as bb
from deepen_run.errors import UserError
from deepen_run.data.glue import get_tasks
from deepen_run.methods.hire import model as hire
from deepen_run.model.heads import count, pool
from deepen_run.run.preflight import check
from deepen_run.run.train import optimizer_for

TASKS = ["sst2", "stsb"]
D, LAYERS = 32, 4


def build(*extra):
    cfg = make_cfg("backbone=tiny", f"backbone.num_hidden_layers={LAYERS}", "method=hire",
                   f"task.names=[{','.join(TASKS)}]", *extra)
    torch.manual_seed(0)
    return hire.build(bb.load_model(cfg.backbone), cfg.method, get_tasks(TASKS)), cfg


def batch(lengths=(9, 5, 7, 2), T=9, pad=0):
    """Real tokens up to each length, then padding; `pad` extra padded positions at the end."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 2000, (len(lengths), T), generator=g)
    mask = (torch.arange(T) < torch.tensor(lengths)[:, None]).long()
    ids = torch.nn.functional.pad(ids * mask, (0, pad))  # pad id 0, as the collator pads
    mask = torch.nn.functional.pad(mask, (0, pad))
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def test_importance_is_a_distribution_over_layers_per_example():
    model, _ = build()
    model.eval()
    alpha = model("sst2", **batch()).extras["alpha"]
    assert alpha.shape == (4, LAYERS - 1)
    assert torch.allclose(alpha.sum(-1), torch.ones(4), atol=1e-6)
    assert (alpha > 0).all()
    assert not torch.allclose(alpha[0], alpha[1])  # dynamic: each example gets its own weights
    assert model.layer_names == ["layer_1", "layer_2", "layer_3"]


@pytest.mark.parametrize("opts", [[], ["method.pool=max", "method.summary=last"],
                                  ["method.pool=mean", "method.include_embeddings=true"]])
def test_extra_padding_leaves_logits_unchanged(opts):
    model, _ = build(*opts)
    model.eval()
    with torch.no_grad():
        tight = model("sst2", **batch()).logits
        padded = model("sst2", **batch(pad=6)).logits
        alone = model("sst2", **{k: v[3:, :2] for k, v in batch().items()}).logits  # the short one, unpadded
    assert torch.allclose(tight, padded, atol=1e-5), (tight - padded).abs().max()
    assert torch.allclose(tight[3:], alone, atol=1e-5)


def test_bigru_equals_a_packed_bidirectional_gru():
    # Our padding-exact BiGRU computes what torch's packed nn.GRU computes, with the same weights.
    torch.manual_seed(0)
    ours = hire.BiGRU(12, 8, 2)
    ref = torch.nn.GRU(12, 4, num_layers=2, bidirectional=True, batch_first=True)
    with torch.no_grad():
        for k, layer in enumerate(ours.layers):
            for direction, suffix in (("fwd", ""), ("bwd", "_reverse")):
                for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                    getattr(ref, f"{name}_l{k}{suffix}").copy_(getattr(layer[direction], f"{name}_l0"))
    x = torch.randn(3, 7, 12)
    lengths = torch.tensor([7, 3, 5])
    mask = (torch.arange(7) < lengths[:, None]).long()
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    want = torch.nn.utils.rnn.pad_packed_sequence(ref(packed)[0], batch_first=True, total_length=7)[0]
    assert torch.allclose(ours(x, lengths, mask), want, atol=1e-6)


def test_gradients_reach_backbone_and_both_grus():
    model, _ = build()
    model.train()
    model("sst2", **batch()).logits.sum().backward()
    block = model.hire["shared"]

    def moved(p):
        return p.grad is not None and p.grad.abs().sum() > 0

    assert moved(model.backbone.embeddings.word_embeddings.weight)
    assert all(moved(p) for p in model.backbone.encoder.layer[0].parameters() if p.ndim == 2)
    assert all(moved(p) for p in block.extractor.gru.parameters())  # both layers, both directions
    assert moved(block.extractor.score.weight)
    # With cls pooling the top layer's forward direction contributes one step from h0 = 0, so its
    # recurrent matrix (only) gets no gradient; every other fusion weight does.
    top_fwd_hh = block.fuse.layers[-1]["fwd"].weight_hh_l0
    assert all(moved(p) for p in block.fuse.parameters() if p is not top_fwd_hh)
    assert model.heads["stsb"][1].weight.grad is None
    assert all(p.requires_grad for p in model.parameters())


def test_fixed_importances_mean_and_random():
    mean, _ = build("method.importance=mean")
    alpha = mean("sst2", **batch()).extras["alpha"]
    assert torch.equal(alpha, torch.full((4, LAYERS - 1), 1 / (LAYERS - 1)))
    assert mean.hire["shared"].extractor is None  # fixed weights need no summaries
    rand, _ = build("method.importance=random", "method.random_seed=3")
    a = rand("sst2", **batch()).extras["alpha"]
    assert torch.allclose(a.sum(-1), torch.ones(4)) and torch.equal(a[0], a[3])
    assert not torch.allclose(a[0], alpha[0])
    again, _ = build("method.importance=random", "method.random_seed=3")
    other, _ = build("method.importance=random", "method.random_seed=4")
    assert torch.equal(again.hire["shared"].fixed, rand.hire["shared"].fixed)
    assert not torch.equal(other.hire["shared"].fixed, rand.hire["shared"].fixed)


def gru_params(in_dim: int, hidden: int, layers: int) -> int:
    # Per layer and direction: W_ih (3h x in), W_hh (3h x h), b_ih and b_hh (3h each); layers > 1 read 2h.
    return sum(2 * (3 * hidden * (in_dim if k == 0 else 2 * hidden) + 3 * hidden * hidden + 6 * hidden)
               for k in range(layers))


@pytest.mark.parametrize("k,importance,shared", [(1, "dynamic", True), (3, "dynamic", False), (2, "mean", True)])
def test_parameter_count_matches_the_formula(k, importance, shared):
    model, _ = build(f"method.gru_layers={k}", f"method.importance={importance}", f"method.shared={shared}")
    h = D // 2
    extractor = gru_params(D, h, 2) + D if importance == "dynamic" else 0
    per_hire = extractor + gru_params(4 * D, h, k)
    heads = (D * 2 + 2) + (D + 1)
    assert count(model) - count(model.backbone) - count(model.heads) == per_hire * (1 if shared else len(TASKS))
    assert count(model.heads) == heads


def test_capacity_control_is_hires_fusion_and_head_on_the_last_layer_alone():
    # method.extractor=false: no extractor; the fusion reads M = [R; R; 2R; R*R] from the last layer,
    # so the intermediate layers cannot change the output, and it has the fusion's parameters exactly.
    model, _ = build("method.extractor=false")
    mean, _ = build("method.importance=mean")
    assert model.hire["shared"].extractor is None
    assert count(model) == count(mean)  # importance=mean: the same fusion and head, no extractor either
    assert count(model) - count(model.backbone) - count(model.heads) == gru_params(4 * D, D // 2, 2)
    model.eval()
    b = batch()
    r = model.backbone(**b, output_hidden_states=True).hidden_states[-1]
    mask = b["attention_mask"]
    fused = model.hire["shared"].fuse(torch.cat([r, r, 2 * r, r * r], -1), mask.sum(1), mask)
    assert torch.allclose(model("stsb", **b).logits, model.heads["stsb"](pool(fused, mask, model.cfg.pool)), atol=1e-6)
    with pytest.raises(UserError, match="method.extractor=false"):
        check(make_cfg("method=hire", "method.extractor=false", "method.importance=mean"))


def test_one_hire_per_task_when_not_shared():
    model, _ = build("method.shared=false")
    assert sorted(model.hire) == sorted(TASKS)
    model("stsb", **batch()).logits.sum().backward()
    assert model.hire["stsb"].fuse.layers[0]["fwd"].weight_hh_l0.grad is not None
    assert model.hire["sst2"].fuse.layers[0]["fwd"].weight_hh_l0.grad is None


def test_new_parameters_follow_the_train_level_rule():
    # HIRE sets no multiplier of its own: its GRUs, scorer and heads follow train.new_params_lr_scale.
    assert not hasattr(make_cfg("method=hire").method, "lr_scale")
    lr = make_cfg().train.learning_rate
    for scale in (1.0, 10.0):
        model, cfg = build(f"train.new_params_lr_scale={scale}")
        opt = optimizer_for(model, cfg.train, "cpu", model.new_parameters())
        lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
        assert lr_of[id(model.backbone.embeddings.word_embeddings.weight)] == pytest.approx(lr)
        assert lr_of[id(model.hire["shared"].fuse.layers[1]["bwd"].weight_ih_l0)] == pytest.approx(scale * lr)
        assert lr_of[id(model.hire["shared"].extractor.score.weight)] == pytest.approx(scale * lr)
        assert lr_of[id(model.heads["sst2"][1].weight)] == pytest.approx(scale * lr)
        assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


def test_bad_options_fail_before_any_model_loads():
    with pytest.raises(UserError, match="method.gru_layers=0"):
        check(make_cfg("method=hire", "method.gru_layers=0"))


@pytest.mark.parametrize("key,bad,choices", [("pool", "first", "cls, mean, max"), ("summary", "max", "mean, last"),
                                             ("importance", "uniform", "dynamic, mean, random")])
def test_choice_options_are_rejected_by_composition(key, bad, choices):
    # Enums in the schema (hire_config): Hydra itself names the key and the choices.
    with pytest.raises(ConfigCompositionException, match=f"method.{key}={bad}") as e:
        make_cfg("method=hire", f"method.{key}={bad}")
    assert f"Invalid value '{bad}', expected one of [{choices}]" in str(e.value.__cause__)
    assert make_cfg("method=hire", f"method.{key}={choices.split(', ')[-1]}").method[key] == choices.split(", ")[-1]


def test_too_shallow_backbone_fails_at_build():
    cfg = make_cfg("backbone=tiny", "backbone.num_hidden_layers=1", "method=hire")
    with pytest.raises(UserError, match="include_embeddings"):
        hire.build(bb.load_model(cfg.backbone), cfg.method, get_tasks(["sst2"]))


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.subprocess
def test_minilm_run_records_importances(glue_dir, mlflow_uri):
    r = cli("method=hire", "task.names=[sst2,rte]", "backbone=minilm", f"data.glue_dir={glue_dir}",
            "data.max_train_samples=64", "data.max_eval_samples=24", "data.max_seq_length=48", "train.max_steps=2",
            "train.batch_size=8", "method.report_examples=5", f"tracking.uri={mlflow_uri}")
    assert r.returncode == 0, r.stderr[-3000:]
    client, (run,) = runs_of(mlflow_uri)
    rid, layers = run.info.run_id, [f"layer_{j}" for j in range(1, 6)]  # MiniLM: 6 layers -> H_1..H_5
    with open(client.download_artifacts(rid, "hire/importance.csv")) as fh:
        rows = list(csv.DictReader(fh))
    assert [r["task"] for r in rows] == ["sst2", "rte"] and list(rows[0]) == ["task", *layers]
    for row in rows:
        assert sum(float(row[c]) for c in layers) == pytest.approx(1, abs=1e-4)
        assert run.data.metrics[f"hire/{row['task']}/layer_3"] == pytest.approx(float(row["layer_3"]), abs=1e-5)
    with open(client.download_artifacts(rid, "hire/examples.csv")) as fh:
        ex = list(csv.DictReader(fh))
    assert len(ex) == 10 and all(e["text"] for e in ex)
    arts = {a.path for a in client.list_artifacts(rid, "hire")} | \
        {a.path for a in client.list_artifacts(rid, "hire/examples")}
    assert {"hire/importance.png", "hire/examples/sst2.png", "hire/examples/rte.png"} <= arts
