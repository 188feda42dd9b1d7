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


def _named_files(cfg, tasks, test: bool) -> dict[str, Path]:
    """<TASK folder>/<stem>.tsv -> the file, for the GLUE files the run reads that exist."""
    if not cfg.data.glue_dir or cfg.dry_run:
        return {}
    root, out = Path(cfg.data.glue_dir), {}
    for spec in tasks:
        stems = ["train"] + [s for s, _ in spec.dev_splits] + ([s for s, _ in spec.test_splits] if test else [])
        out |= {f"{spec.folder}/{s}.tsv": root / spec.folder / f"{s}.tsv" for s in stems}
    return {name: f for name, f in out.items() if f.is_file()}


def data_files(cfg, tasks) -> list[Path]:
    """The GLUE files the run reads (train, dev, and test with predict=true)."""
    return list(dict.fromkeys(f.resolve() for f in _named_files(cfg, tasks, bool(cfg.predict)).values()))


def data_id(cfg, tasks, prints: Optional[dict[str, str]] = None) -> Optional[str]:
    """What the run's scores depend on of its data, wherever the folder is: 12 hex digits of a SHA-256
    over each train and dev file's name in the GLUE layout (SST-2/train.tsv) and digest. The same
    files under another path (a copy, `<checkout>/../shared/glue` or the resolved path) give the same
    id, so deepen-report keys its rows by it, not by data.glue_dir. Test files are left out (only
    predict=true reads them; they hold no labels). prints: a fingerprint() already computed. None: Hub data."""
    named = _named_files(cfg, tasks, test=False)
    if not named:
        return None
    prints, h = prints or {}, hashlib.sha256()
    for name, f in sorted(named.items()):
        h.update(f"{name}={prints.get(str(f.resolve())) or digest(f)}\n".encode())
    return h.hexdigest()[:12]


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
