"""Two small helpers several modules need: an error as one short line, and a SQLite store's path.

Light on purpose (standard library only): the CLI uses them before anything heavy is imported.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

SQLITE = "sqlite:///"


def one_line(text) -> str:
    """A multi-line message (Hydra's, a traceback's tail) folded onto one line."""
    return " ".join(ln.strip() for ln in str(text).splitlines() if ln.strip())


def first_line(e: BaseException, limit: int = 300) -> str:
    """`Type: first line of the message`, cut at `limit` characters: a tag, warning or table cell."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:limit]


def sqlite_path(uri: str) -> Optional[Path]:
    """The database file of a `sqlite:///<path>` tracking URI; None for any other store."""
    return Path(uri[len(SQLITE):]) if uri.startswith(SQLITE) else None
