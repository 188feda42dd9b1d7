"""`make clean` / `make clean-all`: remove what deepen-run and its scripts wrote under outputs/, and
nothing else. The standard library only, so it runs without the virtualenv (`python3 -m
deepen_run.run.clean outputs [--store]`); run/rundir.py, the run dir's guard, shares its names.
"""
from __future__ import annotations

import shutil
from pathlib import Path

# What a sweep writes in its dir (deepen_run/sweep/jobs.py): named here, below the sweep layer, so this
# module knows them without importing the sweep.
SWEEP_FILE = "deepen_sweep.json"
JOBS_DIR = "deepen_jobs"

# Entries a run dir or sweep dir of ours may hold; anything else marks a folder as the user's.
RUN_RECORDS = ("run.json", "run_config.yaml")
SWEEP_RECORDS = ("multirun.yaml", SWEEP_FILE, JOBS_DIR)
OURS = frozenset({".hydra", ".lock", "checkpoints", "submission", *RUN_RECORDS, *SWEEP_RECORDS})


def _only_ours(folder: Path) -> bool:
    """Every entry, all the way down past our own records, is one deepen-run writes."""
    for p in folder.iterdir():
        if p.name in (".hydra", "checkpoints", "submission", JOBS_DIR, "cli.log"):
            continue
        if p.name.isdigit() and p.is_dir():
            if not _only_ours(p):
                return False
        elif p.name not in OURS:
            return False
    return True


# make clean / clean-all: what deepen-run and its scripts write under outputs/; anything else stays.
STORE = ("mlflow.db", "mlflow.db.lock", "mlartifacts", "study", "bench")


def clean(outputs: Path, store: bool = False) -> list[Path]:
    """Remove the run dirs (outputs/runs/<date>/<time>) and sweep dirs (outputs/multiruns/<date>/<time>)
    that hold only what deepen-run writes, the tokenization cache's files, and with store=True the
    MLflow store and the scripts' outputs. A folder with anything else in it is kept and named."""
    removed, kept = [], []
    for base in ("runs", "multiruns"):
        for d in sorted((outputs / base).glob("*/*")):
            (removed if d.is_dir() and _only_ours(d) else kept).append(d)
    cache = outputs / "cache"
    removed += [p for p in cache.glob("*") if p.is_file() and p.suffix in (".arrow", ".lock")]
    removed += [outputs / n for n in STORE if store and (outputs / n).exists()]
    for p in removed:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    for folder in [*(outputs / b for b in ("runs", "multiruns")), cache]:
        for d in sorted(folder.glob("*"), reverse=True) if folder.is_dir() else []:
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    for d in kept:
        print(f"kept {d}: it holds files deepen-run did not make")
    return removed


if __name__ == "__main__":  # make clean: python -m deepen_run.run.clean <outputs> [--store]
    import sys

    gone = clean(Path(sys.argv[1]), store="--store" in sys.argv[2:])
    print(f"removed {len(gone)} entries under {sys.argv[1]}")
