"""`make clean` / `make clean-all`: remove what deepen-run and its scripts wrote under outputs/, and
nothing else. The standard library only, so it runs without the virtualenv (`python3 -m
deepen_run.run.clean outputs [--store]`); run/rundir.py, the run dir's guard, shares its names.
"""
from __future__ import annotations

import fcntl
import os
import sys
from contextlib import ExitStack
from pathlib import Path

from deepen_run.safe_fs import link_on_the_way, remove, remove_empty_dirs

# What a sweep writes in its dir (deepen_run/sweep/jobs.py): named here, below the sweep layer, so this
# module knows them without importing the sweep.
SWEEP_FILE = "deepen_sweep.json"
JOBS_DIR = "deepen_jobs"

# Entries a run dir or sweep dir of ours may hold; anything else marks a folder as the user's.
# data_fingerprint.json: deepen_run/data/fingerprint.py's FILE (named here: this module is stdlib-only).
RUN_FILE, RUN_CONFIG = "run.json", "run_config.yaml"  # run/resume.py's record and config
RUN_RECORDS = (RUN_FILE, RUN_CONFIG)
SWEEP_RECORDS = ("multirun.yaml", SWEEP_FILE, JOBS_DIR)
LOGS = ("cli.log", "probe_cli.log")  # Hydra's job logs: deepen-run's, deepen-probe's (conf/probe.yaml)
OURS = frozenset({".hydra", ".lock", "checkpoints", "submission", "data_fingerprint.json", *RUN_RECORDS,
                  *(f".{r}.tmp" for r in RUN_RECORDS),  # a write that failed before its rename
                  *SWEEP_RECORDS})

# What our folders inside a run or sweep dir hold, by suffix: Hydra's .hydra/ (config, hydra and
# overrides .yaml), checkpoints/<step-N|best|.*.tmp>/ (Accelerate's save_state: .safetensors, .bin,
# .pkl, .pt; our trainer_state.json), submission/ (.tsv), deepen_jobs/ (.json, STOP, the resume lock).
INSIDE = ((".hydra", (".yaml",)), ("checkpoints", (".safetensors", ".bin", ".pkl", ".pt", ".json")),
          ("submission", (".tsv",)), (JOBS_DIR, (".json", ".lock", "STOP")))


def _holds_only(folder: Path, suffixes: tuple[str, ...], depth: int) -> bool:
    for p in folder.iterdir():
        if p.is_symlink():
            return False
        if p.is_dir():
            if depth == 0 or not _holds_only(p, suffixes, depth - 1):
                return False
        elif not p.name.endswith(suffixes):
            return False
    return True


def _only_ours(folder: Path) -> bool:
    """Every entry, all the way down, is one deepen-run writes; a link anywhere is the user's."""
    inside = dict(INSIDE)
    for p in folder.iterdir():
        if p.is_symlink():
            return False
        if p.name in inside and p.is_dir():
            if not _holds_only(p, inside[p.name], depth=1 if p.name == "checkpoints" else 0):
                return False
        elif p.name in LOGS and p.is_file():
            continue
        elif p.name.isdigit() and p.is_dir():
            if not _only_ours(p):
                return False
        elif p.name not in OURS or p.is_dir() != (p.name in ("checkpoints", "submission", ".hydra", JOBS_DIR)):
            return False
    return True


# make clean / clean-all: what deepen-run and its scripts write under outputs/; anything else stays.
STORE = ("mlflow.db", "mlflow.db.lock", "mlartifacts", "study", "study-floor", "study-s3", "bench")  # scripts/study.py --out


# The locks a live process holds: a run's run-dir lock (run/lifecycle.py LOCK; in a sweep, each job's
# <n>/.lock) and a sweep launcher's deepen_jobs/launcher.lock (sweep/resume.py LOCK).
LOCKS = (".lock", "launcher.lock")


def hold_locks(folder: Path, stack: ExitStack) -> bool:
    """Take every run or sweep lock in `folder` (its job folders and deepen_jobs/ too) for as long as
    `stack` is open, so no run can start there while it is removed. False (nothing kept) if a live
    process holds one: the folder is in use."""
    # The folder itself first: run/rundir.py's guard holds it from its checks until the runner's .lock.
    for lock in (folder, *(p for name in LOCKS for p in (*folder.glob(name), *folder.glob(f"*/{name}")))):
        try:  # O_NOFOLLOW: a lock that is a link is not ours to open (and _only_ours keeps it anyway)
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # gone meanwhile, or a link
        stack.callback(os.close, fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
    return True


def clean(outputs: Path, store: bool = False) -> list[Path]:
    """Remove the run dirs (outputs/runs/<date>/<time>) and sweep dirs (outputs/multiruns/<date>/<time>)
    that hold only what deepen-run writes, the tokenization cache's files, and with store=True the
    MLflow store and the scripts' outputs. A folder with anything else in it is kept and named; a link
    is never followed (deepen_run/safe_fs.py): it stays, named."""
    removed, left, dirs = [], [], []  # left: what stays, each said in a line
    for base in ("runs", "multiruns"):
        if link_on_the_way(outputs / base, outputs):
            left.append(f"{outputs / base} is a link: not followed, left as it is")
            continue
        for d in sorted((outputs / base).glob("*/*")):
            if link_on_the_way(d, outputs):
                left.append(f"{d} is a link (or lies behind one): not followed, left as it is")
            elif d.is_dir() and _only_ours(d):
                dirs.append(d)
            else:
                left.append(f"{d}: it holds files deepen-run did not make")
    cache = outputs / "cache"
    if cache.is_symlink():
        left.append(f"{cache} is a link: not followed, left as it is")
    else:
        removed += [p for p in cache.glob("*") if not p.is_symlink() and p.is_file()
                    and p.suffix in (".arrow", ".lock")]
    removed += [outputs / n for n in STORE if store and ((outputs / n).exists() or (outputs / n).is_symlink())]
    gone = []
    for p in removed:
        why = remove(p, outputs)
        (left.append(why) if why else gone.append(p))
    for d in dirs:  # each run or sweep dir removed while its locks are ours: none is in use meanwhile
        with ExitStack() as locks:
            if not hold_locks(d, locks):
                left.append(f"{d}: a run or sweep is using it (its lock is held); stop it first, or clean later")
                continue
            why = remove(d, outputs)
            (left.append(why) if why else gone.append(d))
    for folder in [*(outputs / b for b in ("runs", "multiruns")), cache]:
        remove_empty_dirs(folder, outputs)
    for line in left:
        print(f"kept {line}")
    return gone


if __name__ == "__main__":  # make clean: python -m deepen_run.run.clean <outputs> [--store]
    gone = clean(Path(sys.argv[1]), store="--store" in sys.argv[2:])
    print(f"removed {len(gone)} entries under {sys.argv[1]}")
