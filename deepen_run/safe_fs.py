"""Removing and writing files without harming anyone else's: the one helper every cleanup uses
(`make clean` in run/clean.py, a failed attempt's removal in run/rundir.py, `deepen-report --out`).
docs/reliability.md, "Cleanups", says the rules:

- A link is never followed. A link met where something of ours should be (outputs/cache, a run dir,
  outputs/mlartifacts) is left as it is and named; inside a folder being removed, a link is removed
  as a link, and what it points to stays.
- A failure to remove one entry (permissions, a busy file) is one line naming it, and the rest goes on:
  never an OSError traceback halfway through.
- A folder we write files into keeps a manifest of what we wrote (name and SHA-256). A file of the same
  name that is not in the manifest, or that changed since, is the user's: we refuse rather than
  overwrite it.

The standard library only: `make clean` runs without the virtualenv.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Optional


def link_on_the_way(path: Path, root: Path) -> Optional[Path]:
    """The first link among `path` and its folders below `root` (root itself is where the user
    pointed us, so it may be one), or None. A path outside root counts as a link: never ours."""
    try:
        rel = path.relative_to(root)
    except ValueError:
        return path
    p = root
    for part in rel.parts:
        p = p / part
        if p.is_symlink():
            return p
    return None


def remove(path: Path, root: Path) -> Optional[str]:
    """Remove a file or a whole folder that lies in root's tree, following no link. Returns None when
    done, or why it was left (a link, or the OSError in one line) for the caller to name."""
    link = link_on_the_way(path, root)
    if link is not None:
        return f"{link} is a link (or outside {root}): not followed, left as it is"
    problems: list[str] = []

    def onerror(func, p, exc_info):
        problems.append(f"{p}: {exc_info[1].strerror or exc_info[1]}")

    try:
        if path.is_dir():
            shutil.rmtree(path, onerror=onerror)  # removes links inside as links (never their targets)
        elif path.exists():
            path.unlink()
    except OSError as e:
        problems.append(f"{path}: {e.strerror or e}")
    return f"could not remove {problems[0]}" + (f" and {len(problems) - 1} more" if len(problems) > 1 else "") \
        if problems else None


def remove_empty_dirs(folder: Path, root: Path) -> None:
    """rmdir `folder`'s empty subfolders (one level: outputs/runs/<date>) and then folder itself, if
    empty; never a link."""
    if not folder.is_dir() or link_on_the_way(folder, root) is not None:
        return
    for d in sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()):
        try:
            d.rmdir()
        except OSError:
            pass  # not empty, or not ours to remove: left
    try:
        folder.rmdir()
    except OSError:
        pass


MANIFEST = ".deepen-written.json"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest(folder: Path) -> dict[str, str]:
    try:
        data = json.loads((folder / MANIFEST).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


class NotOurs(Exception):
    """A write would replace what someone else wrote (the message is one line naming it)."""


def check_owned(folder: Path, names: list[str]) -> None:
    """Refuse (NotOurs) unless each of `names` in `folder` is missing, or a plain file we wrote there
    last (in the manifest, same SHA-256). `folder` must be a folder or not exist yet."""
    if folder.exists() and not folder.is_dir():
        raise NotOurs(f"{folder} is a file, not a folder")
    known = _manifest(folder)
    for name in names:
        p = folder / name
        if not p.exists() and not p.is_symlink():
            continue
        if p.is_symlink() or not p.is_file():
            raise NotOurs(f"{p} is a link or a folder, not a file this tool wrote")
        if known.get(name) != _sha(p):
            raise NotOurs(f"{p} is not a file this tool wrote (or it was edited since)")


def write_owned(folder: Path, files: dict[str, Callable[[Path], None]]) -> list[Path]:
    """Write each file (name -> fill(path)) into folder after check_owned, each through a temporary
    file renamed over the old one, and record it in the folder's manifest."""
    check_owned(folder, list(files))
    folder.mkdir(parents=True, exist_ok=True)
    known = _manifest(folder)
    out = []
    for name, fill in files.items():
        final = folder / name
        tmp = folder / f".{name}.tmp{os.getpid()}{final.suffix}"  # savefig picks the format by suffix
        try:
            fill(tmp)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                tmp.unlink()
        known[name] = _sha(final)
        out.append(final)
    (folder / MANIFEST).write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
    return out


def unwritable(path: Path, flag: str, overwrite: bool = False, overwrite_flag: str = "--overwrite") -> Optional[str]:
    """Why the file `path` may not be written, in one line naming `flag`, or None. Asked before any
    heavy work: a folder, a file that exists (the user's: replaced only with overwrite), a parent that
    is a file or that this account cannot write in."""
    path = Path(path)
    if path.is_dir():
        return f"{flag} {path} is a folder; give the path of a file to write"
    if (path.exists() or path.is_symlink()) and not overwrite:
        return f"{flag} {path} exists; pass {overwrite_flag} to replace it, or name a new file"
    if path.exists() and not os.access(path, os.W_OK):
        return f"{flag} {path}: you cannot write this file"
    parent = next((p for p in path.parents if p.exists()), Path("."))
    if not parent.is_dir():
        return f"{flag} {path}: {parent} is a file, not a folder"
    import tempfile

    try:  # a file made and gone at once: what a write will meet (os.access says yes to root on /proc)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        return f"{flag} {path}: you cannot write in {parent} ({e.strerror or e})"
    return None


def shared_mode(*paths: Path) -> None:
    """Give files the mode every other file gets (0666 less the umask: 0644 by default). Some writers
    (safetensors) create theirs 0600, so another account could not load a model folder meant to be shared."""
    mask = os.umask(0)
    os.umask(mask)
    for p in paths:
        for f in ([p] if not Path(p).is_dir() else [q for q in Path(p).rglob("*") if q.is_file()]):
            if not f.is_symlink():
                os.chmod(f, 0o666 & ~mask)


def path_part(name: str) -> str:
    """`name` (an MLflow experiment's, any text) as one folder name that stays where it is put: no '/',
    no '..', no leading dot. A name that needs no change keeps it; another gets its safe characters
    and a short hash of the whole, so two names never share a folder."""
    import re

    safe = re.sub(r"[^A-Za-z0-9_.=+-]", "_", name)
    if safe == name and not name.startswith(".") and name:
        return name
    return f"{safe.strip('.') or 'x'}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"
