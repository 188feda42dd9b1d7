"""The trained model as a product (docs/use-a-model.md): a run that keeps weights leaves an MLflow 3
LoggedModel (linked to its eval/* scores, its weights stored once) and its GLUE files as dataset
inputs; deepen-predict and deepen_run.load give back what the run predicted; deepen-export writes a
folder that transformers loads (a plain classifier) or deepen_run.load loads (any model);
deepen-report --register names the best run `champion`; bad input is one line and exit 2.

Two real runs, shared by the module: a short MiniLM HIRE run on SST-2 (the full dev set, so its
predictions/sst2.tsv covers every dev sentence) and a tiny PALs run on SST-2 + MRPC; a tiny run that
keeps no weights for the refusals. The transformers round trip builds its tiny models in process.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import HANG, cli, make_cfg
import forkserver

ENV = {"OMP_NUM_THREADS": "1", "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "1"}
SMALL = ["data.max_train_samples=200", "data.max_seq_length=64", "train.save_best=true"]


def run_once(root: Path, glue_dir: str, *args: str) -> NS:
    uri = f"sqlite:///{root}/store/mlflow.db"
    r = cli(*args, f"data.glue_dir={glue_dir}", f"tracking.uri={uri}", f"hydra.run.dir={root}/run", env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    run_id = json.loads((root / "run" / "run.json").read_text())["run_id"]
    return NS(root=root, uri=uri, run_dir=root / "run", run_id=run_id, client=MlflowClient(uri), out=r.stdout)


@pytest.fixture(scope="module")
def hire(glue_dir, tmp_path_factory):
    return run_once(tmp_path_factory.mktemp("hire"), glue_dir, "backbone=minilm", "method=hire", "task=sst2",
                    *SMALL, "train.max_steps=4", "train.batch_size=16", "seed=3")


@pytest.fixture(scope="module")
def pals(glue_dir, tmp_path_factory):
    return run_once(tmp_path_factory.mktemp("pals"), glue_dir, "backbone=tiny", "method=pals",
                    "task.names=[sst2,mrpc]", *SMALL, "data.max_eval_samples=64", "train.max_steps=4",
                    "train.batch_size=8", "tracking.system_metrics=true")


def tool(name: str, *args: str) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", f"deepen_run.cli.{name}", *args], timeout=HANG,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def tsv(path: Path) -> list[list[str]]:
    with open(path, newline="") as fh:
        return list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))


def run_predictions(r: NS, name: str) -> dict[int, str]:
    local = r.client.download_artifacts(r.run_id, f"predictions/{name}.tsv", str(r.root))
    return {int(row[0]): row[1] for row in tsv(Path(local))[1:]}


def dev_rows(glue_dir: str, spec) -> list:
    """The dev file's texts by row (the idx of predictions/<task>.tsv)."""
    from deepen_run.serve.table import read_tsv

    return read_tsv(Path(glue_dir) / spec.folder / "dev.tsv", spec)[1]


@pytest.mark.e2e
def test_predict_on_the_dev_set_gives_the_runs_predictions(hire, glue_dir, tmp_path):
    r = tool("predict", "--run", hire.run_id, "--tracking-uri", hire.uri, "a gorgeous, witty film")
    assert r.returncode == 0, r.stderr[-3000:]
    head, row = [line.split("\t") for line in r.stdout.strip().splitlines()]
    assert head[:4] == ["idx", "prediction", "label", "probability"] and row[2] in ("negative", "positive")
    assert 0.5 <= float(row[3]) <= 1
    # HIRE's layer importances, a column a layer, named as the run's metrics name them (hire/sst2/layer_3)
    layers = sorted(k.split("/")[-1] for k in MlflowClient(hire.uri).get_run(hire.run_id).data.metrics
                    if k.startswith("hire/sst2/layer_"))
    assert layers and sorted(h.removeprefix("alpha/") for h in head if h.startswith("alpha/")) == layers
    out = tmp_path / "dev.tsv"  # the rest through the command's main in this process (no second start-up)
    from deepen_run.cli.predict import main as predict_main

    predict_main(["--run", str(hire.run_dir), "--tsv", f"{glue_dir}/SST-2/dev.tsv", "--out", str(out)])
    mine = {int(row[0]): row[1] for row in tsv(out)[1:]}
    theirs = run_predictions(hire, "sst2")
    assert len(theirs) == 872 and mine == theirs


@pytest.mark.e2e
def test_the_logged_model_is_listed_with_its_scores_and_stored_once(hire):
    import mlflow

    run = hire.client.get_run(hire.run_id)
    mlflow.set_tracking_uri(hire.uri)
    try:
        (model,) = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], output_format="list")
    finally:
        mlflow.set_tracking_uri(None)
    assert model.source_run_id == hire.run_id and run.data.tags["model_id"] == model.model_id
    assert {k: model.tags[k] for k in ("method", "backbone", "task")} == {"method": "hire", "backbone": "minilm",
                                                                        "task": "sst2"}
    scores = {m.key: m.value for m in model.metrics}
    assert scores["eval/score"] == run.data.metrics["eval/score"] and "eval/sst2/accuracy" in scores
    assert len(hire.client.get_metric_history(hire.run_id, "eval/score")) == 1  # linked, not logged twice
    assert [o.model_id for o in run.outputs.model_outputs] == [model.model_id]
    # One copy of the weights in everything the run wrote (store, artifacts, run dir), hard links counted once.
    weights = (hire.run_dir / "checkpoints/best/model.safetensors").stat().st_size
    seen, total = set(), 0
    for f in hire.root.rglob("*"):
        st = f.lstat()
        if f.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    assert weights > 50e6 and total < 1.3 * weights, (total, weights)
    import deepen_run

    m = deepen_run.load(f"models:/{model.model_id}", tracking_uri=hire.uri)
    assert m.info["run_id"] == hire.run_id and list(m.tasks) == ["sst2"] and "sst2" in m.heads


@pytest.mark.e2e
def test_every_run_records_its_glue_files_as_dataset_inputs(hire, pals, glue_dir):
    for r, files in ((hire, ["SST-2/train", "SST-2/dev"]), (pals, ["SST-2/train", "SST-2/dev", "MRPC/train",
                                                                   "MRPC/dev"])):
        got = {(d.dataset.name, d.dataset.digest, json.loads(d.dataset.source)["uri"], d.tags[0].value)
               for d in r.client.get_run(r.run_id).inputs.dataset_inputs}
        want = set()
        for f in files:
            path = Path(glue_dir, f + ".tsv").resolve()
            task = {"SST-2": "sst2", "MRPC": "mrpc"}[f.split("/")[0]]
            want.add((f"{task}/{path.stem}", hashlib.sha256(path.read_bytes()).hexdigest()[:32], str(path),
                      "train" if path.stem == "train" else "dev"))
        assert got == want


@pytest.mark.e2e
def test_system_metrics_on_request(pals, hire):
    assert any(k.startswith("system/") for k in pals.client.get_run(pals.run_id).data.metrics)
    assert not any(k.startswith("system/") for k in hire.client.get_run(hire.run_id).data.metrics)  # off by default


@pytest.mark.e2e
def test_hire_and_pals_exports_load_back_and_predict_what_the_runs_did(hire, pals, glue_dir, tmp_path):
    import deepen_run
    from deepen_run.data.glue import TASKS

    from deepen_run.serve.export import export

    for r, tasks in ((hire, ["sst2"]), (pals, ["sst2", "mrpc"])):
        dest = tmp_path / r.root.name
        if r is hire:  # the command once; the function (what it calls) for the other
            mine = tmp_path / f"{dest.name}.tmp" / "notes.txt"  # a user's folder beside it: never touched
            mine.parent.mkdir()
            mine.write_text("mine")
            done = tool("export", r.run_id, str(dest), "--tracking-uri", r.uri)
            assert done.returncode == 0 and "deepen_run.load" in done.stdout, done.stderr[-3000:]
            assert mine.read_text() == "mine" and not list(tmp_path.glob(".*.tmp"))
        else:
            assert export(r.run_dir, dest)[1] is None
        card = (dest / "README.md").read_text()
        assert "With deepen-run only" in card and "eval/score" in card and "deepen_run.load(FOLDER)" in card
        assert (dest / "model.safetensors").is_file() and (dest / "tokenizer.json").is_file()
        m = deepen_run.load(dest)
        # The run's own precision and attention, as its machine resolved mixed_precision=auto (params)
        params = MlflowClient(r.uri).get_run(r.run_id).data.params
        info = json.loads((dest / "deepen_run.json").read_text())
        assert m.precision == info["precision"] == params["train/precision"]
        assert (info["attention"] or "default") == params["train/attention"]
        for task in tasks:
            theirs = run_predictions(r, task)
            rows = dev_rows(glue_dir, TASKS[task])
            idx = sorted(theirs)[:48]
            preds = m.predict([rows[i] for i in idx], task=task)
            assert [str(p.label_id) for p in preds] == [theirs[i] for i in idx], task
    # What the run recorded wins over what this machine would pick for its config (another machine's run)
    from deepen_run.precision import resolve_precision

    other = "no" if resolve_precision("auto") != "no" else "bf16"
    kernel = "sdpa" if info["attention"] != "sdpa" else "eager"
    (dest / "deepen_run.json").write_text(json.dumps(info | {"precision": other, "attention": kernel}))
    again = deepen_run.load(dest)
    assert again.precision == other and again.model.backbone.config._attn_implementation == kernel


def test_the_end_of_run_predict_hint_works_as_printed(pals):
    """The summary's deepen-predict line names the task of a multi-task model (it once failed with
    "this model has 2 tasks"), and a pair for a pair task."""
    import shlex

    from deepen_run.serve.table import predict_args

    (hint,) = re.findall(r"\(deepen-predict --run (\S+) (.*?); docs/use-a-model.md\)", pals.out)
    # the test's own store, not the default one: the hint names it (it once did not)
    assert hint[0] == pals.run_id and hint[1].startswith(f"--tracking-uri {pals.uri} --task sst2 ")
    r = tool("predict", "--run", hint[0], *shlex.split(hint[1]))
    assert r.returncode == 0 and r.stdout.count("\n") == 2, r.stderr[-2000:]  # a header and the sentence's row
    assert predict_args("rte") == '--pair "a sentence" "another"' and predict_args("sst2") == '"a sentence"'


@pytest.mark.e2e
def test_register_names_the_best_run_champion(hire, capsys):
    """deepen-report's main in this process (tests/test_report.py runs the command itself)."""
    from deepen_run.report.main import main as report_main

    # A sweep's parent in the same store (no task tag) is no row's run: it once crashed --register.
    exp = hire.client.get_experiment_by_name("deepen-run").experiment_id
    parent = hire.client.create_run(exp, tags={"sweep_role": "parent", "sweep_id": "s1"}).info.run_id
    hire.client.set_terminated(parent, "FINISHED")
    try:
        report_main(["--uri", hire.uri, "--register", "sst2-hire"])
    finally:
        hire.client.delete_run(parent)
    assert "as sst2-hire version 1, alias champion" in capsys.readouterr().out
    mv = hire.client.get_model_version_by_alias("sst2-hire", "champion")
    assert mv.run_id == hire.run_id
    import deepen_run

    assert deepen_run.load("models:/sst2-hire@champion", tracking_uri=hire.uri).info["run_id"] == hire.run_id
    # A name an MLflow prompt holds is no model to add a version to: one line, nothing registered.
    hire.client.register_prompt("sst2-prompt", "Classify: {{text}}")
    with pytest.raises(SystemExit) as e:
        report_main(["--uri", hire.uri, "--register", "sst2-prompt"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.strip().splitlines()[-1].startswith("deepen-report: error: --register "
                                                                         "'sst2-prompt': "), err[-2000:]
    assert "taken by a prompt" in err
    assert hire.client.search_model_versions("name='sst2-prompt'") == []


def tiny_bundle(folder: Path, *overrides: str) -> Path:
    """A model folder of a freshly built tiny model (no training: the round trip is about the format)."""
    from safetensors.torch import save_model

    from deepen_run.methods import METHODS
    from deepen_run.model import steps
    from deepen_run.data.glue import get_tasks
    from deepen_run.serve import bundle

    cfg = make_cfg("backbone=tiny", "task=sst2", "data.max_seq_length=64", *overrides)
    torch.manual_seed(0)
    backbone, _, _ = steps.load(cfg)
    model = METHODS[cfg.method.name].build(backbone, cfg.method, get_tasks(list(cfg.task.names)))
    with torch.no_grad():  # a trained-looking head: zero-initialised biases would hide a mapping slip
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    bundle.write_meta(folder, bundle.model_config(cfg), {"method": cfg.method.name, "backbone": cfg.backbone.name,
                                                         "tasks": list(cfg.task.names)},
                      bundle.pristine_backbone_config(cfg.backbone))
    save_model(model, str(folder / bundle.WEIGHTS))
    return folder


@pytest.mark.parametrize("overrides,plain", [
    ([], True),
    (["backbone.duplicate_layers=[0,1]"], True),
    # pooling=pooler: RoBERTa's own default (auto) reads <s> through no dense layer, which its head has
    (["backbone.model_type=roberta", "backbone.max_position_embeddings=130", "method.pooling=pooler"], True),
    (["backbone.duplicate_layers=[1]", "backbone.duplicate_init=gated"], False),  # a gate: no HF slot
    (["method.pooling=mean"], False),
])
def test_a_plain_classifier_exports_to_transformers_with_the_same_logits(tmp_path, glue_dir, overrides, plain):
    import deepen_run
    from deepen_run.data.glue import TASKS
    from deepen_run.serve.export import export
    from transformers import AutoModelForSequenceClassification

    src = tiny_bundle(tmp_path / "model", *overrides)
    dest, hf_class = export(src, tmp_path / "export")
    texts = dev_rows(glue_dir, TASKS["sst2"])[:32]
    ours_m, original_m = deepen_run.load(dest, device="cpu"), deepen_run.load(src, device="cpu")
    ours_m.precision = original_m.precision = "no"  # full fp32, as transformers computes
    ours, _ = ours_m.forward(texts)
    original, _ = original_m.forward(texts)
    assert torch.allclose(ours, original, atol=1e-6, rtol=0)
    card = (dest / "README.md").read_text()
    assert "Precision: " in card  # the card says what deepen_run.load predicts in (card.precision_note)
    if not plain:
        assert hf_class is None and "With deepen-run only" in card
        return
    assert hf_class.endswith("ForSequenceClassification") and "AutoModelForSequenceClassification" in card
    model = AutoModelForSequenceClassification.from_pretrained(dest).eval()
    m = deepen_run.load(dest, device="cpu")
    with torch.no_grad():
        enc = m.tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
        theirs = model(**enc).logits
    assert theirs.shape == (32, 2) and (theirs - ours).abs().max() < 1e-5


@pytest.fixture(scope="module")
def no_weights(glue_dir, tmp_path_factory):
    return run_once(tmp_path_factory.mktemp("bare"), glue_dir, "backbone=tiny", "task=sst2", "data.max_train_samples=32",
                    "data.max_eval_samples=32", "data.max_seq_length=32", "train.max_steps=1")


@pytest.mark.subprocess
def test_bad_input_is_one_line_and_exit_2(no_weights, pals, tmp_path, capsys):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep me")
    empty = tmp_path / "empty.tsv"
    empty.write_text("sentence\tlabel\n")  # a header, no rows
    cases = [
        (("predict", "--run", "0123abcd", "--tracking-uri", no_weights.uri, "x"), "no run '0123abcd'"),
        (("predict", "--run", no_weights.run_id, "--tracking-uri", no_weights.uri, "x"), "kept no weights"),
        (("predict", "--run", str(pals.run_dir), "--task", "sst2", "--pair", "a", "b"),
         "input 1 is a sentence pair, but sst2 takes one sentence"),
        (("predict", "--run", str(pals.run_dir), "x"), "this model has 2 tasks"),
        (("export", str(pals.run_dir), str(user)), "holds files of its own"),
        (("predict", "--run", str(pals.run_dir), "--task", "sst2", "--tsv", str(empty)), "holds no rows to predict"),
        (("predict", "--run", str(pals.run_dir), "--task", "sst2", "--device", "foo", "x"), "device 'foo' is not usable"),
        (("predict", "--run", str(pals.run_dir), "--task", "sst2", "--device", "cuda:99", "x"),
         "device 'cuda:99' is not usable"),
        # refused before the model runs, not after (its predictions lost to a traceback)
        (("predict", "--run", str(pals.run_dir), "--task", "sst2", "--out", str(user), "x"), "is a folder; name a file"),
        (("predict", "--run", str(pals.run_dir), "--task", "sst2", "--out", str(user / "notes.txt" / "p.tsv"), "x"),
         "is a file, not a folder"),
        (("export", str(pals.run_dir), str(user / "notes.txt" / "sub")), "is a file, not a folder"),
    ]
    # Two cases as the commands a user types (a process each, about 3 s of imports); the others call
    # the same main() in this process, which the refusal leaves with the same exit and line.
    from deepen_run.cli import export as export_cli, predict as predict_cli

    for n, (args, culprit) in enumerate(cases):
        if n in (0, 4):
            r = tool(*args)
            code, err = r.returncode, r.stderr
        else:
            with pytest.raises(SystemExit) as e:
                {"predict": predict_cli, "export": export_cli}[args[0]].main(list(args[1:]))
            code, err = e.value.code, capsys.readouterr().err
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and culprit in lines[0], (args, err[-2000:])
    assert (user / "notes.txt").read_text() == "keep me" and len(list(user.iterdir())) == 1


def test_an_export_into_the_current_folder_truncates_as_its_run_and_predicts_nothing_from_nothing(tmp_path,
                                                                                                  monkeypatch):
    """`deepen-export RUN .` from an empty folder; transformers' tokenizer of the export cuts at the run's
    data.max_seq_length (64), not the backbone's 512, so a long input gets the run's logits; an empty
    list of texts predicts an empty list."""
    import deepen_run
    from deepen_run.serve.export import export
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    src = tiny_bundle(tmp_path / "model")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    dest, hf_class = export(src, Path("."))
    assert dest == here and hf_class and "model.safetensors" in os.listdir(".")  # the shell's folder, not a new one
    tok = AutoTokenizer.from_pretrained(here)
    assert tok.model_max_length == 64
    long_text = " ".join(["a gorgeous, witty, seductive film"] * 30)
    m = deepen_run.load(here, device="cpu")
    m.precision = "no"
    ours, _ = m.forward([long_text])
    with torch.no_grad():
        theirs = AutoModelForSequenceClassification.from_pretrained(here).eval()(**tok([long_text], truncation=True,
                                                                                       return_tensors="pt")).logits
    assert (theirs - ours).abs().max() < 1e-5
    assert m.predict([]) == []


def test_a_new_export_over_an_earlier_one_keeps_the_users_files(tmp_path):
    """The earlier export listed its files: they are replaced, a note the user put beside them stays. A
    model folder that lists none (a run's, or an older export) is refused: its files and a user's
    cannot be told apart."""
    import json

    from deepen_run.errors import UserError
    from deepen_run.serve import bundle
    from deepen_run.serve.export import export

    src = tiny_bundle(tmp_path / "model")
    dest, _ = export(src, tmp_path / "export")
    listed = json.loads((dest / bundle.INFO).read_text())["files"]
    assert sorted(p.name for p in dest.iterdir()) == listed and "model.safetensors" in listed
    (dest / "notes.txt").write_text("mine\n")
    dest, _ = export(src, dest)
    assert (dest / "notes.txt").read_text() == "mine\n"
    assert sorted(p.name for p in dest.iterdir()) == sorted([*listed, "notes.txt"])
    with pytest.raises(UserError, match="does not list its files"):
        export(src, src)


def test_the_model_card_states_the_precision_deepen_run_load_predicts_in():
    from deepen_run.serve.card import precision_note

    bf16 = precision_note("bf16", plain=True)
    assert "predicts in bf16" in bf16 and "fp32" in bf16 and "can differ" in bf16 and 'm.precision = "no"' in bf16
    assert "transformers" not in precision_note("bf16", plain=False)
    assert precision_note("no", plain=True).startswith("Precision: fp32") and "1e-5" in precision_note("no", True)
