"""Every kind of bad input: one line naming the culprit, a non-zero exit, no traceback, no run
left RUNNING, and nothing from the failed attempt in its run dir but its log."""
import shutil
from pathlib import Path

import pytest

from conftest import cli
from deepen_run.methods import METHODS

pytestmark = pytest.mark.slow  # one deepen-run process per case


def tsv_dir(tmp: Path, name: str, train: str, dev: str = "sentence\tlabel\ngood\t1\n") -> str:
    root = tmp / name
    (root / "SST-2").mkdir(parents=True)
    (root / "SST-2" / "train.tsv").write_text(train)
    (root / "SST-2" / "dev.tsv").write_text(dev)
    return str(root)


def needs(method: str):
    return pytest.mark.skipif(method not in METHODS, reason=f"method={method} is not registered on this branch yet")


GOOD = "sentence\tlabel\ngood\t1\nbad\t0\n"
CASES = [
    ("unknown-option", ["backbone=nope"], "backbone/nope"),
    ("unknown-key", ["train.learning_rat=1e-3"], "learning_rat"),
    ("wrong-type", ["train.batch_size=many"], "train.batch_size"),
    ("negative-lr", ["train.learning_rate=-1e-5"], "train.learning_rate"),
    ("zero-lr", ["train.learning_rate=0"], "train.learning_rate"),
    ("zero-batch", ["train.batch_size=0"], "train.batch_size"),
    ("no-glue-dir", ["data.glue_dir=/no/such/glue"], "/no/such/glue"),
    ("task-files-missing", ["task=qnli"], "QNLI/train.tsv"),
    ("wrong-columns", ["data.glue_dir={cols}"], "SST-2/train.tsv:3"),
    ("label-outside-set", ["data.glue_dir={label}"], "SST-2/train.tsv:3: label '7'"),
    ("empty-split", ["data.glue_dir={empty}"], "SST-2/dev.tsv"),
    pytest.param("duplicate-out-of-range", ["method=duplicate", "method.layers=[0,99]"], "99",
                 marks=needs("duplicate"), id="duplicate-out-of-range"),
    pytest.param("gru-layers-zero", ["method=hire", "method.gru_layers=0"], "gru_layers", marks=needs("hire"),
                 id="gru-layers-zero"),
    ("unknown-task-in-list", ["task.names=[sst2,nope]"], "'nope'"),
    ("unreachable-tracking", ["tracking.uri=http://127.0.0.1:1"], "http://127.0.0.1:1"),
    ("offline-backbone", ["backbone=roberta_base"], "FacebookAI/roberta-base"),
    ("resume-nothing", ["resume=/no/such/run"], "/no/such/run"),
]


@pytest.mark.parametrize("case,overrides,culprit", [c if hasattr(c, "marks") else pytest.param(*c, id=c[0])
                                                    for c in CASES])
def test_bad_input(case, overrides, culprit, glue_dir, tmp_path):
    dirs = {"cols": tsv_dir(tmp_path, "cols", "sentence\tlabel\ngood\t1\nonly-one-column\n"),
            "label": tsv_dir(tmp_path, "label", "sentence\tlabel\ngood\t1\nbad\t7\n"),
            "empty": tsv_dir(tmp_path, "empty", GOOD, dev="sentence\tlabel\n")}
    run_dir = tmp_path / "outputs" / "runs" / "attempt"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = ["backbone=tiny", f"data.glue_dir={glue_dir}", f"tracking.uri={uri}", f"hydra.run.dir={run_dir}"]
    args += [o.format(**dirs) for o in overrides]
    r = cli(*args, env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("deepen-run: error: ") and culprit in lines[0], lines[0]
    assert "Traceback" not in r.stderr + r.stdout
    if Path(uri[len("sqlite:///"):]).exists():
        from conftest import runs_of

        try:
            _, runs = runs_of(uri)
        except AssertionError:  # the store exists but no experiment: no run either
            runs = []
        assert not runs, [r.info.status for r in runs]
    # Composition errors stop before Hydra makes the dir; later ones leave only the log.
    left = sorted(p.name for p in run_dir.iterdir()) if run_dir.exists() else []
    assert left in ([], ["cli.log"]), left
    shutil.rmtree(tmp_path / "hf", ignore_errors=True)
