"""method=pals method.variant=top_pal | low_rank (docs/methods.md, section PALs' variants): the parameter
counts equal the paper's closed forms (the 1.10x and 1.13x budgets on BERT-base), and each variant's
outputs equal the authors' computation (AsaCooperStickland/Bert-n-Pals, modeling.py: BERTEncoder with
config.top, BERTLayer with config.mult and BERTLowRank), written out here as equations over the
model's own weights, on a tiny BERT with padding."""
import math

import pytest
import torch

from conftest import make_cfg
from deepen_run.data.glue import get_tasks
from deepen_run.errors import UserError
from deepen_run.methods.pals import model as pals
from deepen_run.methods.pals import variants as v
from deepen_run.model import backbone as bb
from deepen_run.model.heads import count, param_report
from deepen_run.run.preflight import method_checks

TASKS = ["sst2", "rte", "stsb"]
BERT_BASE = 109_482_240  # docs/methods.md: BERT-base's parameters (tests/test_pals.py checks it on the real model)


def build(*extra):
    cfg = make_cfg("backbone=tiny", "method=pals", f"task.names=[{','.join(TASKS)}]", *extra)
    torch.manual_seed(0)
    backbone = bb.load_model(cfg.backbone)
    n = count(backbone)
    return pals.build(backbone, cfg.method, get_tasks(TASKS)), n


def batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1000, 2000, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, 5:] = 0
    ids[0, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def grow(params, scale=30.0):
    # At N(0, 0.02) the new terms barely move the output; scaled up, a misplaced term shows.
    with torch.no_grad():
        for p in params:
            p.mul_(scale)


# ---- the authors' equations (modeling.py), written out -------------------------------------------

def gelu(x):  # modeling.py's gelu: the erf form
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def layer_norm(x, gamma, beta, eps=1e-12):  # BERTLayerNorm: eps inside the square root
    u = x.mean(-1, keepdim=True)
    s = (x - u).pow(2).mean(-1, keepdim=True)
    return gamma * (x - u) / torch.sqrt(s + eps) + beta


def self_attention(x, wq, bq, wk, bk, wv, bv, heads, ext_mask):
    """BERTSelfAttention: scores / sqrt(head size) + the extended mask ((1 - mask) * -10000), softmax."""
    B, T, D = x.shape
    split = lambda y: y.view(B, T, heads, D // heads).permute(0, 2, 1, 3)  # noqa: E731
    q, k, val = split(x @ wq.T + bq), split(x @ wk.T + bk), split(x @ wv.T + bv)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D // heads) + ext_mask
    return (torch.softmax(scores, -1) @ val).permute(0, 2, 1, 3).reshape(B, T, D)


def extended(mask):
    return (1.0 - mask[:, None, None, :].float()) * -10000.0


def bert_layer(layer, h, ext_mask, extra=None):
    """BERTLayer.forward: attention_output a, then output(intermediate(a), a + extra) (extra: mult's term)."""
    at = layer.attention
    s = at.self
    heads = s.num_attention_heads
    ctx = self_attention(h, s.query.weight, s.query.bias, s.key.weight, s.key.bias, s.value.weight, s.value.bias,
                         heads, ext_mask)
    a = layer_norm(ctx @ at.output.dense.weight.T + at.output.dense.bias + h, at.output.LayerNorm.weight,
                   at.output.LayerNorm.bias)
    inter = gelu(a @ layer.intermediate.dense.weight.T + layer.intermediate.dense.bias)
    res = a if extra is None else a + extra
    return layer_norm(inter @ layer.output.dense.weight.T + layer.output.dense.bias + res,
                      layer.output.LayerNorm.weight, layer.output.LayerNorm.bias)


def pooler(bert, h):  # BERTPooler: tanh(dense(h[:, 0]))
    return torch.tanh(h[:, 0] @ bert.pooler.dense.weight.T + bert.pooler.dense.bias)


def split_qkv(lin):
    w, b = lin.weight.chunk(3), lin.bias.chunk(3)
    return w[0], b[0], w[1], b[1], w[2], b[2]


def authors_top(model, task, x):
    """BERTEncoder with config.top (bert_lay_top false): after the last layer,
    h = mult_dense[i](h); for lay in multi_layers[i] (6 BERTAttention(config, 12)): h = lay(h, mask);
    all_encoder_layers[-1] = mult_dense2[i](h); the pooler then reads that."""
    bert, top, ext = model.backbone, model.top[task], extended(x["attention_mask"])
    h = bert.embeddings(input_ids=x["input_ids"], token_type_ids=x["token_type_ids"])
    for layer in bert.encoder.layer:
        h = bert_layer(layer, h, ext)
    h = h @ top.encoder.weight.T + top.encoder.bias
    for lay in top.layers:  # BERTAttention: LN(dense(self_attn(x)) + x), in the d_s space
        ctx = self_attention(h, *split_qkv(lay.qkv), lay.heads, ext)
        h = layer_norm(ctx @ lay.out.weight.T + lay.out.bias + h, lay.norm.weight, lay.norm.bias)
    h = h @ top.decoder.weight.T + top.decoder.bias
    return model.heads[task](pooler(bert, h))


def authors_low_rank(model, task, x):
    """BERTLayer with config.mult, pals false: extra = BERTLowRank(h) = aug_dense2(gelu(aug_dense(h)))
    of the layer input h, one per task and layer; layer_output = output(intermediate, a + extra)."""
    bert, ext = model.backbone, extended(x["attention_mask"])
    h = bert.embeddings(input_ids=x["input_ids"], token_type_ids=x["token_type_ids"])
    for i, layer in enumerate(bert.encoder.layer):
        lr = model.low_rank[task][i]
        extra = gelu(h @ lr.encoder.weight.T + lr.encoder.bias) @ lr.decoder.weight.T + lr.decoder.bias
        h = bert_layer(layer, h, ext, extra)
    return model.heads[task](pooler(bert, h))


# ---- the tests -----------------------------------------------------------------------------------

def test_closed_forms_give_the_papers_budgets():
    d, L = 768, 12
    top = 2 * d * 204 + 204 + d + 6 * (4 * 204 ** 2 + 6 * 204)  # V_E, V_D; 6 x (q, k, v, W_O, LayerNorm)
    low = L * (2 * d * 100 + 100 + d)  # 12 x (V_E, V_D), r = 100
    assert v.top_params_per_task(d, 204, 6) == top == 1_320_444
    assert v.low_rank_params_per_task(d, 100, L) == low == 1_853_616
    # The paper's 8 GLUE tasks on BERT-base, against its nominal 110M: Top Proj. Attn. 1.10x,
    # low-rank 1.13x, PALs 1.13x, its table's figures to two decimals.
    pal = pals.pal_params_per_task(d, 204, L)
    assert [round(1 + 8 * x / 110e6, 2) for x in (top, low, pal)] == [1.10, 1.13, 1.13]
    # Against the exact 109,482,240: 1.096x, 1.135x and 1.133x (docs/methods.md gives both).
    assert [round(1 + 8 * x / BERT_BASE, 3) for x in (top, low, pal)] == [1.096, 1.135, 1.133]


@pytest.mark.parametrize("variant,extra,per_task", [
    ("top_pal", ["method.hidden_size_aug=12", "method.top_heads=3", "method.top_layers=2"],
     2 * 32 * 12 + 12 + 32 + 2 * (4 * 12 * 12 + 6 * 12)),
    ("low_rank", ["method.low_rank_size=5"], 2 * (2 * 32 * 5 + 5 + 32)),
])
def test_parameter_count_equals_the_closed_form(variant, extra, per_task):
    model, n = build(f"method.variant={variant}", *extra)
    parts = model.top if variant == "top_pal" else model.low_rank
    for t in TASKS:
        assert count(parts[t]) == per_task
    assert param_report(model, n)["params/method"] == len(TASKS) * per_task
    closed = v.top_params_per_task(32, 12, 2) if variant == "top_pal" else v.low_rank_params_per_task(32, 5, 2)
    assert closed == per_task
    # Everything it adds is declared new (trained at new_params_lr_scale), nothing else.
    new = {id(p) for p in model.new_parameters()}
    assert new == {id(p) for p in (*parts.parameters(), *model.heads.parameters())}


@pytest.mark.parametrize("variant,extra,reference", [
    ("top_pal", ["method.hidden_size_aug=12", "method.top_heads=3", "method.top_layers=2"], authors_top),
    ("low_rank", ["method.low_rank_size=6"], authors_low_rank),
])
def test_outputs_equal_the_authors_computation(variant, extra, reference):
    model, _ = build(f"method.variant={variant}", *extra)
    parts = model.top if variant == "top_pal" else model.low_rank
    grow(parts.parameters())
    with torch.no_grad():  # the LayerNorms of top_pal away from identity, so their weights matter
        for name, p in parts.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    # In float64 both sides: the equations must agree, not two CPUs' fp32 summation orders (an
    # AVX-512 machine differed from an AVX2 one by 1.07e-6 in fp32).
    model.eval().double()
    x = batch()
    with torch.no_grad():
        for t in TASKS:
            got = model(t, **x).logits
            want = reference(model, t, x)
            assert got.dtype == want.dtype == torch.float64
            assert (got - want).abs().max().item() < 1e-6, t
        # The task routes: another task's parameters give other logits; the plain backbone others again.
        assert not torch.allclose(model("sst2", **x).logits, model("rte", **x).logits[:, :2], atol=1e-3)


def test_low_rank_leaves_no_state_and_zero_decoders_give_the_plain_backbone():
    model, _ = build("method.variant=low_rank", "method.pooling=pooler")
    model.eval()
    x = batch()
    with torch.no_grad():
        plain = model.heads["rte"](model.backbone(**x).pooler_output)
        assert not torch.allclose(model("rte", **x).logits, plain, atol=1e-7)
        for lr in model.low_rank["rte"]:
            lr.decoder.weight.zero_()
            lr.decoder.bias.zero_()
        torch.testing.assert_close(model("rte", **x).logits, plain)
    assert model._task is None and not model._pending


def test_training_one_task_sends_no_gradient_to_another():
    for variant in ("top_pal", "low_rank"):
        model, _ = build(f"method.variant={variant}", "method.hidden_size_aug=12", "method.top_heads=3")
        parts = model.top if variant == "top_pal" else model.low_rank
        model.train()
        model("rte", **batch()).logits.sum().backward()
        assert all(p.grad is not None for p in parts["rte"].parameters()), variant
        assert all(p.grad is None for t in ("sst2", "stsb") for p in parts[t].parameters()), variant


@pytest.mark.parametrize("extra,message", [
    (["method.variant=low_rank", "method.low_rank_size=0"], "method.low_rank_size=0 must be positive"),
    (["method.variant=top_pal", "method.top_heads=5"], "method.hidden_size_aug=204 must be a positive multiple of "
                                                        "method.top_heads=5"),
    (["method.variant=top_pal", "method.top_layers=0"], "method.top_layers=0 must be at least 1"),
])
def test_bad_variant_sizes_fail_in_the_preflight(extra, message):
    cfg = make_cfg("backbone=tiny", "method=pals", *extra)
    with pytest.raises(UserError, match=message):
        method_checks(cfg, get_tasks(["sst2"]))


def test_low_rank_ignores_the_pals_head_count():
    # d_s=204 with 5 heads does not fit PALs, but low_rank has no heads: it builds.
    cfg = make_cfg("backbone=tiny", "method=pals", "method.variant=low_rank", "method.num_heads=5")
    method_checks(cfg, get_tasks(["sst2"]))
