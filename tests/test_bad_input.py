"""Every kind of bad input: one line naming the culprit, a non-zero exit, no traceback, no run
left RUNNING; the run dir the failed attempt made is gone, and a folder of the user's is untouched.

Permission cases (chmod) are skipped as root: root reads and writes whatever the mode bits say,
so there the bad input does not exist (the pre-flight asks os.access, which answers the same)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HANG, cli
from deepen_run.config.schema import ROOT
from deepen_run.methods import METHODS

ROOT_USER = os.geteuid() == 0
pytestmark = [pytest.mark.slow, pytest.mark.subprocess]  # each case runs the CLI


def needs(method: str):
    return pytest.mark.skipif(method not in METHODS, reason=f"method={method} is not registered on this branch yet")


def not_root(case: str):
    return pytest.mark.skipif(ROOT_USER, reason=f"{case}: root ignores permission bits (run as a non-root user)")


GOOD = "sentence\tlabel\ngood\t1\nbad\t0\n"
STSB = "index\tsentence1\tsentence2\tscore\n0\ta\tb\t{}\n"
RTE = "index\tsentence1\tsentence2\tlabel\n{}\ta\tb\tentailment\n"


class Fixtures(dict):
    """Bad GLUE folders and stores, each made only when a case names it ({name} in an override)."""

    def __init__(self, tmp: Path):
        super().__init__()
        self.tmp = tmp

    def __missing__(self, name: str) -> str:
        make = getattr(self, f"make_{name}", None)
        self[name] = str(make() if make else self.task_dir(name, *DATA[name]))
        return self[name]

    def task_dir(self, name: str, folder: str, files: dict) -> Path:
        root = self.tmp / name
        (root / folder).mkdir(parents=True)
        for stem, text in files.items():
            (root / folder / f"{stem}.tsv").write_bytes(text if isinstance(text, bytes) else text.encode())
        return root

    def make_unreadable_file(self) -> Path:
        root = self.task_dir("unreadable_file", "SST-2", {"train": GOOD, "dev": GOOD})
        (root / "SST-2" / "train.tsv").chmod(0)
        return root

    def make_unreadable_dir(self) -> Path:
        root = self.task_dir("unreadable_dir", "SST-2", {"train": GOOD, "dev": GOOD})
        (root / "SST-2").chmod(0)
        return root

    def make_file(self) -> Path:
        (self.tmp / "a-file").write_text("not a folder\n")
        return self.tmp / "a-file"

    def make_broken_link(self) -> Path:
        (self.tmp / "broken").symlink_to(self.tmp / "gone")
        return self.tmp / "broken"

    def make_ro_store(self) -> Path:
        (self.tmp / "ro").mkdir()
        (self.tmp / "ro").chmod(0o555)
        return self.tmp / "ro"

    def make_ro_db(self) -> Path:
        (self.tmp / "rodb").mkdir()
        (self.tmp / "rodb" / "mlflow.db").write_bytes(b"")
        (self.tmp / "rodb" / "mlflow.db").chmod(0o444)
        return self.tmp / "rodb" / "mlflow.db"

    def make_db_dir(self) -> Path:
        (self.tmp / "db-is-dir.db").mkdir()
        return self.tmp / "db-is-dir.db"

    def restore(self) -> None:
        for p in self.tmp.rglob("*"):  # let pytest remove what the permission cases locked
            if not p.is_symlink():
                p.chmod(0o755)


DATA = {  # fixture name -> (GLUE folder, {split: text})
    "cols": ("SST-2", {"train": "sentence\tlabel\ngood\t1\nonly-one-column\n", "dev": GOOD}),
    "label": ("SST-2", {"train": "sentence\tlabel\ngood\t1\nbad\t7\n", "dev": GOOD}),
    "empty": ("SST-2", {"train": GOOD, "dev": "sentence\tlabel\n"}),
    "not_utf8": ("SST-2", {"train": b"sentence\tlabel\ngood\t1\nb\xffd\t0\n", "dev": GOOD}),
    "superscript": ("SST-2", {"train": "sentence\tlabel\ngood\t1\nbad\t\u00b2\n", "dev": GOOD}),
    "index": ("RTE", {"train": RTE.format(0), "dev": RTE.format("x7")}),
    "stsb_nan": ("STS-B", {"train": STSB.format("nan"), "dev": STSB.format(1.0)}),
    "stsb_inf": ("STS-B", {"train": STSB.format(1.0), "dev": STSB.format("inf")}),
    "stsb_range": ("STS-B", {"train": STSB.format(7.5), "dev": STSB.format(1.0)}),
    "no_test": ("SST-2", {"train": GOOD, "dev": GOOD}),
    "bad_test": ("SST-2", {"train": GOOD, "dev": GOOD, "test": "index\tsentence\n0\tok\n1x\tbad\n"}),
}
CASES = [
    # the group's options, not Hydra's config search path
    ("unknown-option", ["backbone=nope"], "backbone=nope: no such backbone; choose one of: bert_base, "),
    ("unknown-option-with-a-slash", ["backbone=minilm/nope"], "backbone=minilm/nope: no such backbone; choose one "),
    ("unknown-key", ["train.learning_rat=1e-3"], "learning_rat"),
    ("wrong-type", ["train.batch_size=many"], "train.batch_size=many: Value 'many' of type 'str' could not be "
                                              "converted to Integer"),
    ("a-count-for-a-switch", ["train.eval_per_epoch=2"], "train.eval_per_epoch=2: train.eval_per_epoch is a switch "
                                                         "(true or false), not a number; to evaluate more often"),
    ("a-quoted-count-for-an-optional-switch", ["train.save_best='2'"], "train.save_best is a switch"),
    ("negative-lr", ["train.learning_rate=-1e-5"], "train.learning_rate"),
    ("zero-lr", ["train.learning_rate=0"], "train.learning_rate"),
    ("zero-batch", ["train.batch_size=0"], "train.batch_size"),
    ("no-glue-dir", ["data.glue_dir=/no/such/glue"], "/no/such/glue"),
    ("glue-not-cached-offline", ["data.glue_dir=null"], "GLUE is not in the Hugging Face cache"),
    ("task-files-missing", ["task=qnli"], "QNLI/train.tsv"),
    ("wrong-columns", ["data.glue_dir={cols}"], "SST-2/train.tsv:3"),
    ("label-outside-set", ["data.glue_dir={label}"], "SST-2/train.tsv:3: label '7'"),
    ("empty-split", ["data.glue_dir={empty}"], "SST-2/dev.tsv"),
    ("not-utf8", ["data.glue_dir={not_utf8}"], "SST-2/train.tsv:3: byte b'\\xff' is not UTF-8"),
    ("superscript-label", ["data.glue_dir={superscript}"], "SST-2/train.tsv:3: label '\u00b2'"),
    ("non-integer-index", ["data.glue_dir={index}", "task=rte"], "RTE/dev.tsv:2: index 'x7'"),
    ("stsb-nan-score", ["data.glue_dir={stsb_nan}", "task=stsb"], "STS-B/train.tsv:2: label 'nan'"),
    ("stsb-inf-score", ["data.glue_dir={stsb_inf}", "task=stsb"], "STS-B/dev.tsv:2: label 'inf'"),
    ("stsb-score-above-5", ["data.glue_dir={stsb_range}", "task=stsb"], "STS-B/train.tsv:2: label '7.5'"),
    ("predict-test-missing", ["data.glue_dir={no_test}", "predict=true"], "SST-2/test.tsv is missing"),
    ("predict-test-bad-row", ["data.glue_dir={bad_test}", "predict=true"], "SST-2/test.tsv:3: index '1x'"),
    pytest.param("unreadable-file", ["data.glue_dir={unreadable_file}"], "SST-2/train.tsv is not readable",
                 marks=not_root("unreadable-file"), id="unreadable-file"),
    pytest.param("unreadable-folder", ["data.glue_dir={unreadable_dir}"], "SST-2 is not readable",
                 marks=not_root("unreadable-folder"), id="unreadable-folder"),
    ("glue-dir-is-a-file", ["data.glue_dir={file}"], "a-file is a file, not a folder"),
    ("seq-length-1", ["data.max_seq_length=1"], "data.max_seq_length=1"),
    ("seq-length-beyond-positions", ["data.max_seq_length=100000"], "data.max_seq_length=100000 exceeds"),
    ("negative-seed", ["seed=-1"], "seed=-1"),
    ("seed-past-32-bits", ["seed=4294967296"], "seed=4294967296 must be in [0, 2**32 - 1]"),
    ("seq-length-7", ["data.max_seq_length=7"], "data.max_seq_length=7 must be at least 8"),
    ("unknown-scheduler", ["train.lr_scheduler=bogus"], "train.lr_scheduler='bogus'"),
    ("infinite-epochs", ["train.num_epochs=inf"], "train.num_epochs=inf"),
    ("negative-steps", ["train.max_steps=-3"], "train.max_steps=-3: give a number of steps > 0, or -1"),
    ("nan-lr", ["train.learning_rate=nan"], "train.learning_rate=nan"),
    ("negative-workers", ["data.num_workers=-1"], "data.num_workers=-1"),
    ("empty-experiment", ["tracking.experiment="], "tracking.experiment is empty"),
    pytest.param("read-only-tracking-folder", ["tracking.uri=sqlite:///{ro_store}/mlflow.db"], "ro is not writable",
                 marks=not_root("read-only-tracking-folder"), id="read-only-tracking-folder"),
    pytest.param("read-only-tracking-db", ["tracking.uri=sqlite:///{ro_db}"], "rodb/mlflow.db is read-only",
                 marks=not_root("read-only-tracking-db"), id="read-only-tracking-db"),
    ("tracking-folder-is-a-file", ["tracking.uri=sqlite:///{file}/mlflow.db"], "a-file is a file, not a folder"),
    ("tracking-folder-broken-link", ["tracking.uri=sqlite:///{broken_link}/store/mlflow.db"], "broken is a broken link"),
    ("tracking-db-is-a-folder", ["tracking.uri=sqlite:///{db_dir}"], "db-is-dir.db is a folder"),
    ("plus-unknown-key", ["+train.lr=1e-4"], "unknown config key train.lr"),
    ("plus-unknown-data-key", ["+data.max_len=64"], "unknown config key data.max_len"),
    ("top-level-typo", ["trian.max_steps=3"], "unknown config key trian (did you mean train?)"),
    pytest.param("duplicate-out-of-range", ["method=duplicate", "method.layers=[0,99]"], "99",
                 marks=needs("duplicate"), id="duplicate-out-of-range"),
    pytest.param("gru-layers-zero", ["method=hire", "method.gru_layers=0"], "gru_layers", marks=needs("hire"),
                 id="gru-layers-zero"),
    # Choice options are Enums in the schema: composition names the key and the choices.
    ("mixed-precision-typo", ["train.mixed_precision=fp8"], "[auto, no, fp16, bf16]"),
    ("pooling-typo", ["method.pooling=avg"], "method.pooling"),
    ("schedule-kind-typo", ["schedule.kind=linear"], "schedule.kind"),
    pytest.param("hire-pool-typo", ["method=hire", "method.pool=first"], "method.pool", marks=needs("hire"),
                 id="hire-pool-typo"),
    pytest.param("pals-sizes", ["method=pals", "method.num_heads=5"], "method.hidden_size_aug=204 must be a positive "
                 "multiple of method.num_heads=5", marks=needs("pals"), id="pals-sizes"),
    ("unknown-task-in-list", ["task.names=[sst2,nope]"], "'nope'"),
    ("unreachable-tracking", ["tracking.uri=http://127.0.0.1:1"], "http://127.0.0.1:1"),
    ("empty-glue-dir", ["data.glue_dir="], "data.glue_dir is empty"),  # was: the current folder, read as GLUE
    # no driver installed (or none listening): one line, the password masked, not a traceback
    ("database-store", ["tracking.uri=postgresql://u:s3cret@127.0.0.1:1/db"], "u:***@127.0.0.1:1/db: cannot open"),
    ("offline-backbone", ["backbone=roberta_base"], "FacebookAI/roberta-base"),
    ("resume-nothing", ["resume=/no/such/run"], "/no/such/run"),
]


def hub_env(case: str, tmp_path: Path) -> dict | None:
    """The offline Hub backbone gets an empty Hub cache, so that a model a developer's own cache holds
    cannot be found; the other cases never reach the Hub (the suite runs with HF_HUB_OFFLINE=1)."""
    return {"HF_HOME": str(tmp_path / "hf")} if case == "offline-backbone" else None


@pytest.mark.parametrize("case,overrides,culprit", [c if hasattr(c, "marks") else pytest.param(*c, id=c[0])
                                                    for c in CASES])
def test_bad_input(case, overrides, culprit, glue_dir, tmp_path):
    made = Fixtures(tmp_path)
    run_dir = tmp_path / "outputs" / "runs" / "attempt"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mine = [o.format_map(made) for o in overrides]
    keys = {o.split("=", 1)[0].lstrip("+") for o in mine}  # Hydra rejects a key given twice
    args = [a for a in ["backbone=tiny", f"data.glue_dir={glue_dir}", f"tracking.uri={uri}",
                        f"hydra.run.dir={run_dir}"] if a.split("=", 1)[0] not in keys] + mine
    try:
        r = cli(*args, timeout=HANG, env=hub_env(case, tmp_path))
    finally:
        made.restore()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("deepen-run: error: ") and culprit in lines[0], lines[0]
    assert "Traceback" not in r.stderr + r.stdout and "search path" not in lines[0] and "full_key" not in lines[0]
    if Path(uri[len("sqlite:///"):]).exists():
        from conftest import runs_of

        try:
            _, runs = runs_of(uri)
        except AssertionError:  # the store exists but no experiment: no run either
            runs = []
        assert not runs, [r.info.status for r in runs]
    # Composition errors stop before Hydra makes the dir; later ones remove the dir (and outputs/runs) it made.
    assert not (tmp_path / "outputs").exists(), sorted(str(p) for p in (tmp_path / "outputs").rglob("*"))
    shutil.rmtree(tmp_path / "hf", ignore_errors=True)


def user_folder(root: Path) -> dict[str, bytes]:
    """A folder holding someone's work; returns its files' bytes to compare against afterwards."""
    (root / "data").mkdir(parents=True)
    (root / "paper.tex").write_text("x\n")
    (root / "data" / "r.csv").write_text("a\n")
    return snapshot(root)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in root.rglob("*")}


@pytest.mark.parametrize("case,overrides,culprit", [c if hasattr(c, "marks") else pytest.param(*c, id=c[0])
                                                    for c in CASES])
def test_bad_input_leaves_a_user_folder_alone(case, overrides, culprit, glue_dir, tmp_path):
    """hydra.run.dir=<a folder of the user's>: refused (or a composition error) with one line, exit 2, and
    not one byte of the folder changes: nothing removed, nothing added."""
    made = Fixtures(tmp_path)
    work = tmp_path / "thesis"
    before = user_folder(work)
    mine = [o.format_map(made) for o in overrides]
    keys = {o.split("=", 1)[0].lstrip("+") for o in mine}
    args = [a for a in ["backbone=tiny", f"data.glue_dir={glue_dir}", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
                        f"hydra.run.dir={work}"] if a.split("=", 1)[0] not in keys] + mine
    try:
        r = cli(*args, timeout=HANG, env=hub_env(case, tmp_path))
    finally:
        made.restore()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("deepen-run: error: "), r.stderr
    assert snapshot(work) == before


# Cases the cheap pre-flight (deepen_run/run/preflight.py, cheap) must catch on its own.
CHEAP = ["wrong-columns", "not-utf8", "superscript-label", "non-integer-index", "stsb-nan-score", "stsb-inf-score",
         "stsb-score-above-5", "predict-test-missing", "predict-test-bad-row", "glue-dir-is-a-file", "seq-length-1",
         "negative-seed", "unknown-scheduler", "infinite-epochs", "negative-workers", "empty-experiment",
         "tracking-folder-is-a-file", "tracking-db-is-a-folder", "plus-unknown-key"]
CHECK_ALL = """
import json, sys
from hydra import compose, initialize_config_dir
from deepen_run.config.schema import register
from deepen_run.methods import schemas
from deepen_run.errors import UserError
from deepen_run.run import preflight
register(schemas())
out = {}
with initialize_config_dir(config_dir=sys.argv[1], version_base=None):
    for case, overrides in json.loads(sys.argv[2]).items():
        try:
            preflight.cheap(compose(config_name="config", overrides=overrides))
            out[case] = None
        except UserError as e:
            out[case] = str(e)
print(json.dumps({"errors": out, "heavy": [m for m in ("transformers", "mlflow", "datasets") if m in sys.modules]}))
"""


def test_cheap_checks_load_no_model_library(glue_dir, tmp_path):
    """The data, number, name and store checks run without transformers, datasets or mlflow (torch itself
    is loaded by the method registry the config schema needs), all cases in one process."""
    made = Fixtures(tmp_path)
    cases = {c.values[0]: c.values for c in CASES if hasattr(c, "values")}
    cases |= {c[0]: c for c in CASES if not hasattr(c, "values")}
    todo = {}
    for name in CHEAP:
        mine = [o.format_map(made) for o in cases[name][1]]
        keys = {o.split("=", 1)[0].lstrip("+") for o in mine}
        base = ["backbone=tiny", f"data.glue_dir={glue_dir}", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]
        todo[name] = [a for a in base if a.split("=", 1)[0] not in keys] + mine
    r = subprocess.run([sys.executable, "-c", CHECK_ALL, str(ROOT / "conf"), json.dumps(todo)], capture_output=True,
                       text=True, timeout=HANG, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for name in CHEAP:
        assert got["errors"][name] and cases[name][2] in got["errors"][name], (name, got["errors"][name])
    assert got["heavy"] == []


def test_scheduler_names_are_transformers_schedulers():
    """config.checks.SCHEDULERS (a literal: the config imports no transformers) is exactly the set of
    transformers' SchedulerType values that build from warmup and total steps alone and step without
    a metric, as run/optim.py (scheduler_for) uses them: a scheduler transformers adds or drops fails here."""
    import torch
    from transformers import get_scheduler
    from transformers.trainer_utils import SchedulerType

    from deepen_run.config.checks import SCHEDULERS

    def builds(name: str) -> bool:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        try:
            sched = get_scheduler(name, opt, num_warmup_steps=2, num_training_steps=10)
            opt.step()
            sched.step()
        except (TypeError, ValueError):  # needs lr_scheduler_kwargs or a metric
            return False
        return True

    assert len(set(SCHEDULERS)) == len(SCHEDULERS)
    assert set(SCHEDULERS) == {s.value for s in SchedulerType if builds(s.value)}


def test_read_only_store_as_a_non_root_user_sees_it(tmp_path, monkeypatch):
    """Root's stand-in for the chmod cases above: os.access is what the pre-flight asks, so answering
    it as a non-root user would shows each read-only part of the store named in the error."""
    from omegaconf import OmegaConf

    from deepen_run.errors import UserError
    from deepen_run.run.preflight import tracking_store

    (tmp_path / "mlflow.db").write_bytes(b"")
    for locked, culprit in [(tmp_path / "mlflow.db", "mlflow.db is read-only"), (tmp_path, "is not writable")]:
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, locked=locked, real=real: Path(p) != locked and real(p, mode))
        t = OmegaConf.create({"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "x"})
        with pytest.raises(UserError, match=culprit):
            tracking_store(t)
        monkeypatch.undo()


@pytest.mark.parametrize("overrides,culprit", [
    (["method=hire", "method.dropout=1.5"], "method.dropout=1.5 must be in [0, 1)"),
    (["method=pals", "method.attention_dropout=2"], "method.attention_dropout=2.0 must be in [0, 1)"),
    (["method=pals", "method.init_std=-1"], "method.init_std=-1.0 must be a finite number >= 0"),
    (["task.names=[sst2,rte]", "schedule.alpha=nan"], "schedule.alpha=nan must be a finite number"),
    (["tracking.uri=rel/path.db"], "tracking.uri=rel/path.db is not an MLflow tracking store"),
    (["tracking.uri=garbage://x"], "tracking.uri=garbage://x is not an MLflow tracking store"),
])
def test_method_options_and_the_store_are_checked_before_any_model_builds(overrides, culprit, glue_dir):
    """Each once failed only as the model was built or trained (torch's dropout and init, numpy's
    sampling, MLflow's store), with a traceback, and a sweep launched the job first."""
    from conftest import make_cfg
    from deepen_run.errors import UserError
    from deepen_run.run.preflight import check

    with pytest.raises(UserError) as e:
        check(make_cfg("backbone=tiny", f"data.glue_dir={glue_dir}", *overrides))
    assert culprit in str(e.value)


def test_a_sweep_with_cfg_is_one_line():
    from conftest import cli

    r = cli("-m", "seed=1,2", "--cfg", "job")  # Hydra's ValueError with its traceback before
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "-m and --cfg do not go together" in lines[0], r.stderr


def test_a_value_left_unset_in_the_environment_is_input_not_a_traceback(glue_dir):
    # +arm=duplicate_per_backbone reads DEEPEN_STUDY_DUPLICATE_<backbone>: unset, a single run gave a
    # 30-frame InterpolationResolutionError traceback and left its run dir (a sweep: one line).
    from conftest import make_cfg
    from deepen_run.cli.run import checked_run
    from deepen_run.errors import UserError

    with pytest.raises(UserError, match="'DEEPEN_STUDY_DUPLICATE_tiny' not found"):
        checked_run(make_cfg("backbone=tiny", "+arm=duplicate_per_backbone", f"data.glue_dir={glue_dir}"))


@pytest.mark.parametrize("override,culprit", [
    ("backbone.hidden_size=30", "backbone.hidden_size=30 must be a multiple of backbone.num_attention_heads=4"),
    ("backbone.num_attention_heads=0", "backbone.num_attention_heads=0 must be a positive integer"),
    ("backbone.intermediate_size=-1", "backbone.intermediate_size=-1 must be a positive integer"),
])
def test_a_random_backbones_shape_is_checked_in_the_cheap_preflight(override, culprit, glue_dir):
    """transformers refuses these only as it builds the model (a traceback, a FAILED run, and in a
    sweep past the check of every job); the cheap pre-flight names them first."""
    from conftest import make_cfg
    from deepen_run.errors import UserError
    from deepen_run.run.preflight import cheap

    with pytest.raises(UserError) as e:
        cheap(make_cfg("backbone=tiny", f"data.glue_dir={glue_dir}", override))
    assert culprit in str(e.value)
    cheap(make_cfg("backbone=tiny", f"data.glue_dir={glue_dir}"))  # the shipped shape passes
    cheap(make_cfg("backbone=tiny", "backbone.type_vocab_size=0", f"data.glue_dir={glue_dir}"))  # DeBERTa-v3's


def test_a_bad_row_of_the_diagnostic_set_is_refused_before_the_run(tmp_path):
    """AX (diagnostic/diagnostic.tsv) is optional, but a file that is there and holds a bad row is
    the user's to fix: file:line before the run, not a test set silently left out of the zip."""
    from deepen_run.data import tsv
    from deepen_run.data.glue import TASKS
    from deepen_run.errors import UserError

    rows = ["index\tsentence1\tsentence2\tgold_label", "0\tA man walks.\tA person moves.\tentailment",
            "1\tA dog.\tA cat.\tcontradiction"]
    (tmp_path / "MNLI").mkdir()
    for stem in ("train", "dev_matched", "dev_mismatched"):
        (tmp_path / "MNLI" / f"{stem}.tsv").write_text("\n".join(rows) + "\n")
    for stem in ("test_matched", "test_mismatched"):
        (tmp_path / "MNLI" / f"{stem}.tsv").write_text("\n".join(r.rsplit("\t", 1)[0] for r in rows) + "\n")
    (tmp_path / "diagnostic").mkdir()
    (tmp_path / "diagnostic" / "diagnostic.tsv").write_text("index\tsentence1\tsentence2\n0\tA man.\tA person.\n"
                                                            "1\tonly one column here\n")
    tsv.validate(str(tmp_path), [TASKS["mnli"]], test=False)  # without predict=true it is not read
    with pytest.raises(UserError, match=r"diagnostic.tsv:3: expected 3 tab-separated columns"):
        tsv.validate(str(tmp_path), [TASKS["mnli"]], test=True)
