"""A sweep's identity (its sweep dir and its jobs' overrides, `resume` aside, saved in deepen_sweep.json),
and continuing an interrupted sweep under its original parent run. Run again into its dir with
resume=auto, the same jobs continue the same sweep (jobs.py keeps the FINISHED ones); other jobs, or
no resume, are refused in one line naming what differs, before anything runs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from deepen_run.errors import UserError
from deepen_run.masking import mask_override
from deepen_run.run.clean import JOBS_DIR
from deepen_run.run.lifecycle import exclusive, holder
from deepen_run.sweep.check import job_overrides


def jobs_of(config) -> Optional[list[list[str]]]:
    """Each job's overrides as deepen_sweep.json keeps them: secrets masked, without `resume` (asking
    to resume does not change a job)."""
    jobs = job_overrides(config)
    if jobs is None:
        return None
    return [[mask_override(o) for o in job if o.split("=", 1)[0].lstrip("+~") != "resume"] for job in jobs]


def _differs(then: dict, now: dict) -> str:
    """The swept keys whose values differ, as `key: then -> now`."""
    skip = {"resume", "sweep.overrides", "sweep.hydra_overrides"}
    keys = [k for k in dict.fromkeys([*then, *now]) if k not in skip and then.get(k) != now.get(k)]
    return "; ".join(f"{k}: {then.get(k, '(not given)')} -> {now.get(k, '(not given)')}" for k in keys)


def check_same(old: dict, params: dict, jobs: Optional[list[list[str]]], sweep_dir: Path, resume: bool) -> None:
    """Raise UserError unless this command continues the sweep of sweep_dir (same jobs, resume asked)."""
    where = f"hydra.sweep.dir={sweep_dir} holds sweep {old['sweep_id']} (parent run {old['parent_run_id']})"
    if not resume:
        raise UserError(f"{where}; continue it with the same command plus resume=auto, or pass another "
                        "hydra.sweep.dir for a new sweep")
    # Job k is the same job if it has the same overrides, in whatever order they were typed.
    then, now = ([sorted(j) for j in js] if js is not None else None for js in (old.get("jobs"), jobs))
    same = then == now if then is not None and now is not None else not _differs(old.get("params", {}), params)
    if not same:
        what = _differs(old.get("params", {}), params) or (
            "the same jobs in another order, job k's run dir would hold another job's run: give the swept keys "
            "in their first order" if then is not None and now is not None and sorted(then) == sorted(now) else
            f"{len(old.get('jobs') or [])} jobs then, {len(jobs or [])} now (their overrides differ)")
        raise UserError(f"resume: {where} with other jobs ({what}); a resumed sweep keeps its jobs: drop the "
                        "change, or pass another hydra.sweep.dir for a new sweep")


LOCK = "launcher.lock"  # in <sweep dir>/deepen_jobs/: held by the one launcher of the sweep


def hold(sweep_dir: Path):
    """One launcher a sweep dir: an exclusive flock on <sweep dir>/deepen_jobs/launcher.lock, held for
    the launcher's life (the returned open file; lifecycle.exclusive). A killed launcher never blocks
    the resume. A second launcher (two resumes of one sweep at once) gets a UserError before it
    touches the parent or any job."""
    (sweep_dir / JOBS_DIR).mkdir(parents=True, exist_ok=True)
    try:
        return exclusive(sweep_dir / JOBS_DIR / LOCK)
    except BlockingIOError:
        raise UserError(f"hydra.sweep.dir={sweep_dir} is in use by another launcher of this sweep (pid host: "
                        f"{holder(sweep_dir / JOBS_DIR / LOCK)}); one sweep runs once at a time: wait for it to "
                        "end, or stop it first") from None


def reopen(old: dict, tracker, tags: dict) -> int:
    """The original parent run, RUNNING again with this launcher's pid; returns the step its counts
    continue at. The last attempt's job files go (each job writes its outcome anew)."""
    tracker.start(old["parent_run_id"], tags, run_id=old["parent_run_id"])
    tracker.resume()  # metrics and params it has; drops the last attempt's end-of-run tags
    jobs = Path(old["dir"]) / JOBS_DIR
    for f in list(jobs.glob("*.json")) + list(jobs.glob("STOP")):
        f.unlink()
    return 1 + max(tracker.logged.get("sweep/pending", {-1}))
