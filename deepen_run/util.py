"""Small helpers several layers need: an error as one short line, a SQLite store's path, whether
the Hugging Face Hub answers (the data checks and the backbone both ask).

Light on purpose (standard library only): the CLI uses them before anything heavy is imported.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import NoReturn, Optional
from urllib.parse import urlparse

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


def hub_reachable(timeout: float = 3.0) -> bool:
    """False offline (HF_HUB_OFFLINE) or when the Hub's host takes no connection within `timeout` s."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def phase(name: str) -> None:
    """Where a run's wall time goes, for `make bench` (scripts/benchkit/phases.py): with DEEPEN_PHASES=<file>
    set, append `<name> <unix time>`; otherwise nothing. About ten marks a run, none inside the loop."""
    path = os.environ.get("DEEPEN_PHASES")
    if path:
        with open(path, "a") as f:
            f.write(f"{name} {time.time():.6f}\n")


class QuickExit:
    """The end of a process whose work is done and recorded, without the interpreter's teardown.

    Freeing torch, transformers, MLflow and SQLAlchemy module by module at exit takes about 2 s
    (measured on a dry run here: 2.1 s from the run's end to the process's exit, 0.1 s this way),
    which a study of many short runs pays every time. Public means only: built first thing
    (cli.run.entry), it registers an atexit handler, which therefore runs last. `exit_now(code)` is
    sys.exit(code): the interpreter then stops thread pools and joins non-daemon threads, runs every
    atexit handler registered after ours (MLflow's, the quiet ranks' scratch dirs), and then ours
    flushes logging and the standard streams and calls os._exit(code). Only the garbage collection
    of modules is skipped; the operating system reclaims that memory at once. A process that never
    calls it (an error exit) ends the ordinary way.
    """

    def __init__(self) -> None:
        import atexit

        self.code: Optional[int] = None
        atexit.register(self.last)

    def __call__(self, code: int = 0) -> NoReturn:
        import sys

        self.code = code
        sys.exit(code)

    def last(self) -> None:
        if self.code is None:
            return
        import logging
        import sys

        logging.shutdown()  # its own atexit hook was registered before ours (logging came first): skipped
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed or broken pipe: nothing more can reach it
                pass
        os._exit(self.code)
