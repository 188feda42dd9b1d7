"""Every job of every study preset (conf/study/) composes, validates and builds: a preset can never
silently break. Jobs are expanded from the preset's hydra.sweeper.params the way Hydra's basic
sweeper does; each is composed with the compose API, passes the pre-flight checks, and its method
builds on a tiny random backbone (the real backbones' sizes are checked by the dry runs in the README)."""
import functools

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import make_cfg
from deepen_run.config.schema import ROOT
from deepen_run.sweep.check import composer, job_overrides

PRESETS = sorted(p.stem for p in (ROOT / "conf" / "study").glob("*.yaml"))


def jobs(preset: str) -> list[list[str]]:
    """Every job of the preset's grid, enumerated as the sweep's own pre-launch check does."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=[f"+study={preset}"], return_hydra_config=True)
    expanded = job_overrides(cfg)
    assert expanded is not None, f"{preset}: the grid cannot be enumerated"
    return expanded  # the +study override is part of each job


def compose_all(job_list: list[list[str]], *extra: str) -> list:
    """Each job's config as the sweep's pre-launch check composes it (sweep.check.composer: a setting
    once, a copy per seed)."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        one = composer("config")
        return [one([*job, *extra]) for job in job_list]


@functools.cache
def grid(preset: str) -> list:
    """Every job of the preset, composed once a test process (about 0.1 s a setting; the presets hold
    over five hundred jobs). The configs are only read, and their interpolations resolve when read, so
    a test that changes the environment (DEEPEN_STUDY_DUPLICATE_*) sees its own values."""
    return compose_all(jobs(preset))


@pytest.mark.parametrize("preset", PRESETS)
def test_a_study_preset_is_a_sweep_without_minus_m(preset):
    # Without hydra.mode=MULTIRUN, `deepen-run +study=abl_hire` ran one job of the defaults (seed 42)
    # into the study's experiment and dropped the grid, with exit 0.
    from hydra.types import RunMode

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=[f"+study={preset}"], return_hydra_config=True)
    assert cfg.hydra.mode == RunMode.MULTIRUN


def test_there_are_presets():
    assert {"cpu_single", "cpu_multi", "paper_single", "paper_multi", "abl_hire", "abl_duplicate", "abl_lr"} <= set(PRESETS)


@pytest.fixture(autouse=True)
def _probe_layers(monkeypatch):
    """paper_single's duplicate arm reads each backbone's probe suggestion from the environment."""
    for name in ("bert_base", "roberta_base"):
        monkeypatch.setenv(f"DEEPEN_STUDY_DUPLICATE_{name}", "[10, 11]")


@pytest.mark.parametrize("preset", PRESETS)
def test_every_job_of_a_study_preset_composes_and_builds(preset):
    from deepen_run.model.backbone import load_model
    from deepen_run.data.glue import get_tasks
    from deepen_run.methods import METHODS
    from deepen_run.run.preflight import numbers

    expanded = jobs(preset)
    assert len(expanded) >= 2  # the smallest: Study IV's LoRA pilot, one arm x 2 scales
    built = set()
    for job, cfg in zip(expanded, grid(preset), strict=True):
        OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
        numbers(cfg)
        tasks = get_tasks(list(cfg.task.names))
        assert cfg.tracking.experiment.startswith("study")
        sig = (cfg.method.name, tuple(cfg.task.names), str(OmegaConf.select(cfg, "backbone.duplicate_layers")))
        if sig in built:
            continue
        built.add(sig)
        tiny = make_cfg(*job, "backbone=tiny")
        model = METHODS[tiny.method.name].build(load_model(tiny.backbone), tiny.method, tasks)
        assert sum(p.numel() for p in model.parameters() if p.requires_grad) > 0


def test_the_cpu_grids_are_the_study():
    a, b = grid("cpu_single"), grid("cpu_multi")
    assert len(a) == 45 and len(b) == 6
    assert {(c.method.name, bool(OmegaConf.select(c, "backbone.duplicate_layers"))) for c in a} == \
        {("baseline", False), ("hire", False), ("baseline", True)}
    assert {c.method.name for c in b} == {"pals", "baseline"} and {c.schedule.name for c in b} == {"annealed"}
    assert {tuple(c.task.names) for c in b} == {("cola", "sst2", "mrpc", "stsb", "rte")}
    assert {c.seed for c in a + b} == {1, 2, 3} and {c.backbone.name for c in a + b} == {"minilm"}
    # Grid B sees the data of grid A's five runs in (about) the same number of steps.
    assert b[0].train.num_epochs * b[0].train.steps_per_epoch == 135
    for key in ("data.train_fraction", "data.max_train_samples", "train.batch_size", "train.learning_rate"):
        assert len({str(OmegaConf.select(c, key)) for c in a + b}) == 1, key


def test_the_floor_study_has_every_control_on_five_seeds():
    """docs/study.md's design: SST-2 and STS-B, seeds 1-5 (the pilot seed 0 apart), mean pooling
    for every method, and each control of the primary questions."""
    import importlib.util

    grids = {p: grid(p) for p in PRESETS if p.startswith("floor_")}
    spec = importlib.util.spec_from_file_location("study", ROOT / "scripts" / "study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    assert {p for part in study.PARTS.values() for p in part["presets"] if p.startswith("floor_")} == set(grids)
    for name, cfgs in grids.items():
        seeds = {c.seed for c in cfgs}
        assert seeds == ({0} if "pilot" in name else {1, 2, 3, 4, 5}), name
        assert {c.backbone.name for c in cfgs} == {"minilm"} and {c.tracking.experiment for c in cfgs} == {"study-floor"}
        assert {tuple(sorted(c.task.names)) for c in cfgs} <= {("sst2",), ("stsb",), ("sst2", "stsb")}
        for c in cfgs:
            pool = c.method.get("pool") if c.method.name == "hire" else c.method.pooling
            assert pool == "mean" or name == "floor_base", name
    sel = lambda g, **kv: [c for c in grids[g] if all(str(OmegaConf.select(c, k)) == v for k, v in kv.items())]  # noqa: E731
    assert {c.method.pooling for c in grids["floor_base"]} == {"mean", "pooler"}
    assert {c.method.importance for c in grids["floor_hire"]} == {"dynamic", "mean", "random"}
    assert [c.method.extractor for c in grids["floor_capacity"]] == [False] * 10
    # Duplication: the probe's k = 2, a seeded random draw of 2 (recorded in the preset), the top 2.
    layers = {tuple(c.backbone.duplicate_layers) for c in grids["floor_dup"]}
    assert layers == {(1, 2), tuple(study.draw_layers(2, 1)), (4, 5)} and len(layers) == 3
    # Matched encoder updates: the single-task control takes the multi-task model's steps.
    multi = grids["floor_multi"][0]
    assert len(sel("floor_matched", **{"train.max_steps": str(multi.train.max_steps)})) == 10
    assert multi.train.max_steps == 2 * grids["floor_base"][0].train.max_steps
    assert {c.method.name for c in grids["floor_multi"]} == {"pals", "baseline"}
    # One learning-rate rule: the pilot tries 1 and 10 for every method it then applies to.
    assert {(c.method.name, c.train.new_params_lr_scale) for c in grids["floor_pilot"] + grids["floor_pilot_multi"]} == \
        {(m, s) for m in ("baseline", "hire", "pals") for s in (1.0, 10.0)}


def test_gpu_presets_follow_their_papers(monkeypatch):
    monkeypatch.setenv("DEEPEN_STUDY_DUPLICATE_roberta_base", "[9, 10]")
    single = [c for c in grid("paper_single") if OmegaConf.select(c, "backbone.duplicate_layers")]
    assert {(c.backbone.name, tuple(c.backbone.duplicate_layers)) for c in single} == \
        {("bert_base", (10, 11)), ("roberta_base", (9, 10))}  # each backbone's own layers
    multi = grid("paper_multi")
    assert {tuple(c.task.names) for c in multi} == {("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")}
    assert {c.train.model_selection for c in [*single, *multi]} == {"final"}  # one rule, a param of every run
    monkeypatch.delenv("DEEPEN_STUDY_DUPLICATE_roberta_base")
    with pytest.raises(Exception, match="DEEPEN_STUDY_DUPLICATE_roberta_base"):
        [OmegaConf.to_container(c, resolve=True) for c in grid("paper_single")]


def test_the_study_prints_each_reports_command(tmp_path):
    """README's intervals come with the deepen-report command that prints them: `study.py --command`
    gives it with this study's sweep ids, every primary question's contrast included; a part whose
    sweeps did not run yet is named."""
    import shlex
    import subprocess
    import sys

    ids = {"floor_base": "b1", "floor_matched": "m1", "floor_hire": "h1", "floor_capacity": "c1", "floor_dup": "d1",
           "floor_multi": "x1"}
    (tmp_path / "sweeps.json").write_text(__import__("json").dumps(ids))
    study = [sys.executable, str(ROOT / "scripts" / "study.py"), "--out", str(tmp_path)]
    r = subprocess.run([*study, "--command"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    cmd = shlex.split(r.stdout)
    assert cmd[:5] == ["deepen-report", "--experiment", "study-floor", "--baseline", "pooling=mean"]
    assert [cmd[i + 1] for i, x in enumerate(cmd) if x == "--sweep-id"] == ["b1", "m1", "h1", "c1", "d1", "x1"]
    contrasts = [cmd[i + 1] for i, x in enumerate(cmd) if x == "--contrast"]
    base = "method=baseline pooling=mean duplicate_layers=[] max_steps=150 setup=single"
    for q in (f"method=hire importance=dynamic extractor=true:{base}", "method=hire importance=dynamic extractor=true:"
              "extractor=false", "method=hire importance=dynamic extractor=true:method=hire importance=random",
              f"duplicate_layers=[1,2]:{base}", "duplicate_layers=[1,2]:duplicate_layers=[1,4]",
              "method=pals:method=baseline setup=multi", "method=pals:method=baseline setup=single max_steps=300"):
        assert q in contrasts, q
    r = subprocess.run([*study, "--command", "--part", "sched"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "needs the sweeps floor_sched" in r.stderr, r.stderr


def test_a_mistyped_study_option_is_refused_not_passed_on_to_the_study(tmp_path):
    """scripts/study.py passes key=value overrides on to deepen-run; a mistyped option (--costs) was
    passed on too, so the study started and then failed with a misleading 'run it again'. And
    --draw-layers draws 1 to 6 of MiniLM's layers (0 was ignored, 7 a traceback)."""
    import os
    import subprocess
    import sys

    study = [sys.executable, str(ROOT / "scripts" / "study.py"), "--out", str(tmp_path / "out")]
    for args, culprit in ((["--costs"], "unrecognized arguments: --costs"),
                          (["--draw-layers", "0"], "--draw-layers 0: MiniLM has 6 layers"),
                          (["--draw-layers", "7"], "--draw-layers 7: MiniLM has 6 layers")):
        r = subprocess.run([*study, *args], capture_output=True, text=True, timeout=600)
        assert r.returncode == 2 and culprit in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert "+ " not in r.stdout and not (tmp_path / "out").exists()  # nothing was started
    r = subprocess.run([*study, "--draw-layers", "2", "~seed"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "[1, 4]", r.stderr[-2000:]  # a ~key deletion is an override
    # --updates counts the training sets: without the GLUE files, one line naming what to set
    env = {k: v for k, v in os.environ.items() if k != "DEEPEN_GLUE_DIR"}
    r = subprocess.run([*study, "--study", "s4", "--updates"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 1 and "set DEEPEN_GLUE_DIR" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_the_composer_gives_each_seed_what_composing_its_job_gives():
    """sweep.check.composer composes a setting once and sets each seed on a copy: every job's config,
    as written and as resolved (s3_explore's random arm reads ${seed}), equals Hydra's own compose."""
    expanded = jobs("s3_explore")
    assert len({tuple(o for o in j if not o.startswith("seed=")) for j in expanded}) < len(expanded)
    for job, mine in zip(expanded, grid("s3_explore"), strict=True):
        theirs = make_cfg(*job)
        assert OmegaConf.to_yaml(mine) == OmegaConf.to_yaml(theirs)
        assert OmegaConf.to_yaml(mine, resolve=True) == OmegaConf.to_yaml(theirs, resolve=True)
        assert OmegaConf.is_struct(mine) and type(mine.seed) is int
    assert len({c.method.random_seed for c in grid("s3_explore") if c.method.name == "hire"
                and c.method.importance == "random"}) > 1  # each seed its own draw


def test_the_composer_composes_a_job_whose_seed_is_set_twice_as_hydra_does():
    """`seed=1 ++seed=7` ends with 7 in Hydra; a copy of the `seed=1` setting would say 1."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        one = composer("config")
        a, b = one(["backbone=tiny", "seed=1"]), one(["backbone=tiny", "seed=2"])
        assert (a.seed, b.seed) == (1, 2) and a is not b  # copies: a caller's change stays its own
        assert one(["backbone=tiny", "seed=1", "++seed=7"]).seed == 7
