"""train.unpad (deepen_run/model/unpad.py): in training, the layers' Linears map the real tokens alone;
every family's real tokens get the values and gradients of the padded path, the padding's share of the
matmuls is gone, and outside training nothing changes, down to the bit."""
import copy

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModel

from conftest import make_cfg
from deepen_run.model import adapter, unpad
from deepen_run.model.families import FAMILIES
from deepen_run.precision import choose_unpad

TOKENWISE = sorted(f for f in FAMILIES if FAMILIES[f].token_linears)


def _pair(family: str):
    """A tiny random model of the family and a second one with the same weights, unpadded."""
    cfg = make_cfg("backbone=tiny", f"backbone.model_type={family}")
    torch.manual_seed(0)
    ref = AutoModel.from_config(adapter.tiny_config(cfg.backbone))
    fast = copy.deepcopy(ref)
    assert unpad.install(fast) > 0
    return ref, fast


def _batch(family: str) -> dict:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1000, 2000, (3, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    mask[2, 15:] = 0
    out = {"input_ids": ids, "attention_mask": mask}
    if FAMILIES[family].token_types:
        out["token_type_ids"] = torch.zeros_like(ids)
    return out


@pytest.mark.parametrize("family", TOKENWISE)
def test_in_training_the_real_tokens_get_the_padded_paths_values_and_gradients(family):
    ref, fast = _pair(family)
    batch = _batch(family)
    real = batch["attention_mask"].bool()
    outs = []
    for model in (ref, fast):
        torch.manual_seed(5)  # the same dropout masks: unpad changes no tensor dropout sees the shape of
        h = model.train()(**batch).last_hidden_state
        h[real].square().sum().backward()
        outs.append(h)
    assert torch.allclose(outs[0][real], outs[1][real], atol=1e-5), family
    for (name, p), q in zip(ref.named_parameters(), fast.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4), (family, name)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_outside_training_every_output_is_bit_equal_and_the_state_dict_is_the_same(family):
    ref, fast = _pair(family)
    batch = _batch(family)
    for bf16 in (False, True):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            a, b = ref.eval()(**batch).last_hidden_state, fast.eval()(**batch).last_hidden_state
        assert torch.equal(a, b), (family, bf16)
    assert list(ref.state_dict()) == list(fast.state_dict())


def test_the_padding_leaves_the_layers_matmuls():
    """Half the positions are padding: the layers' Linears (all the FLOPs but attention's and the
    embeddings') do half the work, counted by torch's own FLOP counter."""
    ref, fast = _pair("bert")
    ids = torch.randint(1000, 2000, (4, 32))
    mask = torch.ones_like(ids)
    mask[:, 16:] = 0

    def flops(model) -> int:
        with FlopCounterMode(display=False) as count:
            model.train()(input_ids=ids, attention_mask=mask).last_hidden_state.sum().backward()
        return count.get_total_flops()

    c = ref.config
    attention = 3 * 2 * 2 * 4 * 32 * 32 * c.hidden_size * c.num_hidden_layers  # QK^T and PV, forward + backward
    pooler = 2 * 4 * c.hidden_size ** 2  # its forward (the loss does not read it): above the layers
    linears = flops(ref) - attention - pooler
    assert linears == 6 * 4 * 32 * c.num_hidden_layers * (4 * c.hidden_size ** 2 + 2 * c.hidden_size * c.intermediate_size)
    assert flops(fast) - attention - pooler == linears // 2


def test_a_copy_of_the_model_sets_its_own_tokens_and_no_padding_is_the_plain_path():
    _, fast = _pair("bert")
    twin = copy.deepcopy(fast)
    layer = adapter.layers(twin)[0]
    assert layer.output.dense.tokens is not adapter.layers(fast)[0].output.dense.tokens
    assert layer.output.dense.tokens is layer.attention.self.query.tokens
    twin.train()(**_batch("bert"))
    assert layer.output.dense.tokens.index is None  # cleared after each forward
    tokens = unpad.Tokens()
    tokens.set(torch.ones(2, 5, dtype=torch.long))
    assert tokens.index is None  # nothing to skip


def test_deberta_is_left_padded_and_auto_is_on_only_for_bf16_on_a_cpu():
    cfg = make_cfg("backbone=tiny", "backbone.model_type=deberta-v2")
    ok, why = unpad.supported(AutoModel.from_config(adapter.tiny_config(cfg.backbone)))
    assert not ok and "deberta-v2" in why
    assert choose_unpad("auto", "bf16", cuda=False) == ("on", "auto: bf16 on a CPU")
    for precision, cuda in (("no", False), ("bf16", True), ("fp16", True)):
        assert choose_unpad("auto", precision, cuda)[0] == "off"  # fp32 keeps its exact path
    for value in ("on", "off"):
        assert choose_unpad(value, "no", False) == (value, "set by train.unpad")


@pytest.mark.slow
@pytest.mark.parametrize("arm", [["method=baseline"], ["method=hire"], ["method=pals"],
                                 ["method=duplicate", "method.layers=[1]"]], ids=lambda a: a[0])
def test_each_method_trains_the_same_run_with_and_without_padding(arm, tmp_path, glue_dir):
    """A whole run through each method's own hooks (HIRE's hidden states, PALs' residual terms, a
    duplicated layer), fp32 so the two paths differ by rounding alone: the same losses, step by step,
    to 1e-6 relative (the tiny model's logits start near 0, so its losses move little: one real token
    put in another's place moved them by more, in every arm), and the same dev score. SST-2: short
    sentences, so every batch has padding."""
    from conftest import runs_of
    from deepen_run.run.preflight import check
    from deepen_run.run.runner import run

    uri = f"sqlite:///{tmp_path}/m.db"
    for unpadded in ("off", "on"):
        cfg = make_cfg("backbone=tiny", *arm, "task=sst2", "train.max_steps=4", "train.log_every=1",
                       "data.max_train_samples=32", "data.max_eval_samples=16", "data.max_seq_length=64",
                       "train.batch_size=8", "train.mixed_precision=no", f"train.unpad={unpadded}",
                       f"tracking.uri={uri}", f"data.glue_dir={glue_dir}", f"hydra.run.dir={tmp_path}/{unpadded}")
        run(cfg, check(cfg))
    client, (off, on) = runs_of(uri)
    assert (off.data.params["train/unpad"], on.data.params["train/unpad"]) == ("off", "on")
    assert int(on.data.params["train/unpad_linears"]) > 0
    losses = [[m.value for m in client.get_metric_history(r.info.run_id, "train/loss")] for r in (off, on)]
    assert len(losses[0]) == 4 and losses[0] == pytest.approx(losses[1], rel=1e-6, abs=0)
    assert on.data.metrics["eval/score"] == pytest.approx(off.data.metrics["eval/score"], abs=1e-6)
