"""Fair timing on a noisy shared machine: contenders take turns in short chunks of steps.

Each contender runs its own, unmodified training loop in a thread; a `Baton` lets exactly one
thread run at a time and passes the turn round-robin at every chunk boundary (a step callback).
So contender A's chunk k and contender B's chunk k run seconds apart on the same batches, and a
burst of load from other processes hits all of them alike. Per chunk a `Lap` records wall time
and the peak memory growth; reports take medians over chunks (the first chunk, which pays for
setup and warm-up, is dropped).

Memory, as measured here:
- CUDA: torch.cuda.max_memory_allocated during the chunk minus memory_allocated at its start.
- CPU: the process's resident-set high-water mark (VmHWM, reset through /proc/self/clear_refs)
  during the chunk minus its RSS at the start, after malloc_trim so that memory freed by the
  previous contender is given back first and every contender's growth counts. It is the extra
  working set of training (gradients, optimizer state on the first chunk, activations, batches)
  on top of what is already resident (the weights).
"""
from __future__ import annotations

import ctypes
import statistics
import threading
import time
from typing import Callable, Optional

import torch


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


LIBC = _libc()


def _status(key: str) -> int:
    """A /proc/self/status field in bytes (Linux); 0 elsewhere."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Memory:
    """Peak memory growth over a window, on the device that trains."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.base = 0

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return
        if LIBC is not None:
            LIBC.malloc_trim(0)
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # resets VmHWM to the current RSS
        except OSError:
            pass
        self.base = _status("VmRSS")

    def peak(self) -> int:
        if self.cuda:
            return torch.cuda.max_memory_allocated() - self.base
        return max(0, _status("VmHWM") - self.base)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class Baton:
    """Round-robin turns between named threads; also keeps each one's torch RNG stream apart,
    so a contender's dropout masks do not depend on how the others were interleaved."""

    def __init__(self, names: list[str]):
        self.order = list(names)
        self.turn: Optional[str] = self.order[0] if self.order else None
        self.cv = threading.Condition()
        self.rng: dict[str, tuple] = {}

    def wait(self, name: str) -> None:
        with self.cv:
            self.cv.wait_for(lambda: self.turn == name)
        if name in self.rng:
            cpu, cuda = self.rng[name]
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state(cuda)

    def hand_on(self, name: str, done: bool = False) -> None:
        self.rng[name] = (torch.get_rng_state(), torch.cuda.get_rng_state() if torch.cuda.is_available() else None)
        with self.cv:
            i = self.order.index(name)
            nxt = self.order[(i + 1) % len(self.order)]
            if done:
                self.order.remove(name)
            self.turn = nxt if self.order and nxt in self.order else (self.order[0] if self.order else None)
            self.cv.notify_all()

    def pause(self, name: str) -> None:
        self.hand_on(name)
        self.wait(name)


class Lap:
    """Chunk timer of one contender; `step(done)` is its loop's after-step callback."""

    def __init__(self, name: str, baton: Baton, chunk: int, device: torch.device):
        self.name, self.baton, self.chunk, self.device = name, baton, chunk, device
        self.times: list[float] = []
        self.peaks: list[int] = []
        self.mem = Memory(device)
        self.t0 = 0.0

    def begin(self) -> None:
        """Start timing (call inside the contender's turn, after its model is built)."""
        self.mem.start()
        self.t0 = time.perf_counter()

    def step(self, done: int) -> None:
        if done % self.chunk:
            return
        sync(self.device)
        self.times.append(time.perf_counter() - self.t0)
        self.peaks.append(self.mem.peak())
        self.baton.pause(self.name)
        self.begin()


def run_threads(baton: Baton, bodies: dict[str, Callable[[], dict]]) -> dict[str, dict]:
    """Run each body in its own thread under the baton; re-raise the first failure."""
    results, errors = {}, {}

    def main(name, body):
        baton.wait(name)
        try:
            results[name] = body()
        except BaseException as e:  # noqa: BLE001 (reported below, after the others finish)
            errors[name] = e
        finally:
            baton.hand_on(name, done=True)

    threads = [threading.Thread(target=main, args=(n, b), name=f"bench-{n}") for n, b in bodies.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        name, err = next(iter(errors.items()))
        raise RuntimeError(f"bench contender {name} failed: {err!r}") from err
    return results


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
