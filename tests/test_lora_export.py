"""method=lora's adapters in PEFT's own format wherever a trained model goes (issue #59): the run's
artifacts, its LoggedModel and a deepen-export each hold lora/adapters/<task>/, which
PeftModel.from_pretrained loads on the base backbone to give the run's dev predictions; a single-task
run's model folders also hold lora/merged/, which plain transformers loads. Real MiniLM runs (a real
MLflow store read back with its client); the unit contract on a tiny random model."""
from __future__ import annotations

import copy
import csv
import io
import json
from pathlib import Path

import pytest
import torch

from conftest import cli, make_cfg, token_batch
from deepen_run.data.glue import get_tasks
from deepen_run.methods import METHODS
from deepen_run.model import adapter, steps

SMALL = ["backbone=minilm", "method=lora", "train.max_steps=4", "data.max_train_samples=32", "data.max_eval_samples=12",
         "data.max_seq_length=32", "train.batch_size=8", "train.mixed_precision=no", "train.learning_rate=1e-3",
         "train.save_best=true"]  # a short run keeps no weights unless asked: no LoggedModel to export


def test_the_saved_adapter_and_merged_backbone_load_with_peft_and_transformers(tmp_path):
    from peft import PeftModel
    from transformers import AutoModel

    from deepen_run.methods.lora.export import write

    cfg = make_cfg("backbone=tiny", "method=lora", "method.rank=4")
    torch.manual_seed(0)
    backbone = steps.load(cfg)[0]
    base = copy.deepcopy(backbone).eval()
    model = METHODS["lora"].build(backbone, cfg.method, get_tasks(["rte"])).eval()
    with torch.no_grad():  # as training would move them: B away from 0
        for p in model.lora_parameters():
            p.add_(0.05 * torch.randn_like(p))
    x = adapter.inputs(backbone, **token_batch())
    model.activate("rte")
    want = backbone(**x).last_hidden_state
    assert write(model, tmp_path) is None
    loaded = PeftModel.from_pretrained(base, str(tmp_path / "adapters" / "rte")).eval()
    assert torch.allclose(loaded(**x).last_hidden_state, want, atol=1e-5)
    merged = AutoModel.from_pretrained(tmp_path / "merged").eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    assert torch.allclose(merged(**x).last_hidden_state, want, atol=1e-5)


def test_no_merged_backbone_where_transformers_would_drop_a_backbone_steps_weights(tmp_path):
    """A gated copy's gate has no place in transformers' model: from_pretrained would drop it with a
    warning and give another function, so the merged folder is not written, and the card says why."""
    from deepen_run.methods.lora.export import card, write

    cfg = make_cfg("backbone=tiny", "method=lora", "method.rank=4", "backbone.duplicate_layers=[1]",
                   "backbone.duplicate_init=gated")
    torch.manual_seed(0)
    model = METHODS["lora"].build(steps.load(cfg)[0], cfg.method, get_tasks(["rte"]))
    why = write(model, tmp_path)
    assert "gate" in why and not (tmp_path / "merged").exists()
    assert (tmp_path / "adapters" / "rte" / "adapter_model.safetensors").is_file()
    assert f"No merged backbone: {why}" in card(["rte"], why)


def lora_run(root: Path, glue_dir: str, *args: str):
    from mlflow import MlflowClient

    uri = f"sqlite:///{root}/mlflow.db"
    r = cli(*SMALL, *args, f"data.glue_dir={glue_dir}", f"tracking.uri={uri}", f"hydra.run.dir={root}/run")
    assert r.returncode == 0, r.stderr[-3000:]
    run = MlflowClient(uri).get_run(json.loads((root / "run" / "run.json").read_text())["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags.get("model_id")
    return uri, run


def places(uri: str, run, dest: Path) -> dict[str, Path]:
    """The three homes of the adapters: the run's artifacts, its LoggedModel's folder, a deepen-export."""
    from mlflow import MlflowClient

    from deepen_run.serve.export import export
    from deepen_run.tracking import models

    client = MlflowClient(uri)
    artifacts = Path(client.download_artifacts(run.info.run_id, "lora", str(dest.parent)))
    logged = models.model_files(uri, run.data.tags["model_id"])
    folder, _ = export(run.info.run_id, dest, tracking_uri=uri)
    return {"artifacts": artifacts, "logged": logged / "lora", "export": folder / "lora"}


def check_adapters(where: dict[str, Path], uri: str, run, export_dir: Path, merged: bool) -> None:
    """Per task and per home: PeftModel.from_pretrained(base MiniLM, adapter) gives the encoder output of
    the run's own model (deepen_run.load of the export) and, through the saved head, the run's dev
    predictions; the merged backbone (one task) gives the same through plain transformers."""
    from mlflow import MlflowClient
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModel, DataCollatorWithPadding

    import deepen_run
    from deepen_run.data.loaders import load_task
    from deepen_run.model import backbone as bb
    from deepen_run.model.heads import pool

    ours = deepen_run.load(export_dir, device="cpu")
    cfg = ours.cfg  # the run's own config: its dev examples, tokenized as it did
    base = bb.resolve(cfg.backbone.path)
    for spec in ours.tasks.values():
        dev = next(iter(load_task(spec, cfg.data, ours.tokenizer, cfg.seed, with_train=False).dev.values()))
        enc = DataCollatorWithPadding(ours.tokenizer)([{k: ex[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
                                                       for ex in dev])
        text = Path(MlflowClient(uri).download_artifacts(run.info.run_id, f"predictions/{spec.name}.tsv",
                                                         str(export_dir.parent))).read_text()
        rows = list(csv.DictReader(io.StringIO(text), delimiter="\t"))
        assert [int(row["idx"]) for row in rows] == list(dev["idx"])
        want = torch.tensor([float(row["prediction"]) for row in rows])
        with torch.no_grad():
            ours.model.activate(spec.name)
            theirs = ours.model.backbone(**enc).last_hidden_state
        for home, root in where.items():
            folder = root / "adapters" / spec.name
            assert json.loads((folder / "adapter_config.json").read_text())["r"] == int(run.data.params["lora.rank"])
            head = load_file(str(folder / "head.safetensors"))
            how = json.loads((folder / "head.json").read_text())["pooling"]
            encoders = [PeftModel.from_pretrained(AutoModel.from_pretrained(base), str(folder))]
            if merged and home != "artifacts":  # the run's artifacts hold no second backbone
                encoders.append(AutoModel.from_pretrained(root / "merged"))
            for encoder in encoders:
                with torch.no_grad():
                    out = encoder.eval()(**enc)
                    vec = out.pooler_output if how == "pooler" else pool(out.last_hidden_state, enc["attention_mask"], how)
                    logits = vec @ head["weight"].t() + head["bias"]
                assert torch.allclose(out.last_hidden_state, theirs, atol=1e-4), (home, spec.name)
                if spec.is_regression:
                    assert torch.allclose(logits.squeeze(-1), want, atol=1e-3), (home, spec.name)
                else:
                    assert logits.argmax(-1).tolist() == want.long().tolist(), (home, spec.name)
        assert merged == all((root / "merged").is_dir() for home, root in where.items() if home != "artifacts")


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.subprocess
def test_a_multi_task_runs_adapters_reproduce_its_dev_predictions_from_every_home(tmp_path, glue_dir):
    """deepen-run method=lora task.names=[sst2,stsb] schedule=annealed on MiniLM (issue #59's command)."""
    uri, run = lora_run(tmp_path, glue_dir, "task.names=[sst2,stsb]", "schedule=annealed")
    assert run.data.params["lora.rank_from"] == "pals_budget"
    where = places(uri, run, tmp_path / "export")
    check_adapters(where, uri, run, tmp_path / "export", merged=False)
    card = (tmp_path / "export" / "README.md").read_text()
    assert "PeftModel.from_pretrained" in card and "No merged backbone: 2 tasks" in card


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.subprocess
def test_a_single_task_runs_adapter_and_merged_backbone_reproduce_its_dev_predictions(tmp_path, glue_dir):
    from deepen_run.serve.export import export

    uri, run = lora_run(tmp_path, glue_dir, "task=rte")
    where = places(uri, run, tmp_path / "export")
    check_adapters(where, uri, run, tmp_path / "export", merged=True)
    assert "lora/merged" in (tmp_path / "export" / "README.md").read_text()
    # An export again into the same folder replaces the files it wrote in lora/; a user's file there stays.
    mine = tmp_path / "export" / "lora" / "adapters" / "old" / "mine.txt"
    mine.parent.mkdir()
    mine.write_text("mine\n")
    export(run.info.run_id, tmp_path / "export", tracking_uri=uri)
    assert mine.read_text() == "mine\n" and (tmp_path / "export" / "lora" / "merged" / "config.json").is_file()
    assert "lora" in json.loads((tmp_path / "export" / "deepen_run.json").read_text())["files"]
