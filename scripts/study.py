"""`make study`: the floor study (docs/study.md), part by part, on the offline MiniLM.

  make study PART=pilot   the new-parameter learning-rate rule (seed 0, left out of every table)
  make study PART=base    the baseline, mean pooling and pooler; single-task at matched updates
  make study PART=hire    HIRE: dynamic, mean and random importance; the capacity control
  make study PART=dup     k = 2 duplicated layers: the probe's, random, the top
  make study PART=multi   PALs and the multi-task baseline
  make study              every primary part in that order, then the whole report
  PART=sched, PART=gru    the secondary questions (not in the default run)
  PART=ablations          the older ablation presets (abl_*), reported on their own sweeps

Each part is one sweep per preset in a fixed folder (outputs/study-floor/<part>/<preset>) run with
resume=auto: a part that was killed continues where it stopped when the same command runs again.
After each part: deepen-report over exactly that part's sweeps (and the base part's, whose
mean-pooling baseline the other rows pair with), with the part's named contrasts; its table in
outputs/study-floor/<part>/. The sweep ids are kept in outputs/study-floor/sweeps.json.
--draw-layers K: print the seeded random draw of K layers that floor_dup.yaml records.
--smoke: a tiny scale (tiny data and batches, one seed) for a test of the pipeline. Extra arguments go to every sweep.

--study s3: Study III (docs/study.md, "Study III"), parts pilot, multi_a, multi_b, multi_c, hire_a,
hire_b, hire_c, explore (`make study-s3 PART=<name>`), in outputs/study-s3/; its report holds the
confirmatory family alone under Holm (--only-contrasts), the exploratory contrasts in their own
table (--secondary) and each member's achieved power (--power). --cost prints each part's jobs and
estimated minutes. --part family runs nothing: it reports the confirmatory family alone (the five
contrasts over the parts they read, no exploratory row) and publishes family_report.md. --part design
--command prints the report of Study III by its design-time plan (docs/plans/s3.yaml: Holm over all
15 readings, as designed in 10993d0; deepen-report --plan).

--study s4: Study IV, planned in docs/plans/s4.yaml before its first job (`make study-s4 PART=<part>`,
parts pilot, hire_a, hire_b, capacity, dup_a, dup_b, multi, sched_a, sched_b; PART=family reads it by
its plan). --updates prints each multi-task schedule's expected updates per task.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # study_jobs.py beside it, also when imported by path
import study_jobs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# Smoke: tiny data and batches, but each preset's own step counts (the matched-updates rows differ by them).
SMOKE = ["train.batch_size=2", "data.max_train_samples=16", "data.max_eval_samples=32", "data.max_seq_length=32"]
BASELINE = "pooling=mean"  # the baseline every floor row is paired with (--baseline)
# Row selectors of deepen-report --contrast (deepen_run/report/contrasts.py, select).
MEAN_BASE = "method=baseline pooling=mean duplicate_layers=[] max_steps=150 setup=single"
PARTS: dict[str, dict] = {
    "pilot": {"presets": ["floor_pilot", "floor_pilot_multi"], "contrasts": []},
    "base": {"presets": ["floor_base", "floor_matched"],
             "contrasts": [f"{MEAN_BASE}:method=baseline pooling=pooler"]},
    "hire": {"presets": ["floor_hire", "floor_capacity"],
             "contrasts": [f"method=hire importance=dynamic extractor=true:{MEAN_BASE}",
                           "method=hire importance=dynamic extractor=true:extractor=false",
                           "method=hire importance=dynamic extractor=true:method=hire importance=mean",
                           "method=hire importance=dynamic extractor=true:method=hire importance=random"]},
    "dup": {"presets": ["floor_dup"],
            "contrasts": [f"duplicate_layers=[1,2]:{MEAN_BASE}", "duplicate_layers=[1,2]:duplicate_layers=[1,4]",
                          "duplicate_layers=[1,2]:duplicate_layers=[4,5]"]},
    "multi": {"presets": ["floor_multi"], "needs": ["floor_matched"],
              "contrasts": ["method=pals:method=baseline setup=multi",
                            "method=pals:method=baseline setup=single max_steps=300"]},
    "sched": {"presets": ["floor_sched"], "needs": ["floor_multi"], "secondary": True,
              "contrasts": ["method=pals schedule=proportional:method=pals schedule=annealed",
                            "method=pals schedule=sqrt:method=pals schedule=annealed"]},
    "gru": {"presets": ["floor_gru"], "needs": ["floor_hire"], "secondary": True,
            "contrasts": ["gru_layers=1:method=hire gru_layers=2 importance=dynamic extractor=true",
                          "gru_layers=3:method=hire gru_layers=2 importance=dynamic extractor=true"]},
    "ablations": {"presets": ["abl_hire", "abl_duplicate", "abl_lr"], "contrasts": [], "own": True},
}
PRIMARY = ["pilot", "base", "hire", "dup", "multi"]
LR_ENV = {"baseline": "DEEPEN_STUDY_LR_BASELINE", "hire": "DEEPEN_STUDY_LR_HIRE", "pals": "DEEPEN_STUDY_LR_PALS",
          # Study IV's new arms, each at its own pilot's scale (the capacity control too: C5 reused HIRE's)
          "scalar_mix": "DEEPEN_STUDY_LR_SCALAR_MIX", "lora": "DEEPEN_STUDY_LR_LORA", "capacity": "DEEPEN_STUDY_LR_CAPACITY",
          "copies": "DEEPEN_STUDY_LR_COPIES", "dwa": "DEEPEN_STUDY_LR_DWA"}


def rule_key(row: dict) -> str:
    """The learning-rate rule an arm of a pilot row belongs to: its method, or Study IV's own arms."""
    cfg = row["config"]
    if row["method"] == "hire" and str(cfg.get("method.extractor")).lower() == "false":
        return "capacity"
    if str(cfg.get("backbone.duplicate_train")).lower() == "copies":
        return "copies"
    if str(cfg.get("backbone.dwa")).lower() == "true":
        return "dwa"
    return row["method"]

# Study III (docs/study.md, "Study III"): its confirmatory family (Holm over these 5 alone, on the
# average of SST-2 and STS-B), its secondary (exploratory) contrasts, and its parts (each <= 90 min).
S3_PALS = "method=pals variant=pals schedule=annealed"
S3_HIRE = "method=hire importance=dynamic extractor=true"
S3_FAMILY = [f"{S3_PALS}:method=baseline setup=multi", f"{S3_PALS}:method=pals variant=pals schedule=proportional",
             f"{S3_PALS}:variant=top_pal", f"{S3_PALS}:variant=low_rank", f"{S3_HIRE}:extractor=false"]
S3_SECONDARY = [f"method=pals variant=pals schedule=sqrt:{S3_PALS}", f"{S3_PALS}:method=baseline setup=single",
                f"{S3_HIRE}:method=hire importance=random"]
S3_PARTS: dict[str, dict] = {
    # The learning-rate rule first (its env then applies to the step-count pilot), then the steps.
    "pilot": {"presets": ["s3_pilot_lr", "s3_pilot_lr_multi"], "after_rule": ["s3_pilot_steps"]},
    "multi_a": {"presets": ["s3_multi_a"], "contrasts": S3_FAMILY[:1]},
    "multi_b": {"presets": ["s3_multi_b"], "needs": ["s3_multi_a"], "contrasts": S3_FAMILY[1:2]},
    "multi_c": {"presets": ["s3_multi_c"], "needs": ["s3_multi_a"], "contrasts": S3_FAMILY[2:4]},
    "hire_a": {"presets": ["s3_hire_a"], "contrasts": S3_FAMILY[4:]},
    "hire_b": {"presets": ["s3_hire_b"], "needs": ["s3_hire_a"], "contrasts": S3_FAMILY[4:]},
    "hire_c": {"presets": ["s3_hire_c"], "needs": ["s3_hire_a", "s3_hire_b"], "contrasts": S3_FAMILY[4:]},
    "explore": {"presets": ["s3_explore", "s3_matched"], "needs": ["s3_multi_a", "s3_hire_a", "s3_hire_b", "s3_hire_c"],
                "secondary": S3_SECONDARY},
}
# Study IV (docs/plans/s4.yaml, written and committed before its first job; docs/study.md "Study IV"):
# its family and exploratory contrasts are the plan's, read by deepen-report --plan; each job file
# records the plan's sha. Parts of at most 90 minutes on 2 idle cores, each resuming job by job.
S4_PLAN = ROOT / "docs" / "plans" / "s4.yaml"
S4_PARTS: dict[str, dict] = {
    "pilot": {"presets": ["s4_pilot_lr", "s4_pilot_lr_multi"]},
    **{f"hire_{x}": {"presets": [f"s4_hire_{x}"]} for x in "ab"},
    "capacity": {"presets": ["s4_capacity"]},
    **{f"dup_{x}": {"presets": [f"s4_dup_{x}"]} for x in "ab"},
    "multi": {"presets": ["s4_multi"]},
    **{f"sched_{x}": {"presets": [f"s4_sched_{x}"]} for x in "ab"},
}
STUDIES = {
    "s4": {"parts": S4_PARTS, "primary": list(S4_PARTS), "experiment": "study-s4", "baseline": None, "first": None,
           "plan": S4_PLAN, "inherit_rule": ROOT / "docs" / "results" / "s3" / "lr_rule.json",
           "mde": 1.0},  # the plan's target: an MDE of at most 1.0 point at alpha 0.05/7
    "floor": {"parts": PARTS, "primary": PRIMARY, "experiment": "study-floor", "baseline": BASELINE,
              "first": "floor_base"},
    "s3": {"parts": S3_PARTS, "primary": list(S3_PARTS), "experiment": "study-s3", "baseline": None, "first": None,
           "design_plan": ROOT / "docs" / "plans" / "s3.yaml",
           "family": S3_FAMILY, "secondary": S3_SECONDARY},
}
# Cost model (docs/study.md): seconds per training step on 2 idle cores, evaluation and loading
# included, from the floor study's idle medians (docs/results.md "How it ran": 150 single-task steps
# 62 s / 101 s for a baseline on SST-2 / STS-B, HIRE 83 s / 135 s; 300 multi-task steps 117 s
# baseline, 139 s PALs), scaled linearly with the steps (so an over-estimate: the evaluation does
# not grow with them), plus 10 s to start each process.
STEP_S = {("single", "baseline"): 0.54, ("single", "hire"): 0.73, ("multi", "baseline"): 0.39, ("multi", "pals"): 0.46}
START_S = 10


def draw_layers(k: int, seed: int, n_layers: int = 6) -> list[int]:
    return sorted(random.Random(seed).sample(range(n_layers), k))


def sh(cmd: list[str], env: dict | None = None, capture: bool = False) -> str:
    print("+ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, env={**os.environ, **(env or {})}, text=True, stdout=subprocess.PIPE if capture else None)
    if r.returncode != 0:
        sys.exit(f"study: {Path(cmd[0]).name} failed (exit {r.returncode}); run the same command again to continue")
    return r.stdout or ""


def sources(uri: str, experiment: str, ids: list[str]) -> tuple[list[str], list[str]]:
    """deepen-report's input as (the store, the sweeps in it), or ([], the published per-seed CSVs) for a
    study run over several sessions, whose stores stayed on their machines, joined by their rows' settings."""
    csvs = [i for i in ids if i.endswith(".csv")]
    if csvs and len(csvs) < len(ids):  # a sweep id would match no run of another session's store: rows would vanish
        sys.exit(f"study: {csvs[0]} is a published file, {next(i for i in ids if i not in csvs)} a sweep of this "
                 "store; one report reads one or the other (publish the sweep, or run its part again)")
    if csvs:
        return [], [x for i in ids for x in ("--from-csv", i)]
    return ["--uri", uri, "--experiment", experiment], [x for i in ids for x in ("--sweep-id", i)]


def ids_of(sweeps: dict, presets: list[str]) -> list[str]:
    """The presets' sweep ids, or their published job files (Study III: a list a preset)."""
    return [i for p in dict.fromkeys(presets) for i in (sweeps[p] if isinstance(sweeps[p], list) else [sweeps[p]])]


def pilot_table(uri: str, experiment: str, sweeps: dict, presets: list[str]) -> dict:
    store, which = sources(uri, experiment, ids_of(sweeps, presets))
    return json.loads(sh([str(BIN / "deepen-report"), "--json", *store, *which],
                         capture=True))


def lr_rule(out: Path, uri: str, sweeps: dict, st: dict = STUDIES["floor"]) -> dict[str, float]:
    """Per method, the pilot's new_params_lr_scale with the higher average (baseline and HIRE on
    single-task rows, PALs on multi-task ones) -> <out>/lr_rule.json, with every score it compared."""
    table = pilot_table(uri, st["experiment"], sweeps, st["parts"]["pilot"]["presets"])
    best: dict[str, tuple[float, float]] = {}
    scores = []
    for row in table["rows"]:
        method, single = rule_key(row), row["setup"] == "single-task"
        tasks = list(row["per_seed"])
        avg = sum(v for t in tasks for v in row["per_seed"][t].values()) / sum(len(row["per_seed"][t]) for t in tasks)
        scale = float(row["config"]["train.new_params_lr_scale"])
        # PALs' rule from multi-task rows, the others' from single-task rows; every score is written
        # (the multi-task baseline's too: the rule does not read it, a reader comparing with PALs does).
        used = (method in ("pals", "lora")) != single
        scores.append({"method": method, "setup": row["setup"], "scale": scale, "avg": avg, "per_seed": row["per_seed"],
                       "in_rule": used})
        if used and (method not in best or avg > best[method][1]):
            best[method] = (scale, avg)
    rule = {m: s for m, (s, _) in best.items()}
    scales = sorted({x["scale"] for x in scores})
    (out / "lr_rule.json").write_text(json.dumps({"rule": "per method, the pilot's better average of "
                                                  f"new_params_lr_scale {' and '.join(map(str, scales))}",
                                                  "scale": rule, "pilot_avg": {m: a for m, (_, a) in best.items()},
                                                  "scores": scores}, indent=1))
    print(f"study: new-parameter learning-rate scale per method: {rule}", flush=True)
    return rule


def steps_rule(out: Path, uri: str, sweeps: dict, st: dict) -> dict:
    """Study III's step-count pilot: per task, the baseline at 2S minus at S steps (seed 100) ->
    <out>/steps_rule.json; the rule holds where every task moves by less than 0.5 points."""
    table = pilot_table(uri, st["experiment"], sweeps, st["parts"]["pilot"]["after_rule"])
    by_steps = {int(r["config"]["train.max_steps"]): r["per_seed"] for r in table["rows"]}
    lo, hi = sorted(by_steps)
    moved = {t: sum(by_steps[hi][t].values()) / len(by_steps[hi][t]) - sum(by_steps[lo][t].values()) / len(by_steps[lo][t])
             for t in by_steps[lo]}
    met = all(abs(d) < 0.5 for d in moved.values())
    rule = {"steps": lo, "doubled": hi, "change": moved, "rule_met": met,
            "reading": f"doubling {lo} to {hi} steps moves the baseline by "
                       + ", ".join(f"{t} {d:+.2f}" for t, d in moved.items())
                       + ("; under 0.5 on each task: the rule holds" if met else
                          f"; 0.5 or more on a task: {lo} is the largest the CPU budget allows, not a converged budget")}
    (out / "steps_rule.json").write_text(json.dumps(rule, indent=1))
    print(f"study: {rule['reading']}", flush=True)
    return rule


def report_command(uri: str, ids: list[str], contrasts: list[str], own: bool = False,
                   st: dict = STUDIES["floor"], secondary: tuple = (), plan: Path | None = None) -> list[str]:
    store, which = sources(uri, "study" if own else st["experiment"], ids)
    cmd = ["deepen-report", *store] + \
        (["--tasks", "sst2,stsb"] if own else ["--baseline", st["baseline"]] if st["baseline"] else [])
    cmd += which + [x for c in contrasts for x in ("--contrast", c)]
    if st.get("plan") or plan:  # a planned study: the plan names the family, its tests and its adjustment
        cmd += ["--plan", str(plan or st["plan"])]
        if st.get("mde"):  # and the MDE each member achieved, which the plan promised to print after the runs
            from deepen_run.report.plan import contrast_specs, load

            family = contrast_specs(load(Path(st["plan"]))[0])
            cmd += [x for c in family for x in ("--power", c)] + ["--family", str(len(family)), "--mde", str(st["mde"])]
        return cmd
    if st is STUDIES["s3"]:  # the confirmatory family alone under Holm; the rest in their own table
        family = [c for c in contrasts if c in st["family"]]
        cmd += (["--only-contrasts"] if contrasts else []) + [x for c in secondary for x in ("--secondary", c)]
        cmd += [x for c in family for x in ("--power", c)] + (["--family", str(len(st["family"]))] if family else [])
        cmd += ["--holm-avg"] if set(family) == set(st["family"]) else []  # the whole family: planned on the average
    return cmd


def report(uri: str, out: Path, ids: list[str], contrasts: list[str], own: bool = False,
           st: dict = STUDIES["floor"], secondary: tuple = ()) -> None:
    cmd = report_command(uri, ids, contrasts, own, st, secondary)
    cmd = [str(BIN / cmd[0]), *cmd[1:]]
    # The report's folder is this command's own: a rerun replaces what the last one wrote there.
    printed = sh(cmd + ["--out", str(out), "--seeds-csv", str(out / "seeds.csv"), "--overwrite"], capture=True)
    print(printed, end="", flush=True)
    (out / "report.md").write_text(printed.replace(f"{ROOT}/", ""))  # the tables as printed, paths the repo's
    (out / "report.json").write_text(sh(cmd + ["--json"], capture=True))  # the same tables, nothing written twice


def what_to_report(name: str, sweeps: dict, st: dict = STUDIES["floor"]) -> tuple[list[str], list[str], bool, list]:
    """(sweep ids, contrasts, own, secondary) of a part's report; name "all": every primary row and contrast."""
    parts = st["parts"]
    if name == "design":  # Study III by its design-time plan: the family's parts, read by docs/plans/s3.yaml
        ids, _, _, _ = what_to_report("family", sweeps, st)
        return ids, [], False, []
    if name == "family" and st.get("plan"):  # every part but the pilot: the plan picks its rows
        presets = [p for n in st["primary"] if n != "pilot" for p in parts[n]["presets"]]
        contrasts, own, secondary = [], False, []
    elif name == "family":  # the confirmatory family alone: the parts its members read, no exploratory row
        names = [n for n in st["primary"] if set(parts[n].get("contrasts", [])) & set(st.get("family", []))]
        presets = list(dict.fromkeys(p for n in names for p in parts[n].get("needs", []) + parts[n]["presets"]))
        contrasts, own, secondary = list(st["family"]), False, []
    elif name == "all":
        presets = [p for n in st["primary"][1:] for p in parts[n]["presets"]]
        contrasts = list(dict.fromkeys(c for n in st["primary"] for c in parts[n].get("contrasts", [])))
        own, secondary = False, st.get("secondary", [])
    else:
        part, own = parts[name], parts[name].get("own", False)
        first = [st["first"]] if st["first"] and not own else []
        presets = first + part.get("needs", []) + part["presets"]
        contrasts, secondary = part.get("contrasts", []), part.get("secondary", [])
    missing = [p for p in presets if p not in sweeps]
    if missing:
        sys.exit(f"study: the report of {name} needs the sweeps {', '.join(missing)}; run their parts first "
                 "(make study PART=...)")
    return ids_of(sweeps, presets), contrasts, own, secondary


@functools.cache
def train_rows(glue_dir: str, task: str) -> int:
    from deepen_run.data.glue import get_tasks
    from deepen_run.data.tsv import read_tsv

    if not glue_dir:  # --cost and --updates count the training sets' rows
        sys.exit("study: the training sets' sizes need the GLUE TSV files: set DEEPEN_GLUE_DIR=<folder of "
                 "GLUE TSVs> (or data.glue_dir=...)")
    spec = get_tasks([task])[0]
    return len(read_tsv(Path(glue_dir) / spec.folder / "train.tsv", spec, labelled=True)["idx"])


def job_steps(cfg) -> int:
    """A job's training steps as the run counts them (data.sampling.total_steps): epoch-sized jobs (the
    abl_* presets, max_steps=-1) count the batches of their cut training sets, which needs the GLUE files."""
    from deepen_run.data.loaders import train_size
    from deepen_run.data.sampling import total_steps

    t = cfg.train
    if t.max_steps <= 0 and not cfg.data.glue_dir:
        sys.exit("study: --cost counts the training rows of epoch-sized jobs: set DEEPEN_GLUE_DIR")
    rows = [] if t.max_steps > 0 else [train_size(train_rows(cfg.data.glue_dir, task), cfg.data.train_fraction,
                                                  cfg.data.max_train_samples) for task in cfg.task.names]
    per_pass = sum(math.ceil(n / t.batch_size) for n in rows) // t.gradient_accumulation_steps
    return total_steps(t, len(cfg.task.names), per_pass)


def job_seconds(cfg) -> float:
    """One job's estimated seconds on 2 idle cores (STEP_S; PALs' variants at PALs' rate)."""
    setup = "multi" if len(cfg.task.names) > 1 else "single"
    kind = cfg.method.name if (setup, cfg.method.name) in STEP_S else "baseline"
    return START_S + job_steps(cfg) * STEP_S[(setup, kind)]


def cost_table(study: str) -> list[dict]:
    """Each part's jobs and estimated minutes on 2 idle cores (STEP_S): every job of its presets,
    enumerated as the sweep enumerates them (and composed as its pre-launch check does)."""
    from deepen_run.sweep.check import composer

    parts = {name: part["presets"] + part.get("after_rule", []) for name, part in STUDIES[study]["parts"].items()}
    jobs = {name: [j for p in presets for j in study_jobs.sweep_jobs(p)] for name, presets in parts.items()}
    with study_jobs.conf_dir():
        compose = composer("config")
        return [{"part": name, "presets": parts[name], "jobs": len(js),
                 "minutes": round(sum(job_seconds(compose(list(j))) for j in js) / 60)}
                for name, js in jobs.items()]


def expected_updates(study: str) -> list[dict]:
    """Per multi-task schedule of the study's presets: each task's expected updates (the sum over steps
    of its sampling probability, with the sampler the runs use) and the passes over its training set
    they make. Study III's C2 compared schedules that gave STS-B very different numbers of updates."""
    from deepen_run.data.loaders import train_size
    from deepen_run.data.sampling import TaskSampler, epoch_length, total_steps
    from deepen_run.sweep.check import composer

    out, seen = [], set()
    jobs = [j for part in STUDIES[study]["parts"].values() for p in part["presets"] for j in study_jobs.sweep_jobs(p)]
    with study_jobs.conf_dir():
        compose = composer("config")
        for job in jobs:
            cfg = compose(list(job))
            t = cfg.train
            key = (cfg.schedule.name, t.max_steps, t.steps_per_task)
            if len(cfg.task.names) < 2 or key in seen:
                continue
            seen.add(key)
            sizes = {n: train_size(train_rows(cfg.data.glue_dir, n), cfg.data.train_fraction,
                                   cfg.data.max_train_samples) for n in cfg.task.names}
            per_pass = sum(math.ceil(n / t.batch_size) for n in sizes.values())
            total = total_steps(t, len(sizes), per_pass)
            sampler = TaskSampler(cfg.schedule, sizes, epoch_length(t, len(sizes), per_pass), total, 0)
            for task, n in sizes.items():
                ups = sum(sampler.probs(sampler.epoch_of(i))[task] for i in range(total))
                out.append({"schedule": cfg.schedule.name, "steps": total, "task": task, "examples": n,
                            "updates": ups, "passes": ups / math.ceil(n / t.batch_size)})
    return out


def run_part(name: str, a, extra: list[str], sweeps: dict) -> None:
    st = STUDIES[a.study]
    part, t0 = st["parts"][name], time.time()
    env = {}
    if name not in ("pilot", "ablations"):
        rule_file = a.out / "lr_rule.json"
        if not rule_file.is_file() and a.publish and (a.publish / "lr_rule.json").is_file():
            rule_file = a.publish / "lr_rule.json"  # the pilot ran in an earlier session: its published rule
        if not rule_file.is_file():
            sys.exit("study: no learning-rate rule yet; run `make study PART=pilot` first")
        # Study IV's pilot tunes only its new arms; the baseline, HIRE and PALs keep Study III's scales.
        rules = [st["inherit_rule"]] if st.get("inherit_rule") else []
        scale = {m: s for f in rules + [rule_file] for m, s in json.loads(f.read_text())["scale"].items()}
        env = {LR_ENV[m]: str(s) for m, s in scale.items() if m in LR_ENV}

    def sweep(preset: str, env: dict) -> None:
        sweep_dir = a.out / name / preset
        smoke = SMOKE + [f"hydra.sweeper.params.seed={a.smoke_seed}"] if a.smoke and name != "pilot" else \
            SMOKE if a.smoke else []
        if a.study in ("s3", "s4"):  # one job at a time, each published as it ends (scripts/study_jobs.py)
            sweeps[preset] = study_jobs.run_preset(
                preset, out=a.out / name, pub=a.publish or a.out, uri=a.uri, experiment=st["experiment"],
                extra=(SMOKE if a.smoke else []) + extra, env=env, sh=sh, bin_dir=BIN, smoke=a.smoke,
                plan=st.get("plan"))
        else:
            sh([str(BIN / "deepen-run"), "-m", f"+study={preset}", f"tracking.uri={a.uri}",
                f"hydra.sweep.dir={sweep_dir}", "resume=auto", *smoke, *extra], env=env)
            sweeps[preset] = json.loads((sweep_dir / "deepen_sweep.json").read_text())["sweep_id"]
        (a.out / "sweeps.json").write_text(json.dumps(sweeps, indent=1))

    # A pilot whose learning-rate rule an earlier session published goes on with the step-count pilot
    # (the MLflow store of those runs stayed on that machine); delete the published file to rerun it.
    ruled = name == "pilot" and a.publish is not None and (a.publish / "lr_rule.json").is_file()
    for preset in [] if ruled else part["presets"]:
        sweep(preset, env)
    if name == "pilot":
        if ruled:
            rule = json.loads((a.publish / "lr_rule.json").read_text())["scale"]
            print(f"study: the learning-rate rule published in {a.publish / 'lr_rule.json'}: {rule}", flush=True)
        else:
            rule = lr_rule(a.out, a.uri, sweeps, st)
            publish(a, {"lr_rule.json": "lr_rule.json"})
        if part.get("after_rule"):
            for preset in part["after_rule"]:
                sweep(preset, {LR_ENV[m]: str(s) for m, s in rule.items() if m in LR_ENV})
            steps_rule(a.out, a.uri, sweeps, st)
            publish(a, {"steps_rule.json": "steps_rule.json"})
        return
    if st.get("plan"):  # a planned study is read once, whole, by its plan (--part family)
        print(f"study: part {name} took {(time.time() - t0) / 60:.1f} min", flush=True)
        return
    ids, contrasts, own, secondary = what_to_report(name, sweeps, st)
    report(a.uri, a.out / name, ids, contrasts, own, st, secondary)
    publish(a, {f"{name}/seeds.csv": f"{name}_seeds.csv", f"{name}/report.md": f"{name}_report.md"})
    print(f"study: part {name} took {(time.time() - t0) / 60:.1f} min", flush=True)


def publish(a, files: dict[str, str]) -> None:
    """Copy a finished part's results (out-relative name -> published name) into the repo: the MLflow
    store stays on the machine that ran it, and a study of several sessions is reported from these."""
    if not a.publish:
        return
    a.publish.mkdir(parents=True, exist_ok=True)
    for src, dst in files.items():
        if (a.out / src).is_file():
            (a.publish / dst).write_bytes((a.out / src).read_bytes())
            print(f"study: published {a.publish / dst}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(prog="study", description=__doc__.split("\n")[0])
    p.add_argument("--study", choices=list(STUDIES), default="floor",
                   help="floor (the floor study), s3 (Study III) or s4 (Study IV, docs/plans/s4.yaml); see "
                   "docs/study.md; default: floor")
    p.add_argument("--part", help="one part (default: every primary part, then the report)")
    p.add_argument("--out", type=Path, help="default: outputs/study-floor, outputs/study-s3")
    p.add_argument("--uri", default=f"sqlite:///{ROOT}/outputs/mlflow.db")
    p.add_argument("--smoke", action="store_true", help="tiny scale, for a test of the pipeline")
    p.add_argument("--smoke-seed", default="1", help="with --smoke: the one seed of the floor study's non-pilot parts (s3: each preset's first seed)")
    p.add_argument("--command", action="store_true",
                   help="print the deepen-report command of the part's report (default: the whole study's) and exit")
    p.add_argument("--cost", action="store_true", help="print each part's jobs and estimated minutes and exit")
    p.add_argument("--updates", action="store_true", help="print each multi-task schedule's expected updates "
                   "per task (and passes over its training set) and exit")
    p.add_argument("--draw-layers", type=int, metavar="K", help="print the random K-layer draw and exit")
    p.add_argument("--layer-seed", type=int, default=1)
    p.add_argument("--publish", type=Path, help="where each part's rule files, per-seed CSV and report are copied "
                   "(default for --study s3: docs/results/s3; none with --smoke)")
    a, extra = p.parse_known_args()
    flags = [x for x in extra if x.startswith("-") or ("=" not in x and not x.startswith("~"))]  # the rest goes to deepen-run as overrides
    if flags:
        p.error(f"unrecognized arguments: {' '.join(flags)} (what is passed on to deepen-run are key=value overrides)")
    if a.draw_layers is not None:
        if not 1 <= a.draw_layers <= 6:
            p.error(f"--draw-layers {a.draw_layers}: MiniLM has 6 layers; draw 1 to 6")
        print(draw_layers(a.draw_layers, a.layer_seed))
        return
    st = STUDIES[a.study]
    family = a.part == "family" and ("family" in st or "plan" in st)  # a report, not a part to run
    if a.part == "design" and not (st.get("design_plan") and a.command):
        p.error("--part design is Study III's report by its design-time plan: use it with --study s3 --command")
    if a.part and a.part not in st["parts"] and not family and a.part != "design":
        p.error(f"--part {a.part}: study {a.study} has the parts {', '.join(st['parts'])}"
                + (" (and the report-only family)" if "family" in st else ""))
    if a.updates:
        print("| schedule | steps | task | training examples | expected updates | passes |\n|---|---|---|---|---|---|")
        for r in expected_updates(a.study):
            print(f"| {r['schedule']} | {r['steps']} | {r['task']} | {r['examples']} | {r['updates']:.0f} | {r['passes']:.1f} |")
        return
    if a.cost:
        rows = cost_table(a.study)
        print("| part | presets | jobs | minutes on 2 idle cores (estimate) |\n|---|---|---|---|")
        for r in rows:
            print(f"| {r['part']} | {', '.join(r['presets'])} | {r['jobs']} | {r['minutes']} |")
        print(f"| all | | {sum(r['jobs'] for r in rows)} | {sum(r['minutes'] for r in rows)} "
              f"({sum(r['minutes'] for r in rows) / 60:.1f} h) |")
        return
    a.out = a.out or ROOT / "outputs" / ("study-floor" if a.study == "floor" else f"study-{a.study}")
    a.out.mkdir(parents=True, exist_ok=True)
    if a.publish is None and a.study != "floor" and not a.smoke:
        a.publish = ROOT / "docs" / "results" / a.study
    sweeps = json.loads((a.out / "sweeps.json").read_text()) if (a.out / "sweeps.json").is_file() else {}
    if a.study != "floor":  # the presets every job of which is published, in this session or an earlier one
        done = {p: study_jobs.published(p, a.publish or a.out) for n in st["parts"].values() for p in
                n["presets"] + n.get("after_rule", [])}
        sweeps |= {p: files for p, files in done.items() if files}
    if a.command:  # the report's deepen-report command with this study's sweep ids, to run by hand
        ids, contrasts, own, secondary = what_to_report(a.part or "all", sweeps, st)
        design = st.get("design_plan") if a.part == "design" else None
        cmd = report_command(a.uri, ids, contrasts, own, st, secondary, design)
        if cmd[1] == "--uri" and a.uri == p.get_default("uri"):
            cmd[1:3] = []  # deepen-report's default store is this one
        print(shlex.join(x.removeprefix(f"{ROOT}/") for x in cmd))  # published files: relative to the repo
        return
    if family:  # its tables, its per-seed values joined into one file, both published
        ids, contrasts, own, secondary = what_to_report("family", sweeps, st)
        report(a.uri, a.out / "family", ids, contrasts, own, st, secondary)
        publish(a, {"family/report.md": "family_report.md",  # its values are the per-job files
                    "family/contrasts.png": "family_contrasts.png"})
        return
    for name in [a.part] if a.part else st["primary"]:
        run_part(name, a, extra, sweeps)
    if not a.part:  # the whole primary study: every row and every primary contrast in one report
        ids, contrasts, own, secondary = what_to_report("all", sweeps, st)
        report(a.uri, a.out / "all", ids, contrasts, own, st, secondary)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # the job it ran has saved its step and ended KILLED; no traceback of ours
        sys.exit("study: stopped by a signal; the same command continues where it stopped")
