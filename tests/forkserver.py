"""Start deepen-run's commands from a process that has already imported what they import.

A tiny `deepen-run` spends about 8 of its 13 CPU-seconds importing torch, transformers, MLflow,
datasets and evaluate, and the suite starts a few hundred of them. Each test worker keeps one server
that imports those once and then forks a child per command: the child sets the command's argv,
environment, working folder and standard streams, runs the console script (or `python -m` module) as
`__main__`, ends as the interpreter would (non-daemon threads joined, atexit handlers run) and exits
with its code. Signals, exit codes, files and MLflow records are the child's own, as with a fresh
process. `run` stands for subprocess.run; `popen` for subprocess.Popen, for the tests that signal a
command while it runs (the child is the server's, so its exit reaches the test as a message).
The server's side is tests/forkchild.py.

What a fork cannot give falls back to a plain subprocess: a command that is not one of ours, and an
environment that differs from the server's in a variable a library may read at import (only the
MLflow and deepen-run variables below are read when used). DEEPEN_TEST_FORK=0 turns it off.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BIN = Path(sys.executable).parent
# Read when a command uses them, not at import: a request may change these and still fork (MLflow sets
# _MLFLOW_TELEMETRY_SESSION_ID in the test process once it has opened a store).
LATE = ("MLFLOW_", "_MLFLOW_", "DEEPEN_", "PYTEST_", "HYDRA_")
PACKET = 1 << 20  # one message a packet (SOCK_SEQPACKET): a request carries the command's environment


# The first line of `python -c` code that may run in a forked child: it needs no fresh interpreter (its
# imports are the server's already), e.g. tests/test_faults.py's signalled_at, which patches a function.
CODE = "# forkserver: may fork\n"


def _target(argv: list[str]) -> tuple[str, str] | None:
    """("path", script) for one of our console scripts, ("module", name) for `python -m deepen_run...`,
    ("code", code) for `python -c` code that starts with CODE."""
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2].startswith("deepen_run."):
        return "module", argv[2]
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-c" and argv[2].startswith(CODE):
        return "code", argv[2]
    exe = Path(argv[0]) if argv else Path()
    if exe.parent == BIN and exe.name.startswith("deepen-"):
        return "path", str(exe)
    return None


# The environment the server starts in: the suite's own (conftest sets it once it has set its variables),
# not that of whichever test happens to start the server.
base_env: dict[str, str] = {}


class _Server:
    def __init__(self):
        self.env = dict(base_env or os.environ)
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("forkchild.py")), str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=self.env)
        theirs.close()
        self.exits: dict[int, int] = {}  # pid -> exit code, as the server reports its children's ends
        self.lock = threading.RLock()
        atexit.register(self.close)
        try:
            self.set_at_import = self.message(600)["set_at_import"]
            self.env.update(self.set_at_import)
            self.ready = True
        except (RuntimeError, TypeError):  # it could not import what it preloads: every command falls back
            self.ready = False

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_WR)  # the server's loop ends at the end of its input
        self.proc.wait(60)

    def message(self, timeout: float | None) -> dict | None:
        """The server's next message, None when timeout seconds pass first."""
        if not select.select([self.sock], [], [], timeout)[0]:
            return None
        raw = self.sock.recv(PACKET)
        if not raw:
            raise RuntimeError("the test fork server ended")
        return json.loads(raw)

    def differences(self, env: dict) -> list[str]:
        """The variables in which env differs from the server's where a fork would not see the change.
        A variable the commands' modules set at import may be missing: the child sets it as they would."""
        return sorted(k for k in set(env) | set(self.env) if env.get(k) != self.env.get(k)
                      and not k.startswith(LATE) and not (k in self.set_at_import and k not in env))

    def spawn(self, req: dict, fds: list[int]) -> int:
        """Fork a child for the request with fds as its stdin, stdout and stderr; its pid."""
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(req).encode()], fds)
            while True:
                msg = self.message(60)
                if msg is None:
                    raise RuntimeError("the test fork server did not answer")
                if "spawned" in msg:
                    return msg["spawned"]
                self.exits[msg["exited"]] = msg["rc"]

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        """The child's exit code once it has ended; None if it is still running after timeout seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while pid not in self.exits:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                msg = self.message(left)
                if msg is None:
                    return None
                self.exits[msg["exited"]] = msg["rc"]
            return self.exits[pid]


_server: _Server | None = None
forked = 0  # commands this process has run through the server (tests/test_forkserver.py checks it moves)


def off() -> bool:
    return os.environ.get("DEEPEN_TEST_FORK", "1") == "0"


def _why_not(argv: list[str], env: dict) -> str:
    """Why the command cannot fork; "" if it can."""
    global _server
    target = _target(argv)
    if target is not None and not off() and _server is None:
        _server = _Server()
    why = "not one of our commands" if target is None else "off" if _server is None else \
        "no server" if not _server.ready or _server.proc.poll() is not None else \
        ", ".join(_server.differences(env))
    if os.environ.get("DEEPEN_TEST_FORK_LOG"):  # which commands forked, and why the others did not
        with open(os.environ["DEEPEN_TEST_FORK_LOG"], "a") as log:
            log.write(f"{'fallback' if why else 'fork'}\t{why}\t{' '.join(argv[:3])}\n")
    return why


def run(argv: list[str], *, env: dict | None = None, timeout: float | None = None,
        cwd: str | None = None) -> subprocess.CompletedProcess:
    """subprocess.run(argv, capture_output=True, text=True, ...), forked from the server where it can be."""
    env = dict(os.environ if env is None else env)
    why = _why_not(argv, env)
    if why:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = Forked(argv, env=env, cwd=cwd, stdout=out.fileno(), stderr=err.fileno())
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()  # as subprocess.run does on a timeout
            proc.wait(60)
            raise subprocess.TimeoutExpired(argv, timeout, _read(out), _read(err)) from None
        return subprocess.CompletedProcess(argv, proc.returncode, _read(out), _read(err))


def _read(f) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")


def popen(argv: list[str], *, env: dict | None = None, **kw):
    """subprocess.Popen(argv, ...), forked from the server where it can be (stdin: None or DEVNULL;
    stdout and stderr: PIPE, DEVNULL, a file or None; text or bytes)."""
    why = _why_not(argv, dict(os.environ if env is None else env))
    if why or kw.get("stdin") == subprocess.PIPE:
        return subprocess.Popen(argv, env=env, **kw)
    return Forked(argv, env=env, **kw)


class Forked:
    """What the tests use of subprocess.Popen, for a child of the fork server."""

    def __init__(self, argv, *, env=None, cwd=None, stdin=None, stdout=None, stderr=None, text=False,
                 start_new_session=False):
        global forked
        self.args, self.returncode, self._text = argv, None, text
        self.stdin = self.stdout = self.stderr = None
        theirs: list[int] = []  # the fds opened here for the child: closed here once it has them

        def stream(spec, default: int, name: str) -> int:
            if spec == subprocess.PIPE:
                r, w = os.pipe()
                setattr(self, name, open(r, "r" if text else "rb"))
                theirs.append(w)
                return w
            if spec == subprocess.DEVNULL or (spec is None and name == "stdin"):  # no test types into a command
                theirs.append(os.open(os.devnull, os.O_RDWR))
                return theirs[-1]
            if spec == subprocess.STDOUT:
                return fds[1]
            return default if spec is None else spec if isinstance(spec, int) else spec.fileno()

        fds: list[int] = []
        for spec, default, name in ((stdin, 0, "stdin"), (stdout, 1, "stdout"), (stderr, 2, "stderr")):
            fds.append(stream(spec, default, name))
        req = {"target": _target(argv), "argv": list(map(str, argv)), "env": dict(os.environ if env is None else env),
               "cwd": str(cwd or os.getcwd()), "session": bool(start_new_session)}
        try:
            self.pid = _server.spawn(req, fds)
        finally:
            for fd in theirs:
                os.close(fd)
        forked += 1
        self._readers: dict[str, tuple[threading.Thread, list]] = {}

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = _server.exit_code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = _server.exit_code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, input=None, timeout: float | None = None):
        """Read stdout and stderr to their end, then wait; a timeout leaves the reading going, as Popen's."""
        assert input is None, "a forked command has no stdin pipe"
        deadline = None if timeout is None else time.monotonic() + timeout
        for name in ("stdout", "stderr"):
            f = getattr(self, name)
            if f is not None and name not in self._readers:
                got: list = []
                t = threading.Thread(target=lambda f=f, got=got: got.append(f.read()), daemon=True)
                t.start()
                self._readers[name] = (t, got)
        for t, _ in self._readers.values():
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        out = [self._readers[n][1][0] if n in self._readers else None for n in ("stdout", "stderr")]
        for name in ("stdout", "stderr"):
            if getattr(self, name) is not None:
                getattr(self, name).close()
        return tuple(out)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # an ended child's pid may be another process's by now
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for f in (self.stdout, self.stderr):
            if f is not None:
                f.close()
        self.wait()
