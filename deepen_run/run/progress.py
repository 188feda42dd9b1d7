"""What a run prints. Training progress: a tqdm bar in a terminal; elsewhere (SLURM, nohup, CI logs),
where a bar's carriage returns leave one line per redraw, a plain line about every 5% of the run and
at least every PLAIN_EVERY_S seconds. A sweep job's lines start with its job label ([job 3], as the
sweep's "[job 3/6] started" line); a multi-task run's loss shows each task's mean (a classification
loss and STS-B's squared error do not average). quiet_warnings() drops the library warnings a user
cannot act on.

The run dir's log holds what the run printed (copied_to_log): Hydra's job log only receives `logging`
records, and a run speaks through print and bars, so stdout and stderr are copied into it line by
line, a bar's redraws as the one line they finally showed; the console is untouched.
"""
from __future__ import annotations

import logging
import re
import sys
import time
import warnings
from contextlib import contextmanager
from typing import IO, Optional

from tqdm.auto import tqdm

PLAIN_LINES = 20  # lines per run, off a terminal
PLAIN_EVERY_S = 300.0


def interactive() -> bool:
    """Is progress shown to a person at a terminal (so a redrawn bar reads well)?"""
    return sys.stderr.isatty()


def quiet_libraries() -> None:
    """Off a terminal, the libraries' bars go too (datasets' tokenization, transformers' "Loading
    weights"): same carriage returns; and Accelerate's INFO lines at each checkpoint save and load
    (five a checkpoint), which say nothing the run's own lines do not."""
    if not interactive():
        from datasets.utils.logging import disable_progress_bar
        from transformers.utils import logging as hf_logging

        disable_progress_bar()
        hf_logging.disable_progress_bar()
        logging.getLogger("accelerate").setLevel(logging.WARNING)


def quiet_warnings() -> None:
    """Warnings about the libraries' own machinery, which no user of deepen-run can act on: joblib's
    loky executor warns when a worker it recycles (idle ones time out) had been handed jobs; it
    restarts them itself."""
    warnings.filterwarnings("ignore", message=r"A worker stopped while some jobs were given to the executor",
                            category=UserWarning, module=r"joblib\.")


def job_num() -> Optional[int]:
    """This process's job number in a sweep (Hydra's multirun); None in a single run or outside Hydra."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return int(HydraConfig.get().job.num)


class TaskLosses:
    """Each task's mean training loss since the last log line, on the device until shown."""

    def __init__(self):
        self.sums: dict = {}
        self.weights: dict = {}

    def add(self, task: str, loss, weight: float = 1.0) -> None:
        self.sums[task] = self.sums.get(task, 0) + loss
        self.weights[task] = self.weights.get(task, 0.0) + weight

    def line(self) -> str:
        """'mrpc 0.6931 stsb 2.0899' (a host sync per task: call at logging cadence), then reset."""
        out = "  ".join(f"{t} {float(s) / self.weights[t]:.4f}" for t, s in self.sums.items())
        self.sums, self.weights = {}, {}
        return out


def progress(total: int, initial: int = 0, disable: bool = False):
    desc = ("" if (num := job_num()) is None else f"[job {num + 1}] ") + "train"
    if interactive():
        return tqdm(total=total, initial=initial, desc=desc, disable=disable, dynamic_ncols=True)
    return PlainProgress(total, initial, disable, desc)


class PlainProgress:
    """The part of tqdm's interface the training loop uses, as plain lines on stderr."""

    def __init__(self, total: int, initial: int = 0, disable: bool = False, desc: str = "train"):
        self.total, self.n, self.disable, self.desc = total, initial, disable, desc
        self.every = max(1, -(-max(total - initial, 1) // PLAIN_LINES))
        self.t0 = self.last_t = time.monotonic()
        self.first = initial
        self.postfix: dict[str, str] = {}
        self.printed = initial

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if self.n >= self.total or self.n - self.printed >= self.every or now - self.last_t >= PLAIN_EVERY_S:
            self._line(now)

    def write(self, s: str, file=None) -> None:
        print(s, file=file or sys.stderr, flush=True)

    def set_postfix(self, **kw) -> None:
        self.postfix.update({k: str(v) for k, v in kw.items()})

    def close(self) -> None:
        if self.n > self.printed:
            self._line(time.monotonic())

    def _line(self, now: float) -> None:
        self.printed, self.last_t = self.n, now
        if self.disable:
            return
        rate = (self.n - self.first) / max(now - self.t0, 1e-9)
        eta = (self.total - self.n) / rate if rate > 0 else float("nan")
        extra = "".join(f"  {k} {v}" for k, v in self.postfix.items())
        clock = tqdm.format_interval(eta) if eta == eta else "?"
        print(f"{self.desc} step {self.n}/{self.total}{extra}  {rate:.2f} it/s  ETA {clock}", file=sys.stderr, flush=True)


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
    return next((h.baseFilename for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)), None)


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
