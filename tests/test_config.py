"""Composition: every group option composes, typos and wrong types fail at composition."""
import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from conftest import make_cfg
from deepen_run.config.schema import ROOT
from deepen_run.data.glue import TASKS


def test_defaults_compose():
    cfg = make_cfg()
    assert cfg.backbone.name == "minilm" and cfg.method.name == "baseline"
    assert list(cfg.task.names) == ["sst2"]
    # The store is the same file whatever the working directory.
    assert cfg.tracking.uri == f"sqlite:///{ROOT}/outputs/mlflow.db"


@pytest.mark.parametrize("group", ["backbone", "method", "task", "schedule"])
def test_every_option_composes(group):
    options = sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))
    assert options
    for opt in options:
        cfg = make_cfg(f"{group}={opt}")
        assert cfg[group] is not None


def test_glue_is_the_pals_eight():
    """task=glue (conf/task/glue.yaml, the one list of them): every GLUE task but WNLI, in TASKS' order."""
    assert list(make_cfg("task=glue").task.names) == [t for t in TASKS if t != "wnli"]
    assert len(TASKS) == 9


def test_task_names_override():
    assert list(make_cfg("task.names=[mrpc,stsb]").task.names) == ["mrpc", "stsb"]


@pytest.mark.parametrize("override", ["train.learning_rat=1e-3", "method.poolin=cls", "backbone.hiden_size=3"])
def test_typo_fails(override):
    with pytest.raises(ConfigCompositionException) as e:
        make_cfg(override)
    assert isinstance(e.value.__cause__, ConfigKeyError) or "not in" in str(e.value.__cause__)


@pytest.mark.parametrize("override", ["train.batch_size=many", "seed=abc", "dry_run=maybe"])
def test_wrong_type_fails(override):
    with pytest.raises(ConfigCompositionException) as e:
        make_cfg(override)
    assert isinstance(e.value.__cause__, ValidationError)


def test_glue_dir_from_env(monkeypatch):
    monkeypatch.setenv("DEEPEN_GLUE_DIR", "/some/where")
    assert make_cfg().data.glue_dir == "/some/where"
    monkeypatch.delenv("DEEPEN_GLUE_DIR")
    assert make_cfg().data.glue_dir is None  # unset: the Hub
