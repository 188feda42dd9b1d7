"""The run dir's log holds what the run printed: console output is copied into Hydra's job log.

Hydra's log file (<run dir>/<job name>.log) only receives `logging` records, and a run speaks through
print and progress bars, so the file stayed empty. While a job runs, stdout and stderr are copied
into it line by line. A progress bar redraws its line with carriage returns: the file keeps only
what a line finally showed, so a bar leaves one line, not one per redraw. The console is untouched
(a bar still sees a terminal through isatty).
"""
from __future__ import annotations

import logging
import re
import sys
from contextlib import contextmanager
from typing import IO, Optional


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # cursor moves of nested bars mean nothing in a file


class Tee:
    def __init__(self, stream: IO[str], file: IO[str]):
        self.stream, self.file, self.partial = stream, file, ""

    def write(self, s: str) -> int:
        n = self.stream.write(s)
        *lines, rest = (self.partial + s).split("\n")
        for line in lines:
            self.file.write(ANSI.sub("", line.rsplit("\r", 1)[-1]) + "\n")
        self.partial = rest.rsplit("\r", 1)[-1]  # a redraw replaces the line so far
        if lines:
            self.file.flush()
        return n

    def flush(self) -> None:
        self.stream.flush()

    def close_line(self) -> None:
        if self.partial.strip("\r "):
            self.file.write(ANSI.sub("", self.partial.rsplit("\r", 1)[-1]) + "\n")
        self.partial = ""

    def __getattr__(self, name):  # isatty, fileno, encoding, ...: the console's
        return getattr(self.stream, name)


def job_log_path() -> Optional[str]:
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            return h.baseFilename
    return None


@contextmanager
def copied_to_log():
    """Within: what is printed also goes to the job's log file (no-op when logging is off)."""
    path = job_log_path()
    if path is None:
        yield
        return
    with open(path, "a", encoding="utf-8") as f:
        out, err = Tee(sys.stdout, f), Tee(sys.stderr, f)
        sys.stdout, sys.stderr = out, err
        try:
            yield
        finally:
            sys.stdout, sys.stderr = out.stream, err.stream
            out.close_line()
            err.close_line()
