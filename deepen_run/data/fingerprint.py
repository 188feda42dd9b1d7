"""A run's training data, fingerprinted when it starts and checked when it resumes.

A resumed run must train on the data it started with: otherwise it continues silently on other
examples (its step counts, data/train_examples and the sampling schedule all describe the old files).
The fingerprint is each GLUE file's size and SHA-256, in <run dir>/data_fingerprint.json; a resume
whose files differ is refused with one line naming the file. Data from the Hub (data.glue_dir unset)
is versioned by the datasets cache and is not fingerprinted.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

from deepen_run.errors import UserError

FILE = "data_fingerprint.json"


def data_files(cfg, tasks) -> list[Path]:
    """The GLUE files the run reads (train, dev, and test with predict=true)."""
    if not cfg.data.glue_dir or cfg.dry_run:
        return []
    root = Path(cfg.data.glue_dir)
    out = []
    for spec in tasks:
        stems = ["train"] + [s for s, _ in spec.dev_splits] + ([s for s, _ in spec.test_splits] if cfg.predict else [])
        out += [root / spec.folder / f"{s}.tsv" for s in stems]
    return [f.resolve() for f in dict.fromkeys(out) if f.is_file()]


def digest(f: Path) -> str:
    """A file's size and SHA-256 (also the tokenization cache's key: data/loaders.py)."""
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return f"{f.stat().st_size}:{h.hexdigest()}"


def fingerprint(cfg, tasks) -> dict[str, str]:
    return {str(f): digest(f) for f in data_files(cfg, tasks)}


def save_fingerprint(home: Optional[Path], cfg, tasks) -> None:
    """Called when a new run starts (never on a resume)."""
    if home is not None and tasks:
        (home / FILE).write_text(json.dumps(fingerprint(cfg, tasks), indent=1))


def same_data(home: Path, cfg, tasks) -> None:
    """Refuse to resume on changed data, naming the first file that differs."""
    f = home / FILE
    if not f.is_file():
        return  # a run from before fingerprints: nothing to compare with
    then, now = json.loads(f.read_text()), fingerprint(cfg, tasks)
    for path in sorted(set(then) | set(now)):
        if then.get(path) != now.get(path):
            what = "is gone" if path not in now else "is new" if path not in then else "changed since the run started"
            raise UserError(f"resume: data file {path} {what}; a resumed run trains on the data it started with "
                            f"(restore the file, or start a new run without resume)")
