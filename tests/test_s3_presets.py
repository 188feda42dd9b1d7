"""Study III's presets (conf/study/s3_*.yaml, docs/study.md "Study III") hold the design stated before
its runs: the multi-task rows keep the tasks' real size ratio, so the sampler's probabilities differ
between proportional, sqrt and annealed, and annealed's move over the epochs; the PALs paper's rows
sit at its relative budgets; the capacity control matches HIRE's parameter count; fresh seeds, and
each confirmatory member's n is the one the floor study's paired std asks for (deepen-report --power)."""
import torch
from omegaconf import OmegaConf

from conftest import make_cfg
from test_study_presets import grid
from deepen_run.config.schema import ROOT
from deepen_run.data.glue import TASKS, get_tasks
from deepen_run.data.loaders import train_size
from deepen_run.data.sampling import TaskSampler, epoch_length
from deepen_run.methods import METHODS
from deepen_run.model import backbone as bb
from deepen_run.model.heads import count

S3 = sorted(p.stem for p in (ROOT / "conf" / "study").glob("s3_*.yaml"))
MULTI = ("s3_multi_a", "s3_multi_b", "s3_multi_c", "s3_pilot_lr_multi")


def tsv_rows(glue_dir, task: str) -> int:
    with open(f"{glue_dir}/{TASKS[task].folder}/train.tsv", newline="") as f:
        return sum(1 for _ in f) - 1  # the header


def sampler_table(cfg, glue_dir) -> list[dict]:
    """The probabilities a run of this config logs (sampling/probabilities.csv), from the real
    training files' sizes cut the way the loader cuts them."""
    sizes = {t: train_size(tsv_rows(glue_dir, t), cfg.data.train_fraction, cfg.data.max_train_samples)
             for t in cfg.task.names}
    per_epoch = epoch_length(cfg.train, len(sizes), per_pass=10 ** 6)
    return TaskSampler(cfg.schedule, sizes, per_epoch, cfg.train.max_steps, cfg.seed).table()


def test_the_multi_task_schedules_differ_and_annealing_moves(glue_dir):
    cfgs = [c for p in ("s3_multi_a", "s3_multi_b") for c in grid(p)]
    tables = {c.schedule.name: sampler_table(c, glue_dir) for c in cfgs if c.method.name == "pals"}
    assert set(tables) == {"annealed", "proportional", "sqrt"}
    p = {name: [round(e["sst2"], 2) for e in t] for name, t in tables.items()}
    print(p)  # the probabilities each schedule uses, epoch by epoch
    # 6,735 SST-2 against 575 STS-B examples (10% of each): 4 epochs of 150 steps.
    assert p["proportional"] == [0.92] * 4 and p["sqrt"] == [0.77] * 4
    assert p["annealed"] == [0.92, 0.86, 0.76, 0.62]  # alpha 1.0, 0.73, 0.47, 0.2 (docs/methods.md)
    assert [round(e["alpha"], 2) for e in tables["annealed"]] == [1.0, 0.73, 0.47, 0.2]
    # The floor study's equal caps made every schedule uniform; these do not.
    floor = grid("floor_multi")[0]
    assert {round(e["sst2"], 6) for e in sampler_table(floor, glue_dir)} == {0.5}


def test_every_multi_task_row_keeps_the_real_ratio_and_the_same_budget():
    for preset in MULTI:
        for c in grid(preset):
            assert tuple(c.task.names) == ("sst2", "stsb") and c.data.train_fraction == 0.1, preset
            assert c.data.max_train_samples is None and c.train.max_steps == 600, preset
            assert epoch_length(c.train, 2, per_pass=10 ** 6) == 150, preset
    rows = {(c.method.name, c.method.get("variant"), c.schedule.name)
            for p in MULTI[:3] for c in grid(p)}
    assert rows == {("pals", "pals", "annealed"), ("pals", "pals", "proportional"), ("pals", "pals", "sqrt"),
                    ("baseline", None, "annealed"), ("pals", "top_pal", "annealed"), ("pals", "low_rank", "annealed")}


def _added(job: list[str], backbone: str, *extra: str) -> int:
    cfg = make_cfg(*job, f"backbone={backbone}", "backbone.pretrained=false", *extra)
    torch.manual_seed(0)
    model = METHODS[cfg.method.name].build(bb.load_model(cfg.backbone), cfg.method, get_tasks(list(cfg.task.names)))
    return count(model) - count(model.backbone) - count(model.heads)


def test_the_papers_rows_keep_its_relative_budgets_on_minilm():
    """PALs, low-rank and Top Proj. Attn. as s3_multi_c builds them on MiniLM's shape (random weights):
    low-rank at PALs' budget (the paper: both 1.13x), Top Proj. Attn. at the paper's 10.56M / 14.56M
    of PALs' added parameters."""
    job = ["+study=s3_multi_c", "+arm=s3_pals", "seed=101"]
    pals, low, top = (_added(job, "minilm", f"method.variant={v}") for v in ("pals", "low_rank", "top_pal"))
    assert pals == 2 * 910_020  # per task: V_E, V_D and 6 layers of q/k/v at d_s = 204, d = 384
    assert abs(low / pals - 1) < 0.005
    assert abs(top / pals - 10_563_552 / 14_558_688) < 0.005


def test_the_capacity_control_matches_hires_parameter_count():
    job = ["+study=s3_hire_a", "task=sst2", "seed=101"]
    hire = make_cfg(*job, "+arm=floor_hire", "backbone=tiny")
    control = make_cfg(*job, "+arm=s3_capacity", "backbone=tiny")
    assert (hire.method.extractor, control.method.extractor, control.method.gru_layers) == (True, False, 4)
    n = {}
    for name, cfg in (("hire", hire), ("control", control)):
        torch.manual_seed(0)
        n[name] = count(METHODS["hire"].build(bb.load_model(cfg.backbone), cfg.method, get_tasks(["sst2"])))
    # Equal but for the extractor's scorer w (d weights, no bias); the floor's control lacked 1.33M on MiniLM.
    assert n["hire"] - n["control"] == hire.backbone.hidden_size


def test_fresh_seeds_and_a_fresh_random_draw_per_seed():
    cfgs = {p: grid(p) for p in S3}
    for p, cs in cfgs.items():
        seeds = {c.seed for c in cs}
        assert seeds == {100} if "pilot" in p else seeds and min(seeds) > 100, p  # the floor's were 0-5
        assert {c.tracking.experiment for c in cs} == {"study-s3"}, p
        # Every job of a part shares the scale: learning rate, batch, length, backbone.
        for key in ("train.learning_rate", "train.batch_size", "data.max_seq_length", "backbone.name"):
            assert len({str(OmegaConf.select(c, key)) for c in cs}) == 1, (p, key)
    randoms = [c for c in cfgs["s3_explore"] if c.method.name == "hire"]
    assert randoms and all(c.method.importance == "random" and c.method.random_seed == c.seed for c in randoms)
    assert len({c.seed for c in randoms}) == 5


def _floor_power(spec: str) -> float:
    """The floor study's paired std of a contrast on the average, from the published CSV."""
    from deepen_run.report import from_csv, power

    rows, _ = from_csv.load(ROOT / "docs" / "results" / "floor_seeds.csv")
    return next(p["sd"] for p in power.table(rows, [spec], 5, 0.7) if p["task"] == "avg")


def test_each_confirmatory_members_n_is_the_one_its_paired_std_asks_for():
    """docs/study.md: a family of 5 under Holm, MDE <= 0.7 at 80% power and alpha 0.05 / 5."""
    from deepen_run.report.power import n_for

    multi_sd = max(_floor_power("12:11"), _floor_power("12:5"))  # the floor's multi-task pairs
    hire_sd = _floor_power("8:7")  # HIRE against its capacity control
    n_multi, n_hire = n_for(multi_sd, 0.7, 0.01), n_for(hire_sd, 0.7, 0.01)
    assert (n_multi, n_hire) == (6, 11)
    for p in MULTI[:3]:
        assert {c.seed for c in grid(p)} == set(range(101, 101 + n_multi)), p
    hire_seeds = [c.seed for p in ("s3_hire_a", "s3_hire_b", "s3_hire_c") for c in grid(p)]
    assert set(hire_seeds) == set(range(101, 101 + n_hire)) and len(hire_seeds) == n_hire * 4  # 2 arms x 2 tasks


def test_the_study_parts_cover_every_preset_and_stay_under_90_minutes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("study", ROOT / "scripts" / "study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    s3 = study.STUDIES["s3"]
    assert {p for part in s3["parts"].values() for p in part["presets"] + part.get("after_rule", [])} == set(S3)
    # The cost model of `study.py --study s3 --cost` (docs/study.md's table), over every job, as --cost
    # enumerates them.
    minutes = {name: sum(study.job_seconds(c) for p in part["presets"] + part.get("after_rule", [])
                         for c in grid(p)) / 60 for name, part in s3["parts"].items()}
    assert {r["part"]: r["minutes"] for r in study.cost_table("s3")} == {n: round(m) for n, m in minutes.items()}
    assert all(m <= 90 for m in minutes.values()), minutes
    assert sum(minutes.values()) <= 8 * 60
    assert set(s3["family"]) == {c for part in s3["parts"].values() for c in part.get("contrasts", [])}


def test_the_cost_model_counts_an_epoch_sized_job_as_the_run_trains_it(glue_dir, mlflow_uri):
    """--cost of the abl_* presets (train.max_steps=-1): their steps come from the cut training sets,
    as a run counts them, not from max_steps (which once made each job cost 10 s)."""
    import importlib.util

    from conftest import runs_of
    from deepen_run.run.preflight import check
    from deepen_run.run.runner import run

    spec = importlib.util.spec_from_file_location("study", ROOT / "scripts" / "study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    cfg = make_cfg("backbone=tiny", "task=stsb", "train.max_steps=-1", "train.num_epochs=1.5", "train.batch_size=16",
                   "data.train_fraction=0.01", "data.max_train_samples=40", f"data.glue_dir={glue_dir}",
                   f"tracking.uri={mlflow_uri}")
    run(cfg, check(cfg))
    client, (r,) = runs_of(mlflow_uri)
    trained = max(m.step for m in client.get_metric_history(r.info.run_id, "train/loss"))
    assert study.job_steps(cfg) == trained == 5  # 1.5 passes over ceil(40 / 16) = 3 batches
    assert study.job_seconds(cfg) > study.START_S



def test_a_draw_that_follows_the_seed_keeps_its_runs_in_one_row():
    """deepen-report's row key (deepen_run/report/rows.py): s3_hire_random's random_seed=${seed} runs
    share a row labelled random_seed=seed; a fixed draw that equals one run's seed does not split off."""
    from deepen_run.report import rows as rr

    def run(seed, draw):
        return {"params": {"seed": str(seed), "method.name": "hire", "method.random_seed": str(draw),
                           "backbone.name": "minilm"}, "tags": {"task": "sst2"}}

    fresh = rr.keys([run(s, s) for s in (101, 102, 103)])
    assert len(set(fresh)) == 1 and dict(fresh[0])["method.random_seed"] == "seed"
    fixed = rr.keys([run(s, 0) for s in (0, 1, 2)])  # the default draw 0, seeds 0-2: one row
    assert len(set(fixed)) == 1 and dict(fixed[0])["method.random_seed"] == "0"
    assert set(rr.keys([run(1, 1), run(2, 2), run(1, 0)])) == {*rr.keys([run(1, 1), run(2, 2)]), rr.key_of(run(1, 0))}


def test_each_job_is_published_on_its_own_and_a_later_run_skips_it(tmp_path):
    """scripts/study_jobs.py: a preset's jobs, seed by seed, each with its own file name; the preset is
    done only when every job has a file, and a run with every file in place starts no job."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    import study_jobs

    jobs = study_jobs.preset_jobs("s3_multi_a")
    assert len(jobs) == 12 and ["+arm=s3_pals", "seed=101"] in jobs
    names = {study_jobs.job_name(j) for j in jobs}
    assert len(names) == 12 and "arm-s3_pals_seed-101" in names
    folder = tmp_path / "jobs" / "s3_multi_a"
    folder.mkdir(parents=True)
    for name in sorted(names)[:-1]:
        (folder / f"{name}.csv").write_text("row\n")
    assert study_jobs.published("s3_multi_a", tmp_path) is None  # one job left
    (folder / f"{sorted(names)[-1]}.csv").write_text("row\n")
    done = study_jobs.published("s3_multi_a", tmp_path)
    assert done is not None and len(done) == 12
    started = []
    files = study_jobs.run_preset("s3_multi_a", out=tmp_path / "out", pub=tmp_path, uri="sqlite:///x.db",
                                  experiment="study-s3", extra=[], env={}, sh=lambda *a, **k: started.append(a),
                                  bin_dir=tmp_path)
    assert started == [] and sorted(files) == sorted(done)
    # seed by seed (the order run_preset goes through them): both arms of seed 101 before any of 102
    assert [f.rsplit("seed-", 1)[1] for f in files[:3]] == ["101.csv", "101.csv", "102.csv"]
