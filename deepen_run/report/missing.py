"""`deepen-report --sweep-id`: which of a sweep's children are not in the table, and why.

A row's cell averages the FINISHED children it has; a failed, killed or never-started job is simply
absent from it. This names each one (job number, run name, status and its error), so a thin cell is
explained and the sweep can be completed (the same command plus resume=auto).
"""
from __future__ import annotations

from deepen_run.tracking.store import find_runs


def missing_lines(uri: str, experiment: str, sweep_id: str) -> list[str]:
    parents = find_runs(uri, experiment, {"sweep_id": sweep_id, "sweep_role": "parent"})
    children = find_runs(uri, experiment, {"sweep_id": sweep_id, "sweep_role": "child"})
    jobs = parents[0]["params"].get("sweep.jobs", "?") if parents else "?"
    latest = {}  # job number -> its child (the newest, if a job ran twice)
    for c in children:
        if c["tags"].get("sweep_job", "").isdigit():
            latest[int(c["tags"]["sweep_job"])] = c
    numbers = range(int(jobs)) if jobs.isdigit() else sorted(latest)
    out = []
    for k in numbers:
        c = latest.get(k)
        if c is None:
            out.append(f"job {k + 1}: no run recorded (never started, or stopped before its run began)")
        elif c["status"] != "FINISHED":
            why = c["tags"].get("error") or c["tags"].get("interrupted") or ""
            out.append(f"job {k + 1} {c['name']}: {c['status']}" + (f" ({why[:200]})" if why else ""))
    if not out:
        return []
    head = (f"sweep {sweep_id}: {len(numbers) - len(out)} of {len(numbers)} children are in the table; "
            "missing from their row:")
    return [head, *(f"  {line}" for line in out),
            "  (continue the sweep: its command plus resume=auto; the report then covers them)"]
