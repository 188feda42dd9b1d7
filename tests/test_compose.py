"""Layer duplication as a backbone step (backbone.duplicate_layers) under every registered method:
the forward pass, what trains, the parameter accounting (tiny random BERT); the bad-input checks;
method=duplicate == baseline on a duplicated backbone (real MiniLM, real GLUE); and the one-parent
grid over GRU depth x duplicated layers."""
import csv

import pytest
import torch

from conftest import HANG, cli, make_cfg, runs_of, token_batch
from deepen_run.model import backbone as bb
from deepen_run.model import duplication
from deepen_run.errors import UserError
from deepen_run.data.glue import get_tasks
from deepen_run.model.layers import sources
from deepen_run.methods import METHODS
from deepen_run.methods.pals.model import pal_params_per_task
from deepen_run.model.heads import count, param_report
from deepen_run.run.preflight import check

TASKS = ["sst2", "stsb", "rte"]
DUP = [1, 1]  # tiny has 2 layers: layer 1 gets two copies -> 4 layers, sources [0, 1, 1, 1]


def build(method: str, *extra, dup=DUP):
    """As runner.run: load, count, duplicate, build, account."""
    cfg = make_cfg("backbone=tiny", f"method={method}", f"task.names=[{','.join(TASKS)}]",
                   f"backbone.duplicate_layers=[{','.join(map(str, dup))}]", *extra)
    torch.manual_seed(0)
    backbone = bb.load_model(cfg.backbone)
    n = count(backbone)
    duplication.apply(backbone, cfg)
    model = METHODS[method].build(backbone, cfg.method, get_tasks(TASKS))
    return model, param_report(model, n, count(backbone) - n), cfg


def layer_size(cfg) -> int:
    return count(bb.load_model(cfg.backbone).encoder.layer[1])


# LoRA puts its adapters inside the backbone, which this harness counts the copies by (its growth), and
# freezes the encoder: tests/test_reviewer_baselines.py covers LoRA on a deeper backbone.
@pytest.mark.parametrize("method", [m for m in METHODS if m != "lora"])
def test_every_method_runs_on_the_deeper_backbone(method):
    model, r, cfg = build(method)
    layers = model.backbone.encoder.layer
    assert len(layers) == 4 and model.backbone.config.num_hidden_layers == 4
    assert sources(model.backbone) == [0, 1, 1, 1]
    model.eval()
    for task, n in [("sst2", 2), ("stsb", 1), ("rte", 2)]:
        assert model(task, **token_batch()).logits.shape == (3, n)
    # What trains: every method here fine-tunes the encoder, copies included, exactly like their source.
    model.train()
    model("sst2", **token_batch()).logits.sum().backward()
    for pos in range(4):
        assert all(p.requires_grad for p in layers[pos].parameters())
        assert layers[pos].intermediate.dense.weight.grad is not None, f"layer {pos} got no gradient"
    assert model.heads["rte"][1].weight.grad is None
    # Accounting: the copies are params/duplicated, apart from what the method adds.
    assert r["params/duplicated"] == 2 * layer_size(cfg)
    assert r["params/backbone"] + r["params/duplicated"] + r["params/method"] + r["params/heads"] == r["params/total"]
    assert r["params/ratio"] == pytest.approx(r["params/total"] / r["params/backbone"])
    # What a method adds does not count the copies: the same as on the plain backbone, except where it
    # adds something per layer (a PAL per layer, a mix weight per hidden state), copies included.
    _, plain, _ = build(method, dup=[])
    assert plain["params/duplicated"] == 0 and plain["params/backbone"] == r["params/backbone"]
    if method in ("pals", "scalar_mix"):
        assert r["params/method"] > plain["params/method"]
    else:
        assert r["params/method"] == plain["params/method"]
    if method in ("baseline", "duplicate"):
        assert r["params/method"] == 0


@pytest.mark.parametrize("dup,depth", [([], 2), ([0], 3), ([1, 1], 4), ([0, 1, 1], 5)])
def test_pals_closed_form_counts_a_pal_per_layer_copies_included(dup, depth):
    model, r, cfg = build("pals", dup=dup)
    aug, hidden = cfg.method.hidden_size_aug, cfg.backbone.hidden_size
    assert len(model.pals["sst2"].attention) == depth
    assert r["params/method"] == len(TASKS) * pal_params_per_task(hidden, aug, depth)
    assert r["params/duplicated"] == len(dup) * layer_size(cfg)


def test_pals_route_through_the_copies():
    model, _, _ = build("pals")
    model.train()
    model("sst2", **token_batch()).logits.sum().backward()
    # The PAL of the last copy (position 3) trains: TS(h) was added inside that layer.
    assert model.pals["sst2"].attention[3].qkv.weight.grad is not None
    assert model.pals["rte"].attention[3].qkv.weight.grad is None


def test_hire_reads_and_labels_the_copies():
    model, _, _ = build("hire")
    # hidden_states 0..4 = embeddings, layer 1, layer 2, its copies; the last (2'') is R, the rest feed the extractor.
    assert model.layer_ids == [1, 2, 3]
    assert model.layer_labels == ["1", "2", "2'"]
    assert model.layer_names == ["layer_1", "layer_2", "layer_2_copy1"]
    model.eval()
    alpha = model("sst2", **token_batch()).extras["alpha"]
    assert alpha.shape == (3, 3) and torch.allclose(alpha.sum(-1), torch.ones(3))
    model, _, _ = build("hire", "method.include_embeddings=true", dup=[0, 0, 1])
    assert model.layer_labels == ["0", "1", "1'", "1''", "2"]
    assert model.layer_names[3] == "layer_1_copy2"


def test_duplicate_method_is_the_baseline_on_a_duplicated_backbone():
    # Same seed, same RNG order (duplication draws nothing, heads after): the very same weights.
    old = make_cfg("backbone=tiny", "method=duplicate", "method.layers=[0,1]")
    new = make_cfg("backbone=tiny", "method=baseline", "backbone.duplicate_layers=[0,1]")
    models = []
    for cfg in (old, new):
        torch.manual_seed(3)
        backbone = bb.load_model(cfg.backbone)
        duplication.apply(backbone, cfg)
        models.append(METHODS[cfg.method.name].build(backbone, cfg.method, get_tasks(["sst2"])))
    a, b = (m.state_dict() for m in models)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bad_indices_fail_in_the_preflight_for_every_method(glue_dir):
    for method in METHODS:
        cfg = make_cfg("backbone=minilm", f"method={method}", "backbone.duplicate_layers=[2,6]",
                       f"data.glue_dir={glue_dir}")
        with pytest.raises(UserError, match=r"backbone.duplicate_layers=\[2, 6\]: \[6\] out of range.*0\.\.5"):
            check(cfg)
    cfg = make_cfg("backbone=minilm", "method=duplicate", "method.layers=[1]", "backbone.duplicate_layers=[2]",
                   f"data.glue_dir={glue_dir}")
    with pytest.raises(UserError, match="both set"):
        check(cfg)
    with pytest.raises(UserError, match="backbone.cosine_samples=0"):
        check(make_cfg("backbone.cosine_samples=0", f"data.glue_dir={glue_dir}"))


@pytest.mark.fresh_store
def test_bad_indices_cli_one_line_exit_2_no_run(tmp_path, glue_dir):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    r = cli("method=hire", "backbone=minilm", "backbone.duplicate_layers=[-1]", f"data.glue_dir={glue_dir}",
            f"tracking.uri={uri}", f"hydra.run.dir={tmp_path}/run")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "deepen-run: error: backbone.duplicate_layers=[-1]: [-1] out of range; this backbone has 6 layers, "
        "valid indices are 0..5"]
    assert not (tmp_path / "mlflow.db").exists() or not runs_of(uri)[1]


def test_pals_dry_run_prints_the_accounting(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    r = cli("method=pals", "task=glue", "backbone=tiny", "backbone.duplicate_layers=[1]", "dry_run=true",
            f"tracking.uri={uri}", f"hydra.run.dir={tmp_path}/run")
    assert r.returncode == 0, r.stderr[-3000:]
    _, (run,) = runs_of(uri)
    m = run.data.metrics
    cfg = make_cfg("backbone=tiny", "method=pals", "task=glue")
    n_tasks = len(cfg.task.names)
    assert m["model/num_layers"] == 3
    assert m["params/method"] == n_tasks * pal_params_per_task(32, cfg.method.hidden_size_aug, 3)
    assert m["params/duplicated"] == layer_size(cfg)
    assert f"duplicated {int(m['params/duplicated']):,}" in r.stdout and "layers 3" in r.stdout


# Every metric of the two runs must be equal, whatever their values: 2 steps, 32 dev rows and 32 tokens
# still train both (train/loss, the copies' cosines, eval/*) on the 8-layer MiniLM, in less time.
MINILM = ["task=rte", "backbone=minilm", "train.max_steps=2", "train.batch_size=8",
          "data.max_train_samples=64", "data.max_eval_samples=32", "data.max_seq_length=32", "seed=7",
          "backbone.cosine_samples=16"]


@pytest.mark.e2e
def test_duplicate_method_and_baseline_on_duplicated_backbone_give_identical_metrics(tmp_path, glue_dir):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    common = [*MINILM, f"data.glue_dir={glue_dir}", f"tracking.uri={uri}"]
    old = cli("method=duplicate", "method.layers=[2,3]", *common, f"hydra.run.dir={tmp_path}/a")
    assert old.returncode == 0, old.stderr[-3000:]
    new = cli("method=baseline", "backbone.duplicate_layers=[2,3]", *[a for a in common if not a.startswith("method.")],
              f"hydra.run.dir={tmp_path}/b")
    assert new.returncode == 0, new.stderr[-3000:]
    _, (a, b) = runs_of(uri)
    assert a.data.tags["method"] == "duplicate" and b.data.tags["method"] == "baseline"
    for run in (a, b):
        assert run.data.metrics["model/num_layers"] == 8 and run.data.tags["duplicate.layers"] == "[2, 3]"
    keys = [k for k in a.data.metrics if k.startswith(("eval/", "train/loss", "duplicate/", "params/"))]
    assert "eval/rte/accuracy" in keys and "train/loss" in keys and "duplicate/cosine_before_finetune" in keys
    for k in keys:
        assert a.data.metrics[k] == b.data.metrics[k], k


@pytest.mark.e2e
def test_grid_of_gru_depth_and_duplicated_layers_is_one_parent(tmp_path, glue_dir):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    r = cli("-m", "method=hire", "method.gru_layers=1,2,3", "backbone.duplicate_layers=[],[0],[0,1]",
            "task=rte", "backbone=tiny", "train.max_steps=2", "data.max_train_samples=64",
            "data.max_eval_samples=64", "data.max_seq_length=32", "train.batch_size=8", "method.report_examples=2",
            "backbone.cosine_samples=16", f"data.glue_dir={glue_dir}", f"tracking.uri={uri}",
            f"hydra.sweep.dir={tmp_path}/sweep", timeout=HANG)
    assert r.returncode == 0, r.stderr[-3000:]
    client, runs = runs_of(uri)
    parents = [x for x in runs if x.data.tags.get("sweep_role") == "parent"]
    children = [x for x in runs if x.data.tags.get("sweep_role") == "child"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 9 and all(c.info.status == "FINISHED" for c in children)
    depth = {"[]": 2, "[0]": 3, "[0,1]": 4}  # the tiny BERT has 2 layers
    seen = set()
    for c in children:
        assert c.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        name = c.data.tags["mlflow.runName"]
        gru = next(w for w in name.split() if w.startswith("gru_layers=")).split("=")[1]
        dup = next(w for w in name.split() if w.startswith("duplicate_layers=")).split("=")[1]
        seen.add((gru, dup))
        assert c.data.params["method.gru_layers"] == gru
        assert c.data.metrics["model/num_layers"] == depth[dup]
        # HIRE's importances name the copies: layer 1 (0-based 0) copied is 1' (metric layer_1_copy1).
        assert ("hire/rte/layer_1_copy1" in c.data.metrics) == (dup != "[]")
        assert ("duplicate/cosine_before_finetune" in c.data.metrics) == (dup != "[]")
    assert seen == {(g, d) for g in "123" for d in depth}
    dup01 = next(c for c in children if "duplicate_layers=[0,1]" in c.data.tags["mlflow.runName"])
    with open(client.download_artifacts(dup01.info.run_id, "hire/importance.csv")) as fh:
        header = next(csv.reader(fh))
    # hidden_states 1..3 of 4 layers (0-based 0 and 1 copied), the last one (2') being R.
    assert header == ["task", "layer_1", "layer_1'", "layer_2"]
