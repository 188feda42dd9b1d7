"""HIRE recomputed by hand (docs/methods.md, section HIRE) from the module's own weights and the backbone's
hidden states, and compared with the model in float64: which hidden states the extractor reads,
the layer summaries s_j, importances alpha = softmax_j(w^T s_j), A = sum_j alpha_j H_j, R = H_L,
M = [R; A; R+A; R*A], the fusion BiGRU's output, the pooled vector and the logits.

The reference is written independently of hire.py: a GRU cell from its equations, one example at a
time cut to its real length (so no padding logic is shared), a loop over layers and examples.
Only the weights are read from the model, by name.
"""
import pytest
import torch

from conftest import make_cfg
from deepen_run.model import backbone as bb
from deepen_run.model import layers as surgery
from deepen_run.data.glue import get_tasks
from deepen_run.methods.hire import model as hire

TASKS = ["sst2", "stsb"]
LENGTHS = (9, 5, 7, 2)
TOL = dict(rtol=1e-9, atol=1e-10)


def build(layers=4, duplicate=None, *extra):
    cfg = make_cfg("backbone=tiny", f"backbone.num_hidden_layers={layers}", "method=hire",
                   f"task.names=[{','.join(TASKS)}]", *extra)
    torch.manual_seed(0)
    backbone = bb.load_model(cfg.backbone)
    if duplicate:
        surgery.duplicate(backbone, duplicate)
    model = hire.build(backbone, cfg.method, get_tasks(TASKS)).double().eval()
    return model


def batch(T=9):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 2000, (len(LENGTHS), T), generator=g)
    mask = (torch.arange(T) < torch.tensor(LENGTHS)[:, None]).long()
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def gru_direction(x, gru):
    """One direction of one layer, from the GRU equations: x (T, in) -> (T, h), h_0 = 0."""
    W_ih, W_hh, b_ih, b_hh = gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, gru.bias_hh_l0
    H = W_hh.shape[1]
    h, out = x.new_zeros(H), []
    for x_t in x:
        gi, gh = W_ih @ x_t + b_ih, W_hh @ h + b_hh
        r = torch.sigmoid(gi[:H] + gh[:H])
        z = torch.sigmoid(gi[H:2 * H] + gh[H:2 * H])
        n = torch.tanh(gi[2 * H:] + r * gh[2 * H:])
        h = (1 - z) * n + z * h
        out.append(h)
    return torch.stack(out)


def bigru(x, module):
    """A stacked BiGRU over one unpadded sequence x (T, in): the backward direction reads it
    right to left. Returns (T, 2h)."""
    for layer in module.layers:
        x = torch.cat([gru_direction(x, layer["fwd"]), gru_direction(x.flip(0), layer["bwd"]).flip(0)], dim=-1)
    return x


def reference(model, task, inputs, expected_ids):
    """Everything HIRE computes, by hand, for the batch `inputs`."""
    cfg, block, head = model.cfg, model.hire["shared"], model.heads[task][1]
    out = model.backbone(**inputs, output_hidden_states=True)
    hs = out.hidden_states
    L = model.backbone.config.num_hidden_layers
    assert len(hs) == L + 1
    mask = inputs["attention_mask"]
    B, T, d = hs[-1].shape
    s = torch.zeros(len(expected_ids), B, d, dtype=hs[0].dtype)
    for j, idx in enumerate(expected_ids):
        for b in range(B):
            n = int(mask[b].sum())
            o = bigru(hs[idx][b, :n], block.extractor.gru)
            s[j, b] = o.mean(0) if cfg.summary == "mean" else torch.cat([o[n - 1, : d // 2], o[0, d // 2:]])
    scores = torch.einsum("jbd,d->bj", s, block.extractor.score.weight[0])
    alpha = torch.exp(scores) / torch.exp(scores).sum(1, keepdim=True)  # over the layers, per example
    A = sum(alpha[:, j, None, None] * hs[idx] for j, idx in enumerate(expected_ids))
    R = hs[L]
    M = torch.cat([R, A, R + A, R * A], dim=-1)
    fused = [bigru(M[b, : int(mask[b].sum())], block.fuse) for b in range(B)]
    if cfg.pool == "cls":
        pooled = torch.stack([f[0] for f in fused])
    else:
        pooled = torch.stack([f.mean(0) if cfg.pool == "mean" else f.max(0).values for f in fused])
    logits = pooled @ head.weight.t() + head.bias
    return dict(hs=hs, s=s, alpha=alpha, A=A, R=R, M=M, fused=fused, pooled=pooled, logits=logits)


def run_model(model, task, inputs):
    """The model's own forward, with what its submodules saw and returned."""
    block, seen = model.hire["shared"], {}

    def keep(name):
        def hook(_mod, args, kwargs, output):
            seen[name] = (args, kwargs, output)
        return hook

    handles = [block.extractor.register_forward_hook(keep("extractor"), with_kwargs=True),
               block.extractor.score.register_forward_hook(keep("score"), with_kwargs=True),
               block.fuse.register_forward_hook(keep("fuse"), with_kwargs=True)]
    try:
        with torch.no_grad():
            logits = model(task, **inputs).logits
            pooled, alpha = model.features(task, **inputs)
    finally:
        for h in handles:
            h.remove()
    return logits, pooled, alpha, seen


def check_against_reference(model, expected_ids, task="sst2"):
    inputs = batch()
    assert model.layer_ids == expected_ids
    if len(model.backbone.encoder.layer) == len(set(surgery.sources(model.backbone))):  # copies are labelled 3'
        assert model.layer_names == [f"layer_{j}" for j in expected_ids]
    with torch.no_grad():
        ref = reference(model, task, inputs, expected_ids)
    logits, pooled, alpha, seen = run_model(model, task, inputs)
    J, B, d = len(expected_ids), len(LENGTHS), ref["R"].shape[-1]
    # The extractor read exactly H_j for j in expected_ids, in that order.
    layers_read = seen["extractor"][0][0]
    assert layers_read.shape[0] == J
    torch.testing.assert_close(layers_read, torch.stack([ref["hs"][j] for j in expected_ids]), **TOL)
    # Summaries s_j (what the scorer read, rows ordered layer-major) and importances.
    torch.testing.assert_close(seen["score"][0][0].view(J, B, d), ref["s"], **TOL)
    torch.testing.assert_close(alpha, ref["alpha"], **TOL)
    torch.testing.assert_close(seen["extractor"][2], ref["alpha"], **TOL)
    # Fusion input M = [R; A; R+A; R*A] at every position, and its parts.
    M = seen["fuse"][0][0]
    torch.testing.assert_close(M[..., :d], ref["R"], **TOL)
    torch.testing.assert_close(M[..., d:2 * d], ref["A"], **TOL)
    torch.testing.assert_close(M, ref["M"], **TOL)
    # Fusion output at the real tokens (padded positions are zero), pooled vector, logits.
    fused = seen["fuse"][2]
    for b, n in enumerate(LENGTHS):
        torch.testing.assert_close(fused[b, :n], ref["fused"][b], **TOL)
        assert not fused[b, n:].any()
    torch.testing.assert_close(pooled, ref["pooled"], **TOL)
    torch.testing.assert_close(logits, ref["logits"], **TOL)
    # Not a vacuous match: the importances differ between examples and from uniform.
    assert not torch.allclose(alpha[0], alpha[1]) and not torch.allclose(alpha, torch.full_like(alpha, 1 / J))


@pytest.mark.parametrize("opts", [[], ["method.summary=last", "method.pool=mean"], ["method.pool=max"]])
def test_hire_matches_a_hand_computation(opts):
    # A 4-layer backbone: hidden_states 0..4; the extractor reads H_1..H_3 (not the embeddings, not H_L).
    model = build(4, None, *opts)
    check_against_reference(model, [1, 2, 3])
    check_against_reference(model, [1, 2, 3], task="stsb")


def test_hire_with_embeddings_matches_a_hand_computation():
    model = build(4, None, "method.include_embeddings=true")
    check_against_reference(model, [0, 1, 2, 3])


def test_hire_on_a_duplicated_backbone_matches_a_hand_computation():
    # 3 layers, layers 0 and 2 duplicated -> 5 layers: the extractor reads H_1..H_4, R = H_5.
    model = build(3, [0, 2])
    assert model.backbone.config.num_hidden_layers == 5 and len(model.backbone.encoder.layer) == 5
    check_against_reference(model, [1, 2, 3, 4])
    with_embeddings = build(3, [0, 2], "method.include_embeddings=true")
    check_against_reference(with_embeddings, [0, 1, 2, 3, 4])
