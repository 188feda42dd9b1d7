"""method=pals (docs/methods.md, section PALs): where the projected attention sits, task routing, what trains, the
attention mask, the exact parameter accounting, and the paper's annealed schedule."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import make_cfg, runs_of
from deepen_run.model import backbone as bb
from deepen_run.errors import UserError
from deepen_run.data.glue import get_tasks
from deepen_run.methods.pals import model as pals
from deepen_run.model.heads import count, param_report, task_loss
from deepen_run.run.preflight import method_checks
from deepen_run.data.sampling import TaskSampler, epoch_length
from deepen_run.run.train import optimizer_for

TASKS = ["sst2", "rte", "stsb"]


def build(*extra, tasks=TASKS):
    cfg = make_cfg("backbone=tiny", "method=pals", f"task.names=[{','.join(tasks)}]", *extra)
    torch.manual_seed(0)
    backbone = bb.load_model(cfg.backbone)
    n = count(backbone)
    return pals.build(backbone, cfg.method, get_tasks(tasks)), n, cfg


def batch(B=4, T=10, seed=1, pad_first=True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 2000, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    if pad_first:
        mask[0, 6:] = 0
        ids[0, 6:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def grow_pals(model, scale=50.0):
    # At N(0, 0.02) the PAL term is tiny; scaled up it dominates, so a misplaced term shows.
    with torch.no_grad():
        for p in model.pals.parameters():
            p.mul_(scale)


def test_per_task_parameter_formula():
    # BERT-base, d_s = 204, 12 layers: the paper's 1,819,836 per task.
    assert pals.pal_params_per_task(768, 204, 12) == 1_819_836
    model, n, _ = build("method.hidden_size_aug=12", "method.num_heads=3")
    per_task = (32 * 12 + 12) + (12 * 32 + 32) + 2 * 3 * (12 * 12 + 12)  # V_E, V_D, 2 layers of q/k/v
    for t in TASKS:
        assert count(model.pals[t]) == per_task == pals.pal_params_per_task(32, 12, 2)
    assert param_report(model, n)["params/method"] == len(TASKS) * per_task


def test_matches_the_block_computed_by_hand():
    """H_l = LN2(a + W_2 GELU(W_1 a) + GELU(V_D MHA(V_E h))), h the layer input (eval, no padding)."""
    model, _, _ = build()
    grow_pals(model)
    model.eval()
    x = batch(pad_first=False)
    bert, tp = model.backbone, model.pals["rte"]
    with torch.no_grad():
        h = bert.embeddings(input_ids=x["input_ids"], token_type_ids=x["token_type_ids"])
        for i, layer in enumerate(bert.encoder.layer):
            a = layer.attention(h, None)[0]
            att = tp.attention[i]
            e = tp.encoder(h)
            B, T, D = e.shape
            w, b = att.qkv.weight.split(D), att.qkv.bias.split(D)  # stacked q, k, v
            q, k, v = (F.linear(e, w[j], b[j]).view(B, T, 6, D // 6).transpose(1, 2) for j in range(3))
            mha = (torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D // 6), -1) @ v).transpose(1, 2).reshape(B, T, D)
            ts = F.gelu(tp.decoder(mha))
            h = layer.output.LayerNorm(layer.output.dense(layer.intermediate(a)) + a + ts)
        want = model.heads["rte"](bert.pooler(h))
        got = model("rte", **x).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_zero_pals_give_the_plain_backbone_and_forward_leaves_no_state():
    model, _, _ = build()
    model.eval()
    x = batch()
    with torch.no_grad():
        plain = model.heads["sst2"](model.backbone(**x).pooler_output)  # no task routed: plain BERT
        with_pals = model("sst2", **x).logits
        assert not torch.allclose(with_pals, plain, atol=1e-7)
        model.pals["sst2"].decoder.weight.zero_()
        torch.testing.assert_close(model("sst2", **x).logits, plain)
    assert model._task is None and model._keep is None and not model._pending


def test_padding_does_not_change_logits():
    model, _, _ = build()
    grow_pals(model)
    model.eval()
    x = batch(B=1, T=7, pad_first=False)
    padded = {k: F.pad(v, (0, 5)) for k, v in x.items()}  # 5 pad tokens (id 0, mask 0) on the right
    with torch.no_grad():
        for t in TASKS:
            torch.testing.assert_close(model(t, **padded).logits, model(t, **x).logits, atol=1e-5, rtol=1e-4)
        # The mask matters: attending to the pads (mask all ones) moves the logits.
        assert not torch.allclose(model("rte", **{**padded, "attention_mask": torch.ones_like(padded["input_ids"])}).logits,
                                  model("rte", **x).logits, atol=1e-3)


def test_routing_isolation():
    model, _, _ = build()
    model.eval()
    x = batch()
    with torch.no_grad():
        before = {t: model(t, **x).logits for t in TASKS}
        for p in model.pals["sst2"].parameters():
            p.add_(torch.randn_like(p))
        after = {t: model(t, **x).logits for t in TASKS}
    assert not torch.allclose(after["sst2"], before["sst2"])
    assert torch.equal(after["rte"], before["rte"]) and torch.equal(after["stsb"], before["stsb"])
    # A copy routes through its own PALs, not the original's.
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.pals["rte"].decoder.weight.zero_()
        assert torch.equal(model("rte", **x).logits, before["rte"])
        assert not torch.equal(twin("rte", **x).logits, before["rte"])
    # Training one task sends no gradient into another task's PALs.
    model.train()
    model("rte", **x).logits.sum().backward()
    assert all(p.grad is not None for p in model.pals["rte"].parameters())
    assert all(p.grad is None for t in ("sst2", "stsb") for p in model.pals[t].parameters())


def test_frozen_backbone_trains_only_pals_and_heads():
    model, _, cfg = build("method.freeze_backbone=true", "train.learning_rate=1e-2")
    trainable = {n.split(".")[0] for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"pals", "heads"}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = optimizer_for(model, cfg.train, "cpu", model.new_parameters())
    model.train()
    for step, task in enumerate(["sst2", "rte", "sst2"]):
        x = batch(seed=step)
        loss = task_loss(model(task, **x).logits, torch.tensor([0, 1, 1, 0]), regression=False)
        loss.backward()
        opt.step()
        opt.zero_grad()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(n.startswith(("pals.sst2.", "pals.rte.", "heads.sst2.", "heads.rte.")) for n in changed)
    for prefix in ("pals.sst2.encoder", "pals.rte.decoder", "pals.rte.attention.1.qkv", "heads.sst2", "heads.rte"):
        assert any(n.startswith(prefix) for n in changed), prefix


@pytest.mark.parametrize("aug,heads", [(10, 3), (0, 3), (12, 0), (-6, 3)])
def test_bad_sizes_fail_in_the_preflight_before_weights_load(aug, heads):
    cfg = make_cfg("backbone=tiny", "method=pals", f"method.hidden_size_aug={aug}", f"method.num_heads={heads}")
    with pytest.raises(UserError, match=f"hidden_size_aug={aug} must be a positive multiple of method.num_heads={heads}"):
        method_checks(cfg, get_tasks(["sst2"]))
    # A library caller that skips the pre-flight gets a plain ValueError from the constructor.
    with pytest.raises(ValueError, match=f"hidden_size_aug={aug}"):
        build(f"method.hidden_size_aug={aug}", f"method.num_heads={heads}")


def test_paper_setup_anneals_from_one_to_point_two():
    cfg = make_cfg("+experiment=pals_glue")
    assert (cfg.backbone.name, cfg.method.name, cfg.schedule.name) == ("bert_base", "pals", "annealed")
    per_epoch = epoch_length(cfg.train, len(cfg.task.names), per_pass=10**6)
    assert len(cfg.task.names) == 8 and per_epoch == 300 * 8
    assert (cfg.train.learning_rate, cfg.train.batch_size, cfg.train.warmup_ratio) == (2e-5, 32, 0.1)
    assert cfg.train.eval_per_epoch and cfg.train.eval_every == 0 and cfg.data.max_seq_length == 128
    # Epochs as the runner counts them: num_epochs x steps_per_epoch steps, cut into epochs.
    total = math.ceil(cfg.train.num_epochs * per_epoch)
    sizes = {"cola": 8551, "sst2": 67349, "mrpc": 3668, "stsb": 5749, "qqp": 363846, "mnli": 392702,
             "qnli": 104743, "rte": 2490}
    sampler = TaskSampler(cfg.schedule, sizes, per_epoch, total, cfg.seed)
    table = sampler.table()
    assert len(table) == 25 and sampler.epoch_of(total - 1) == 25
    assert table[0]["alpha"] == pytest.approx(1.0) and table[-1]["alpha"] == pytest.approx(0.2)
    assert table[0]["rte"] == pytest.approx(2490 / sum(sizes.values()))
    z = sum(n ** 0.2 for n in sizes.values())
    assert table[-1]["rte"] == pytest.approx(2490 ** 0.2 / z)
    # Draws in the last epoch follow that epoch's probabilities (within 4 standard errors).
    draws = [sampler.task(s) for s in range(total - 2400, total)]
    for t, p in table[-1].items():
        if t in sizes:
            assert abs(draws.count(t) / 2400 - p) < 4 * math.sqrt(p * (1 - p) / 2400) + 1e-9, t


@pytest.mark.parametrize("names,steps", [("[mrpc,rte]", 600), ("[sst2,mrpc,rte]", 900), ("[rte]", 77)])
def test_paper_setup_epoch_follows_the_task_list(names, steps):
    # 300 x n_tasks steps per epoch whatever the task list (one task: one pass over its data, 77 here).
    cfg = make_cfg("+experiment=pals_glue", f"task.names={names}")
    assert epoch_length(cfg.train, len(cfg.task.names), per_pass=77) == steps
    # An explicit train.steps_per_epoch (the old key) still wins for several tasks.
    cfg = make_cfg("+experiment=pals_glue", f"task.names={names}", "train.steps_per_epoch=8")
    assert epoch_length(cfg.train, len(cfg.task.names), per_pass=77) == (8 if steps != 77 else 77)


@pytest.mark.slow  # a BERT-base-sized model
def test_bert_base_parameter_accounting(mlflow_uri, capsys):
    from deepen_run.run.preflight import check
    from deepen_run.run.runner import run

    cfg = make_cfg("method=pals", "task=glue", "backbone=bert_base", "backbone.pretrained=false", "dry_run=true",
                   f"tracking.uri={mlflow_uri}")
    run(cfg, check(cfg))
    _, (r,) = runs_of(mlflow_uri)
    m = r.data.metrics
    assert m["params/backbone"] == 109_482_240
    assert m["params/method"] == 14_558_688 == 8 * 1_819_836
    assert 1.132 <= m["params/ratio"] <= 1.134
    assert m["params/trainable"] == m["params/total"]  # the paper fine-tunes everything
    assert "method 14,558,688" in capsys.readouterr().out
