"""Start deepen-run's commands from a process that has already imported what they import.

A tiny `deepen-run` spends about 8 of its 13 CPU-seconds importing torch, transformers, MLflow,
datasets and evaluate, and the suite starts a few hundred of them. Each test worker keeps one server
that imports those once and then forks a child per command: the child sets the command's argv,
environment and working folder, runs the console script (or `python -m` module) as `__main__`, ends
as the interpreter would (non-daemon threads joined, atexit handlers run) and exits with its code.
Signals, exit codes, files and MLflow records are the child's own, as with a fresh process.

What a fork cannot give falls back to a plain subprocess: a command that is not one of ours, and an
environment that differs from the server's in a variable a library may read at import (only the
MLflow and deepen-run variables below are read when used). DEEPEN_TEST_FORK=0 turns it off.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent
# Read when a command uses them, not at import: a request may change these and still fork (MLflow sets
# _MLFLOW_TELEMETRY_SESSION_ID in the test process once it has opened a store).
LATE = ("MLFLOW_", "_MLFLOW_", "DEEPEN_", "PYTEST_", "HYDRA_")
# What a tiny run imports (python -X importtime), and the other commands' modules; deepen-run's own
# module first, as in a fresh process: it sets OMP_WAIT_POLICY before torch loads libgomp.
PRELOAD = ("deepen_run.cli.run", "torch", "transformers", "datasets", "evaluate", "sklearn.metrics", "mlflow", "git",
           "mlflow.store.tracking.sqlalchemy_store", "transformers.masking_utils", "transformers.modeling_layers",
           "deepen_run.cli.run", "deepen_run.run.runner", "deepen_run.run.train", "deepen_run.model.backbone",
           "deepen_run.run.preflight", "deepen_run.sweep.summary", "deepen_run.report.main",
           "deepen_run.cli.predict", "deepen_run.cli.export", "deepen_run.cli.probe")


def _target(argv: list[str]) -> tuple[str, str] | None:
    """("path", script) for one of our console scripts, ("module", name) for `python -m deepen_run...`."""
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2].startswith("deepen_run."):
        return "module", argv[2]
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
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=self.env, bufsize=0)
        self.buf = b""
        atexit.register(self.close)
        try:
            self.set_at_import = self.line(600)["set_at_import"]
            self.env.update(self.set_at_import)
            self.ready = True
        except RuntimeError:  # it could not import what it preloads: every command falls back
            self.ready = False

    def close(self) -> None:
        self.proc.stdin.close()  # the server's loop ends at the end of its input
        self.proc.wait(60)

    def line(self, timeout: float | None) -> dict | None:
        """The server's next message, None when timeout seconds pass first."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            if not select.select([fd], [], [], timeout)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError("the test fork server ended")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\n", 1)
        return json.loads(msg)

    def differences(self, env: dict) -> list[str]:
        """The variables in which env differs from the server's where a fork would not see the change.
        A variable the commands' modules set at import may be missing: the child sets it as they would."""
        return sorted(k for k in set(env) | set(self.env) if env.get(k) != self.env.get(k)
                      and not k.startswith(LATE) and not (k in self.set_at_import and k not in env))


_server: _Server | None = None
forked = 0  # commands this process has run through the server (tests/test_forkserver.py checks it moves)


def off() -> bool:
    return os.environ.get("DEEPEN_TEST_FORK", "1") == "0"


def run(argv: list[str], *, env: dict | None = None, timeout: float | None = None,
        cwd: str | None = None) -> subprocess.CompletedProcess:
    """subprocess.run(argv, capture_output=True, text=True, ...), forked from the server where it can be."""
    global _server, forked
    env = dict(os.environ if env is None else env)
    target = _target(argv)
    if target is not None and not off() and _server is None:
        _server = _Server()
    why = "not one of our commands" if target is None else "off" if _server is None else \
        "no server" if not _server.ready or _server.proc.poll() is not None else \
        ", ".join(_server.differences(env))
    if os.environ.get("DEEPEN_TEST_FORK_LOG"):  # which commands forked, and why the others did not
        with open(os.environ["DEEPEN_TEST_FORK_LOG"], "a") as log:
            log.write(f"{'fallback' if why else 'fork'}\t{why}\t{' '.join(argv[:3])}\n")
    if why:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    with tempfile.TemporaryDirectory(prefix="fork-") as tmp:
        out, err = Path(tmp, "out"), Path(tmp, "err")
        req = {"target": target, "argv": argv, "env": env, "cwd": cwd or os.getcwd(), "out": str(out), "err": str(err)}
        _server.proc.stdin.write((json.dumps(req) + "\n").encode())
        pid = _server.line(60)["pid"]
        forked += 1
        done = _server.line(timeout)
        if done is None:
            os.kill(pid, 9)  # as subprocess.run does on a timeout
            _server.line(60)
            raise subprocess.TimeoutExpired(argv, timeout, out.read_text(errors="replace"), err.read_text(errors="replace"))
        return subprocess.CompletedProcess(argv, done["rc"], out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))


def _child(req: dict, server_out: int, set_at_import: dict) -> None:
    """In the forked child: become the command, run it, exit as the interpreter would."""
    import runpy
    import signal
    import threading

    os.close(server_out)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    for key, value in set_at_import.items():  # what the commands' modules set when a fresh process imports them
        os.environ.setdefault(key, value)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, req["out"]), (2, req["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    kind, name = req["target"]
    code, interrupted = 0, False
    try:
        if kind == "module":
            sys.argv = [name, *req["argv"][3:]]
            sys.path[0] = req["cwd"]
            sys.modules.pop(name, None)  # `python -m` runs a fresh copy as __main__, not the imported one
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [name, *req["argv"][1:]]
            sys.path[0] = str(Path(name).parent)
            runpy.run_path(name, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        interrupted = True
    except BaseException:  # noqa: BLE001 (whatever ends the command, as the interpreter reports it)
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if interrupted:  # Python ends an uncaught KeyboardInterrupt by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def serve() -> None:
    import importlib

    before = dict(os.environ)
    for name in PRELOAD:
        importlib.import_module(name)
    set_at_import = {k: v for k, v in os.environ.items() if before.get(k) != v}
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # a stray print must not break the protocol
    out.write(json.dumps({"set_at_import": set_at_import}).encode() + b"\n")
    for raw in sys.stdin.buffer:
        req = json.loads(raw)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                _child(req, out.fileno(), set_at_import)
            finally:
                os._exit(70)
        out.write(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


if __name__ == "__main__":
    serve()
