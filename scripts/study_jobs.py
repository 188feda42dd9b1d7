"""Study III's unit of work is one job, not one part: each job runs as a sweep of its own and its
per-seed values are published the moment it finishes (<publish>/jobs/<preset>/<job>.csv, with each
row's whole key), so a part that a session's end cuts short keeps every job it finished, and the
same command in the next session runs only the rest. deepen-report --from-csv joins the files.

Why: on a 2-core CPU without bf16 a multi-task job of 600 steps takes about 10 minutes and a part
two hours or more (docs/study.md, "Parts and their cost"), longer than a session leaves beside
other work; the MLflow store, under outputs/, does not outlive the session's machine.
"""
from __future__ import annotations

import csv
import functools
import json
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def conf_dir():
    """Hydra's compose over conf/, with the methods' schemas registered as deepen-run registers them."""
    sys.path.insert(0, str(ROOT))
    from hydra import initialize_config_dir

    from deepen_run.config.schema import register
    from deepen_run.methods import schemas

    register(schemas())
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        yield


@functools.cache  # composed once a process: the study asks at start-up and again per part
def sweep_jobs(preset: str) -> tuple[tuple[str, ...], ...]:
    """Each job's overrides of a preset's sweep, +study= included, in launch order (as the sweep
    enumerates them)."""
    from hydra import compose

    from deepen_run.sweep.check import job_overrides

    with conf_dir():
        grid = compose(config_name="config", overrides=[f"+study={preset}"], return_hydra_config=True)
    return tuple(tuple(job) for job in job_overrides(grid))


def preset_jobs(preset: str) -> list[list[str]]:
    """Each job's overrides without the +study= override every job shares."""
    return [[o for o in job if not o.startswith("+study=")] for job in sweep_jobs(preset)]


def job_name(job: list[str]) -> str:
    """A file name from a job's overrides: +arm=floor_hire task=sst2 seed=101 -> arm-floor_hire_task-sst2_seed-101."""
    return "_".join(re.sub(r"[^A-Za-z0-9_.]+", "-", o.lstrip("+")) for o in job)


def seed_of(job: list[str]) -> str:
    return next((o.split("=", 1)[1] for o in job if o.startswith("seed=")), "")


def published(preset: str, pub: Path) -> list[str] | None:
    """The preset's job files when every job has one (the preset is done), else None."""
    files = [pub / "jobs" / preset / f"{job_name(j)}.csv" for j in preset_jobs(preset)]
    return [str(f) for f in files] if all(f.is_file() for f in files) else None


def record_plan(plan: Path, pub: Path) -> str:
    """The study plan's sha256 (as deepen-report --plan computes it); its text kept beside the jobs as
    <pub>/jobs/plan-<sha>.yaml, so a report given an edited plan can show what changed."""
    from deepen_run.report.plan import parse, sha

    text = plan.read_text()
    parse(text, plan)  # a broken plan stops the study before its first job
    s = sha(text)
    kept = pub / "jobs" / f"plan-{s}.yaml"
    if not kept.is_file():
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(text)
    return s


def stamp(path: Path, plan_sha: str) -> None:
    """Add the plan's sha to every line of a job's per-seed file (column `plan`)."""
    with path.open(newline="") as f:
        lines = list(csv.DictReader(f))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*lines[0].keys(), "plan"] if lines else ["plan"])
        w.writeheader()
        w.writerows(line | {"plan": plan_sha} for line in lines)


def run_preset(preset: str, *, out: Path, pub: Path, uri: str, experiment: str, extra: list[str], env: dict,
               sh, bin_dir: Path, smoke: bool = False, plan: Path | None = None) -> list[str]:
    """Run the preset's jobs that have no published file yet, one sweep each, publishing each as it
    ends; return every job's file. smoke: the jobs of the preset's first seed only. plan: the study's
    plan file, whose sha each job file records (deepen_run/report/plan.py)."""
    plan_sha = record_plan(plan, pub) if plan else None
    # Seed by seed, so that a part cut short leaves whole pairs (every arm of a seed) to compare.
    jobs = sorted(preset_jobs(preset), key=seed_of)
    if smoke:
        jobs = [j for j in jobs if seed_of(j) == seed_of(jobs[0])]
    files = []
    for i, job in enumerate(jobs, 1):
        name = job_name(job)
        path = pub / "jobs" / preset / f"{name}.csv"
        if path.is_file():
            print(f"study: {preset} [{i}/{len(jobs)}] {name}: published earlier", flush=True)
        else:
            t0, sweep_dir = time.time(), out / preset / name
            sh([str(bin_dir / "deepen-run"), "-m", f"+study={preset}", *job, f"tracking.uri={uri}",
                f"hydra.sweep.dir={sweep_dir}", "resume=auto", *extra], env=env)
            sweep_id = json.loads((sweep_dir / "deepen_sweep.json").read_text())["sweep_id"]
            path.parent.mkdir(parents=True, exist_ok=True)
            part = path.with_name(f"{name}.partial.csv")  # renamed when whole: a .csv file is a finished job
            sh([str(bin_dir / "deepen-report"), "--uri", uri, "--experiment", experiment, "--sweep-id", sweep_id,
                "--json", "--seeds-csv", str(part)], capture=True)
            if plan_sha:
                stamp(part, plan_sha)
            part.replace(path)
            print(f"study: {preset} [{i}/{len(jobs)}] {name}: {(time.time() - t0) / 60:.1f} min, published {path}",
                  flush=True)
        files.append(str(path))
    return files
