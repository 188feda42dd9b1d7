"""Every encoder family in the backbone adapter's table (deepen_run/model/families.py), on tiny random
models, offline: every method trains, duplication is exact at step 0, one task's PALs leave another's
outputs alone, a deepened model reloads as itself, the probe runs; what the checkpoint lacked counts
as new; refusals come in one line before any weights load. A new table entry is tested here as it is
added. docs/families.md's table cites these tests."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModel, AutoTokenizer, RobertaConfig, RobertaModel

from conftest import cli, make_cfg, runs_of
from deepen_run.data.glue import get_tasks
from deepen_run.errors import UserError
from deepen_run.methods import FOLDERS, METHODS
from deepen_run.model import adapter, probe, steps
from deepen_run.model import backbone as bb
from deepen_run.model.families import FAMILIES
from deepen_run.model.heads import new_parameters
from deepen_run.precision import resolve

ALL = sorted(FAMILIES)
DISTINCT = [f for f in ALL if not FAMILIES[f].shared_layers]  # families whose layers can be copied
POST_LN = [f for f in DISTINCT if not FAMILIES[f].pre_ln]
SMALL = ["task=rte", "train.max_steps=2", "data.max_train_samples=16", "data.max_eval_samples=8",
         "data.max_seq_length=32", "train.batch_size=4", "train.eval_batch_size=16", "train.mixed_precision=no"]


def tiny(family: str, *more: str):
    return make_cfg("backbone=tiny", f"backbone.model_type={family}", *more)


def batch(T: int = 40) -> dict:
    """Longer than ModernBERT's tiny local window (16), with padding, segment ids of two sentences."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1000, 2000, (3, T), generator=g)
    mask = torch.ones(3, T, dtype=torch.long)
    mask[0, T // 2:] = 0
    types = torch.zeros_like(ids)
    types[:, T // 3:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def load(cfg, seed: int = 0):
    torch.manual_seed(seed)
    return steps.load(cfg)


def run_in_process(cfg, mlflow_uri):
    from deepen_run.run.preflight import check
    from deepen_run.run.runner import run

    run(cfg, check(cfg))
    _, runs = runs_of(mlflow_uri)
    return runs[-1]


@pytest.mark.slow
@pytest.mark.parametrize("family", ALL)
def test_every_method_trains(family, mlflow_uri, glue_dir):
    """Every registered method finishes 2 steps (the scalar mix on DWA, backbone.dwa: one run for both
    steps of issue #59); HIRE again on a gated copy of layer 1 (not on ALBERT), which starts as the
    pretrained function, and LoRA on it with only the copies training (LLaMA Pro)."""
    arms = [[f"method={m}", *(["backbone.dwa=true"] if m == "scalar_mix" else [])] for m in FOLDERS]
    if family in DISTINCT:
        arms.append(["method=hire", "backbone.duplicate_layers=[1]", "backbone.duplicate_init=gated"])
        arms.append(["method=lora", "backbone.duplicate_layers=[1]", "backbone.duplicate_init=gated",
                     "backbone.duplicate_train=copies"])
    for arm in arms:
        r = run_in_process(tiny(family, *arm, *SMALL, f"tracking.uri={mlflow_uri}"), mlflow_uri)
        assert r.info.status == "FINISHED", (family, arm)
        assert "eval/score" in r.data.metrics and r.data.metrics["params/backbone_new"] == 0
        if "backbone.duplicate_layers=[1]" in arm:
            assert r.data.metrics["duplicate/cosine_before_finetune"] >= 0.99999
            if "backbone.duplicate_train=copies" in arm:
                m = r.data.metrics
                assert m["params/trainable"] == m["params/duplicated"] + m["params/method"] + m["params/heads"]
            assert r.data.metrics["model/num_layers"] == 3


@pytest.mark.parametrize("family", DISTINCT)
def test_gated_copies_are_exact_at_step_0(family):
    ref = load(tiny(family))[0].eval()
    deep, _, added = load(tiny(family, "backbone.duplicate_layers=[1,0]", "backbone.duplicate_init=gated"))
    deep.eval()
    x = adapter.inputs(deep, **batch())
    a, b = ref(**x).last_hidden_state, deep(**x).last_hidden_state
    assert len(adapter.layers(deep)) == 4 and deep.config.num_hidden_layers == 4
    assert torch.allclose(a, b, atol=1e-6)
    assert probe.cosine_per_example(a, b, x["attention_mask"]).min() >= 0.99999
    assert added.new  # the gates, or the zeroed projections: new parameters
    if FAMILIES[family].pre_ln:
        assert not any(n.endswith("copy_gate") for n, _ in deep.named_parameters())
        # A copy keeps its source's attention type (and with it the rotary settings of that type).
        types = [layer.attention_type for layer in adapter.layers(deep)]
        assert types == deep.config.layer_types == [ref.config.layer_types[s] for s in (0, 0, 1, 1)]
    # The copies read the model's one config (a deep copy of it would miss a later attention switch).
    configs = {id(m.config) for m in deep.modules() if isinstance(getattr(m, "config", None), type(deep.config))}
    assert configs == {id(deep.config)}


@pytest.mark.parametrize("family", DISTINCT)
def test_a_saved_deepened_model_reloads_as_itself(family, tmp_path):
    init = "gated" if FAMILIES[family].pre_ln else "plain"  # a post-LN gate is a hook: not in the HF class
    cfg = tiny(family, "backbone.duplicate_layers=[1,0]", f"backbone.duplicate_init={init}")
    deep, _, _ = load(cfg)
    with torch.no_grad():  # the copies move away from their sources, as training would move them
        for p in deep.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    deep.eval().save_pretrained(tmp_path)
    # With the attention kernel the run chose (train.attention): transformers does not save it.
    back = AutoModel.from_pretrained(tmp_path, attn_implementation=resolve(cfg.train).attention).eval()
    assert back.config.num_hidden_layers == 4 == len(adapter.layers(back))
    assert getattr(back.config, "layer_types", None) == getattr(deep.config, "layer_types", None)
    x = adapter.inputs(deep, **batch())
    assert torch.equal(deep(**x).last_hidden_state, back(**x).last_hidden_state)


@pytest.mark.parametrize("family", ALL)
def test_one_tasks_pals_leave_another_tasks_outputs_alone(family):
    cfg = tiny(family, "method=pals", "method.hidden_size_aug=8", "method.num_heads=2")
    backbone = load(cfg)[0]
    model = METHODS["pals"].build(backbone, cfg.method, get_tasks(["rte", "sst2"])).eval()
    assert len(model.pals["rte"].attention) == backbone.config.num_hidden_layers  # a PAL per depth
    before = {t: model(t, **batch()).logits for t in ("rte", "sst2")}
    with torch.no_grad():
        for p in model.pals["sst2"].parameters():
            p.add_(1.0)
    assert torch.equal(model("rte", **batch()).logits, before["rte"])
    assert not torch.allclose(model("sst2", **batch()).logits, before["sst2"])  # the PALs do enter


@pytest.mark.parametrize("family", ALL)
def test_top_projected_attention_pools_one_vector_an_example(family):
    # method.variant=top_pal runs the backbone's pooler over its own output: ALBERT's pooler is a bare
    # Linear (no first-token pick), which gave logits per token and a crash in the loss.
    cfg = tiny(family, "method=pals", "method.variant=top_pal", "method.hidden_size_aug=24", "method.top_heads=4",
               "method.pooling=auto")
    model = METHODS["pals"].build(load(cfg)[0], cfg.method, get_tasks(["rte"])).eval()
    assert model("rte", **batch()).logits.shape == (3, 2)


@pytest.mark.parametrize("family", DISTINCT)
def test_the_probes_duplicated_layer_0_is_the_model_the_step_builds(family):
    # ModernBERT's copy of layer 0 gains the attention norm its new position has (adapter.fit_copy);
    # the probe once ran layer 0 twice without it, which measured another model than the step builds.
    import copy

    from deepen_run.model import duplication

    ref = load(tiny(family))[0].eval()
    torch.manual_seed(1)
    with torch.no_grad():  # pretrained-like weights far from a fresh init, so a missing norm shows
        for p in ref.parameters():
            p.add_(0.3 * torch.randn_like(p))
    deep = copy.deepcopy(ref)
    duplication.apply(deep, tiny(family, "backbone.duplicate_layers=[0]"))
    b, x = batch(), adapter.inputs(ref, **batch())
    with torch.no_grad():
        built = probe.cosine_per_example(ref(**x).last_hidden_state, deep.eval()(**x).last_hidden_state,
                                         b["attention_mask"]).mean().item()
    rows, _ = probe.redundancy(ref, [b], progress=False)
    assert rows[0]["cos_duplicated"] == pytest.approx(built, abs=1e-5)


@pytest.mark.parametrize("family", DISTINCT)
def test_the_probe_runs(family):
    backbone = load(tiny(family))[0]
    b = {k: v for k, v in batch().items()}
    rows, ref_acc = probe.redundancy(backbone, [b], progress=False)
    assert [r["layer"] for r in rows] == [0, 1]
    assert all(-1 <= r["cos_removed"] <= 1 and -1 <= r["cos_duplicated"] <= 1 for r in rows)


@pytest.mark.parametrize("family", ALL)
def test_hire_reads_hidden_states_on_one_footing(family):
    backbone = load(tiny(family))[0].eval()
    out = backbone(**adapter.inputs(backbone, **batch()), output_hidden_states=True)
    hs = adapter.hidden_states(backbone, out)
    assert len(hs) == backbone.config.num_hidden_layers + 1 and torch.equal(hs[-1], out.last_hidden_state)
    if FAMILIES[family].final_norm:  # every hidden state through the final norm: unit scale like the last
        norm = backbone.get_submodule(FAMILIES[family].final_norm)
        assert torch.equal(hs[1], norm(out.hidden_states[1])) and not torch.equal(hs[1], out.hidden_states[1])


@pytest.mark.parametrize("family", POST_LN)
def test_a_gate_trains_under_a_frozen_backbone(family, mlflow_uri):
    """method=pals method.freeze_backbone=true: a gated copy's gate trains, so one more trainable parameter."""
    trainable = {}
    for init in ("plain", "gated"):
        cfg = tiny(family, "method=pals", "method.freeze_backbone=true", "backbone.duplicate_layers=[1]",
                   f"backbone.duplicate_init={init}", "dry_run=true", f"tracking.uri={mlflow_uri}")
        trainable[init] = run_in_process(cfg, mlflow_uri).data.metrics["params/trainable"]
    assert trainable["gated"] == trainable["plain"] + 1


@pytest.fixture(scope="module")
def roberta_without_pooler(tmp_path_factory):
    """A 'pretrained' tiny RoBERTa whose checkpoint holds no pooler (as roberta-base's), with MiniLM's tokenizer."""
    folder = tmp_path_factory.mktemp("roberta_nopool")
    torch.manual_seed(0)
    conf = RobertaConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=128, type_vocab_size=2, pad_token_id=0)
    RobertaModel(conf, add_pooling_layer=False).save_pretrained(folder)
    AutoTokenizer.from_pretrained(bb.resolve(make_cfg("backbone=tiny").backbone.path)).save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
def test_a_pooler_the_checkpoint_lacks_is_new(roberta_without_pooler, mlflow_uri, glue_dir):
    from deepen_run.run.train import optimizer_for

    over = ("backbone=tiny", "backbone.pretrained=true", f"backbone.path={roberta_without_pooler}",
            "backbone.model_type=roberta", "method.pooling=pooler", "train.new_params_lr_scale=10")
    cfg = make_cfg(*over)
    backbone, loaded, added = load(cfg)
    pooler = dict(backbone.named_parameters())
    assert {id(p) for p in added.fresh} == {id(pooler["pooler.dense.weight"]), id(pooler["pooler.dense.bias"])}
    model = METHODS["baseline"].build(backbone, cfg.method, get_tasks(["rte"]))
    new = new_parameters(model, loaded, added)
    opt = optimizer_for(model, cfg.train, "cpu", new)
    lr = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    assert lr[id(pooler["pooler.dense.weight"])] == 10 * cfg.train.learning_rate
    assert lr[id(pooler["embeddings.word_embeddings.weight"])] == cfg.train.learning_rate
    before = pooler["pooler.dense.weight"].detach().clone()
    model("rte", **batch()).logits.sum().backward()
    opt.step()
    assert not torch.equal(before, pooler["pooler.dense.weight"])  # pooling=pooler reads it: it trains
    # The run records it; the default pooling (auto) reads the first token, never that random pooler.
    r = run_in_process(make_cfg(*over, *SMALL, f"tracking.uri={mlflow_uri}"), mlflow_uri)
    assert r.info.status == "FINISHED" and r.data.metrics["params/backbone_new"] == 32 * 32 + 32
    auto = make_cfg(*over[:-2])
    assert METHODS["baseline"].build(load(auto)[0], auto.method, get_tasks(["rte"])).pooling == "cls"


@pytest.fixture(scope="module")
def bert_saved_in_bf16(tmp_path_factory):
    """A checkpoint whose config names bfloat16, as many recent Hub models ship."""
    from transformers import BertConfig, BertModel

    folder = tmp_path_factory.mktemp("bert_bf16")
    torch.manual_seed(0)
    conf = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=128)
    BertModel(conf).to(torch.bfloat16).save_pretrained(folder)
    AutoTokenizer.from_pretrained(bb.resolve(make_cfg("backbone=tiny").backbone.path)).save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
def test_a_checkpoint_saved_in_bf16_trains_and_rebuilds_in_fp32(bert_saved_in_bf16, mlflow_uri, glue_dir):
    # transformers 5 builds a model in its config's dtype: the weights were bf16, so AdamW updated
    # bf16 weights, and train.mixed_precision=no crashed on fp32 inputs meeting bf16 weights.
    from transformers import AutoConfig

    from deepen_run.serve.bundle import rebuild

    over = ("backbone=tiny", "backbone.pretrained=true", f"backbone.path={bert_saved_in_bf16}")
    backbone, _, _ = load(make_cfg(*over))
    assert {p.dtype for p in backbone.parameters()} == {torch.float32}
    r = run_in_process(make_cfg(*over, *SMALL, f"tracking.uri={mlflow_uri}", f"data.glue_dir={glue_dir}"), mlflow_uri)
    assert r.info.status == "FINISHED"
    model, _ = rebuild(make_cfg(*over), AutoConfig.from_pretrained(bert_saved_in_bf16), None)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


@pytest.mark.slow
@pytest.mark.subprocess
def test_albert_duplication_is_refused_in_one_line(mlflow_uri, glue_dir):
    r = cli("backbone=tiny", "backbone.model_type=albert", "backbone.duplicate_layers=[1]", *SMALL)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "share one set of weights" in r.stderr and "backbone.duplicate_layers" in r.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_an_unknown_family_is_refused_before_weights_load(tmp_path, glue_dir):
    """A folder whose config.json names another model_type and holds no weights: refused on its config alone."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    r = cli("backbone=tiny", "backbone.pretrained=true", f"backbone.path={tmp_path}", *SMALL)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "'t5'" in r.stderr and all(f in r.stderr for f in ALL)
    with pytest.raises(UserError, match="supported: bert, roberta"):
        from deepen_run.run.preflight import check

        check(tiny("gpt2"))


@pytest.mark.parametrize("family", ALL)
def test_layer_index_places_every_parameter_in_depth(family):
    backbone = load(tiny(family))[0]
    where = adapter.layer_index(backbone)
    L = len(adapter.layers(backbone))
    assert set(where) == {n for n, _ in backbone.named_parameters()}
    for i, layer in enumerate(adapter.layers(backbone)):
        ids = {id(p) for p in layer.parameters()}
        assert {where[n] for n, p in backbone.named_parameters() if id(p) in ids} == {i + 1}
    assert any(v == 0 for v in where.values())  # the embeddings
    above = {n for n, v in where.items() if v == L + 1}
    assert above == {n for n, _ in backbone.named_parameters() if n.startswith(FAMILIES[family].above)}
