"""How many threads a run computes on, and how they wait (docs/performance.md, section Threads): the
CPUs the process may use (OMP_NUM_THREADS, else the smaller of its affinity and its cgroup's quota,
shared by the processes of one node), OpenMP waiting passively unless the user chose a policy. A
spinning thread takes the core another process, or this run's next thread, needs. Recorded as params."""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Mapping, Optional

WAIT = "OMP_WAIT_POLICY"
CGROUP = Path("/sys/fs/cgroup")


def quiet_waits(environ=os.environ) -> None:
    """OpenMP threads sleep while they wait, unless the user chose otherwise. Effective only before
    torch (libgomp) is loaded in this process, so not set after (the record would claim a policy that
    did not take); its children (a sweep's joblib workers) inherit it."""
    if "torch" not in sys.modules:
        environ.setdefault(WAIT, "PASSIVE")


def cgroup_quota(root: Path = CGROUP) -> Optional[float]:
    """The CPUs this process's cgroup may use (quota / period), None where unlimited or unknown."""
    try:  # cgroup v2: "max 100000" or "150000 100000"
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1: -1 = unlimited
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def choose_threads(environ: Mapping[str, str] = os.environ, cpus: Optional[int] = None,
                   quota: Optional[float] = -1.0) -> tuple[int, str]:
    """-> (intra-op threads, why). cpus: the affinity's size (default: this process's); quota: the
    cgroup's CPUs (default: read; None = unlimited)."""
    given = environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given), f"OMP_NUM_THREADS={given}"
    if cpus is None:  # os.sched_getaffinity: Linux only
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_quota() if quota == -1.0 else quota
    usable = cpus if quota is None else max(1, min(cpus, math.floor(quota)))
    local = environ.get("LOCAL_WORLD_SIZE", "1").strip()
    procs = int(local) if local.isdigit() and int(local) > 0 else 1
    n = max(1, usable // procs)
    why = f"{cpus} CPUs in affinity, cgroup quota {'none' if quota is None else f'{quota:g}'}"
    return n, why + (f", shared by {procs} processes on this node" if procs > 1 else "")


def set_threads(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Apply the choice to torch; -> the params that record it and how OpenMP waits."""
    import torch

    n, why = choose_threads(environ)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    wait = environ.get(WAIT, "unset (libgomp spins before it sleeps)")
    return {"train/threads": str(n), "train/threads_reason": f"{why}; {WAIT} {wait}"}
