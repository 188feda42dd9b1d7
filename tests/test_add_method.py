"""Adding a method touches its folder and one registry line, nothing else: done here to a copy of the
package, then run through the real CLI (a dry run and a few training steps on the tiny backbone)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import HANG, isolated, runs_of
from deepen_run.config.schema import ROOT

CONFIG = '''
from dataclasses import dataclass


@dataclass
class Config:
    """method=toy: the baseline plus a bias inside the backbone's embeddings.

    name: the method (set by method=<option>)
    scale: initial value of the bias
    """
    name: str = "toy"
    scale: float = 0.0
'''
MODEL = '''
import torch

from deepen_run.methods.contract import Output
from deepen_run.methods.toy.config import Config  # noqa: F401
from deepen_run.model.heads import EncoderClassifier


class Toy(EncoderClassifier):
    def __init__(self, backbone, tasks, scale):
        super().__init__(backbone, tasks)
        emb = backbone.embeddings
        emb.toy_bias = torch.nn.Parameter(torch.full((backbone.config.hidden_size,), scale))
        emb.register_forward_hook(lambda m, i, out: out + m.toy_bias)

    def new_parameters(self):
        return [*super().new_parameters(), self.backbone.embeddings.toy_bias]


def build(backbone, cfg, tasks):
    return Toy(backbone, tasks, cfg.scale)
'''


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_method_added_as_a_folder_and_one_registry_line_runs(tmp_path, glue_dir):
    pkg = tmp_path / "src" / "deepen_run"
    shutil.copytree(ROOT / "deepen_run", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "conf", tmp_path / "src" / "conf")
    (pkg / "methods" / "toy").mkdir()
    (pkg / "methods" / "toy" / "__init__.py").write_text("")
    (pkg / "methods" / "toy" / "config.py").write_text(CONFIG)
    (pkg / "methods" / "toy" / "model.py").write_text(MODEL)
    reg = pkg / "methods" / "__init__.py"
    text = reg.read_text()
    assert text.count('FOLDERS = ("baseline", "hire", "pals"') == 1
    reg.write_text(text.replace('FOLDERS = ("baseline", "hire", "pals"', 'FOLDERS = ("baseline", "hire", "pals", "toy"'))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src"), "OMP_NUM_THREADS": "1"}
    exe = str(Path(sys.executable).with_name("deepen-run"))
    args = isolated(["method=toy", "method.scale=0.5", "backbone=tiny", "task=rte", "train.max_steps=2",
                     "train.new_params_lr_scale=10", "data.max_eval_samples=8", f"data.glue_dir={glue_dir}"])
    r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=HANG, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    uri = next(a.split("=", 1)[1] for a in args if a.startswith("tracking.uri="))
    _, runs = runs_of(uri)
    run = runs[-1]
    assert run.info.status == "FINISHED" and run.data.params["method.name"] == "toy"
    assert run.data.params["method.scale"] == "0.5"
    # The bias sits inside the backbone, yet counts as the method's: params/method = the hidden size.
    hidden = yaml.safe_load((ROOT / "conf" / "backbone" / "tiny.yaml").read_text())["hidden_size"]
    assert run.data.metrics["params/method"] == hidden
