"""train.dropout_masks=fast (deepen_run/model/dropout.py): the same Bernoulli masks and scale as
torch's dropout, drawn cheaper, swapped into every dropout of a model; outside training nothing
changes, down to the bit."""
import importlib

import pytest
import torch
from transformers import AutoConfig, AutoModel

from conftest import token_batch
from deepen_run.model import dropout as fd
from deepen_run.precision import choose_dropout_masks


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_each_element_is_kept_with_probability_one_minus_p(p):
    torch.manual_seed(0)
    keep = fd.keep_mask(torch.Size([4000, 1000]), p, "cpu")
    # Each of the four elements cut from one 64-bit draw on its own (random_() alone never sets the
    # top bit, which would keep every fourth element far too often).
    lanes = keep.view(-1, 4).float().mean(0)
    assert torch.allclose(lanes, torch.full((4,), 1 - p), atol=0.003), lanes  # ~10 binomial std
    assert fd.keep_mask(torch.Size([1000]), 0.0, "cpu").all()


def test_kept_values_are_scaled_as_torch_scales_them_and_gradients_follow_the_mask():
    torch.manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(64, 384, dtype=dtype, requires_grad=True)
        y = fd.drop(x, 0.1)
        kept = y != 0
        assert y.dtype == dtype
        assert torch.equal(y[kept], (x * (1 / 0.9))[kept])  # torch's dropout: x * (1 / (1 - p)), rounded once
        assert 0.85 < kept.float().mean() < 0.95
        y.sum().backward()
        assert torch.equal(x.grad != 0, kept) and torch.allclose(x.grad[kept].float(), torch.tensor(1 / 0.9), rtol=1e-2)
    m = fd.FastDropout(0.3)
    x = torch.randn(8, 8)
    assert m.eval()(x) is x and torch.equal(fd.FastDropout(1.0).train()(x), torch.zeros_like(x))


def test_the_families_named_have_bert_s_eager_attention_line_for_line():
    """eager_fast stands in for each family's own eager attention: a transformers release that
    changes one of them fails here."""
    bert = importlib.import_module("transformers.models.bert.modeling_bert").eager_attention_forward.__code__
    for family in fd.EAGER_AS_BERT:
        name = family.replace("-", "_")
        code = importlib.import_module(f"transformers.models.{name}.modeling_{name}").eager_attention_forward.__code__
        assert (code.co_code, code.co_consts, code.co_names) == (bert.co_code, bert.co_consts, bert.co_names), family
    ours = fd.eager_fast.__code__
    assert ours.co_varnames[:7] == bert.co_varnames[:7]  # module, query, key, value, mask, scaling, dropout


def _pair(model_type: str, **extra):
    def cfg():  # one each: a model's config is its own, and install changes the fast one's attention
        return AutoConfig.for_model(model_type, vocab_size=2000, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64, **extra)

    torch.manual_seed(0)
    ref = AutoModel.from_config(cfg(), attn_implementation="eager")
    fast = AutoModel.from_config(cfg(), attn_implementation="eager")
    fast.load_state_dict(ref.state_dict())
    return ref, fast


@pytest.mark.parametrize("model_type", ["bert", "roberta", "albert"])
def test_installed_outside_training_every_output_is_bit_equal(model_type):
    ref, fast = _pair(model_type, **({"embedding_size": 16} if model_type == "albert" else {}))
    assert fd.install(fast, fast, "eager") == ["hidden", "attention"]
    assert not [m for m in fast.modules() if type(m) is torch.nn.Dropout]
    assert ref.config._attn_implementation == "eager" and fast.config._attn_implementation == fd.NAME
    batch = {k: v for k, v in token_batch().items() if k != "token_type_ids"}
    batch["attention_mask"][1, 3:] = 0  # padding in two rows: a lost mask shows
    for bf16 in (False, True):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            a = ref.eval()(**batch, output_attentions=True)
            b = fast.eval()(**batch, output_attentions=True)
        assert torch.equal(a.last_hidden_state, b.last_hidden_state), (model_type, bf16)
        assert all(torch.equal(x, y) for x, y in zip(a.attentions, b.attentions))


def test_in_training_no_mask_comes_from_bernoulli():
    _, fast = _pair("bert", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    fd.install(fast, fast, "eager")
    fast.train()
    batch = token_batch()  # (drawn with randint: outside the profile)
    with torch.profiler.profile() as prof:
        fast(**batch).last_hidden_state.sum().backward()
    ops = {e.key: e.count for e in prof.key_averages()}
    assert "aten::bernoulli_" not in ops and "aten::native_dropout" not in ops, sorted(ops)
    # embeddings, and each layer's attention probabilities and two hidden dropouts: 1 + 2 x 3 draws
    assert ops["aten::random_"] == 7


def test_sdpa_keeps_its_own_attention_and_only_hidden_dropouts_change():
    _, fast = _pair("bert")
    fast.set_attn_implementation("sdpa")
    assert fd.install(fast, fast, "sdpa") == ["hidden"]
    assert fast.config._attn_implementation == "sdpa"  # transformers' record of what its layers call


def test_auto_is_fast_only_for_bf16_on_a_cpu():
    assert choose_dropout_masks("auto", "bf16", cuda=False) == ("fast", "auto: bf16 on a CPU")
    for precision, cuda in (("no", False), ("bf16", True), ("fp16", True)):
        assert choose_dropout_masks("auto", precision, cuda)[0] == "torch"  # fp32 keeps its exact random stream
    for value in ("torch", "fast"):
        assert choose_dropout_masks(value, "no", False) == (value, "set by train.dropout_masks")
