"""The job files in a sweep dir, the one channel every process of a sweep shares (docs in
deepen_run/sweep/jobs.py): each written atomically, read back by job number, and watched by the
launching process, which prints a line as a job starts and as it ends."""
from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Optional

from deepen_run.run.clean import JOBS_DIR, SWEEP_FILE
from deepen_run.util import first_line as _one_line


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)  # atomic: the watcher never reads half a file


def previous(sweep_dir: Path) -> Optional[dict]:
    """The sweep's identity (<sweep dir>/deepen_sweep.json), None where the dir holds no sweep."""
    f = sweep_dir / SWEEP_FILE
    return json.loads(f.read_text()) if f.is_file() else None


def read_outcomes(sweep_dir: Path) -> dict[int, dict]:
    """How each ended job ended: job number -> its outcome file."""
    return _read(sweep_dir, ".json")


def read_starts(sweep_dir: Path) -> dict[int, dict]:
    """The jobs that started (in this attempt): job number -> overrides and pid."""
    return _read(sweep_dir, ".start.json")


def _read(sweep_dir: Path, suffix: str) -> dict[int, dict]:
    out = {}
    for f in (sweep_dir / JOBS_DIR).glob(f"*{suffix}"):
        stem = f.name[:-len(suffix)]
        if stem.isdigit():
            out[int(stem)] = json.loads(f.read_text())
    return out


def start_line(num: int, n: Optional[int], overrides: list[str]) -> str:
    from deepen_run.masking import mask_override  # a password in tracking.uri, say: printed as ***

    return f"[job {num + 1}/{n if n is not None else '?'}] started: {' '.join(map(mask_override, overrides))}"


def watch(sweep_dir: Path, n: Optional[int], stop: threading.Event, counts, on_end=None) -> None:
    """Print '[job k/N] ...' when a job starts and when it ends, whichever process ran it; the parent's
    counts (counts.log), then on_end() (the run note, summary.update), follow each end. A job in this
    process (the basic launcher) prints its own start line: polled, it would come after the job's
    first lines."""
    seen: set[str] = set()
    total = n if n is not None else "?"
    while True:
        done = stop.is_set()
        ended = False
        for f in sorted((sweep_dir / JOBS_DIR).glob("*.json"), key=lambda p: p.stat().st_mtime):
            if f.name in seen:
                continue
            seen.add(f.name)
            num, _, kind = f.name.partition(".")
            d = json.loads(f.read_text())
            k = f"[job {int(num) + 1}/{total}]"
            ended = ended or kind == "json"
            if kind == "start.json":
                if d.get("pid") != os.getpid():
                    print(start_line(int(num), n, d["overrides"]), flush=True)
            elif d["status"] == "FINISHED":
                said = "a dry run: no eval/score" if d.get("dry_run") else f"eval/score={d['score']:.4f}"
                print(f"{k} kept: {d['name']} FINISHED before  {said}" if d.get("kept") else
                      f"{k} FINISHED {d['name']}  {said}  ({d['seconds']:.0f} s)", flush=True)
            else:
                print(f"{k} {d['status']} {d['name']}  {d['error']}  ({d['seconds']:.0f} s)", flush=True)
        if ended and not done:  # at the end, Launch.close writes both itself
            try:
                counts.update(read_outcomes(sweep_dir)).log()
                if on_end is not None:
                    on_end()
            except Exception as e:  # noqa: BLE001 (the store may be what failed; the note is a view: the sweep goes on)
                print(f"deepen-run: warning: the sweep's counts or run note were not updated: {_one_line(e)}",
                      file=sys.stderr)
        if done:
            return
        stop.wait(0.5)
