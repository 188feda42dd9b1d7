"""The fork server's own process (tests/forkserver.py starts it, one a test worker): it imports what
deepen-run's commands import, then forks a child per request, tells the test process each child's
pid and, once it ends, its exit code. The child becomes the command: its argv, environment, folder
and standard streams (the fds the request carries), run as `__main__`."""
from __future__ import annotations

import atexit
import json
import os
import select
import socket
import sys
import threading
from pathlib import Path

from forkserver import PACKET

# What a tiny run imports (python -X importtime), and the other commands' modules; deepen-run's own
# module first, as in a fresh process: it sets OMP_WAIT_POLICY before torch loads libgomp.
PRELOAD = ("deepen_run.cli.run", "torch", "transformers", "datasets", "evaluate", "sklearn.metrics", "mlflow", "git",
           "mlflow.store.tracking.sqlalchemy_store", "transformers.masking_utils", "transformers.modeling_layers",
           "deepen_run.cli.run", "deepen_run.run.runner", "deepen_run.run.train", "deepen_run.model.backbone",
           "deepen_run.run.preflight", "deepen_run.sweep.summary", "deepen_run.report.main",
           "deepen_run.cli.predict", "deepen_run.cli.export", "deepen_run.cli.probe")


def _child(req: dict, fds: list[int], sock: socket.socket, set_at_import: dict, started: int) -> None:
    """In the forked child: become the command, run it, exit as the interpreter would. started: closed
    once the child has its session, folder and streams (Popen returns after its child's exec, so
    that a test may signal the process group at once)."""
    import runpy
    import signal

    sock.close()
    os.chdir(req["cwd"])
    if req["session"]:
        os.setsid()
    os.environ.clear()
    os.environ.update(req["env"])
    for key, value in set_at_import.items():  # what the commands' modules set when a fresh process imports them
        os.environ.setdefault(key, value)
    for fd, given in enumerate(fds):
        os.dup2(given, fd)
    for given in set(fds):
        if given > 2:
            os.close(given)
    os.close(started)
    kind, name = req["target"]
    code, interrupted = 0, False
    try:
        if kind == "module":
            sys.argv = [name, *req["argv"][3:]]
            sys.path[0] = req["cwd"]
            sys.modules.pop(name, None)  # `python -m` runs a fresh copy as __main__, not the imported one
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        elif kind == "code":  # `python -c <code> args...`, where the code says it may fork (forkserver.CODE)
            sys.argv = ["-c", *req["argv"][3:]]
            sys.path[0] = ""
            exec(compile(name, "<string>", "exec"), {"__name__": "__main__"})
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


def serve(fd: int) -> None:
    """The server: forks a child per request, reports each child's pid and, once it ends, its exit code."""
    import importlib

    sock = socket.socket(fileno=fd)
    before = dict(os.environ)
    for name in PRELOAD:
        importlib.import_module(name)
    set_at_import = {k: v for k, v in os.environ.items() if before.get(k) != v}
    sock.send(json.dumps({"set_at_import": set_at_import}).encode())
    while True:
        ready = select.select([sock], [], [], 0.05)[0]
        while True:  # report the children that ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            sock.send(json.dumps({"exited": pid, "rc": os.waitstatus_to_exitcode(status)}).encode())
        if not ready:
            continue
        raw, fds, _, _ = socket.recv_fds(sock, PACKET, 3)
        if not raw:  # the test process is done
            return
        sys.stdout.flush()
        sys.stderr.flush()
        wait_r, started = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(wait_r)
                _child(json.loads(raw), fds, sock, set_at_import, started)
            finally:
                os._exit(70)
        os.close(started)
        os.read(wait_r, 1)  # b"" once the child has closed its end (or died)
        os.close(wait_r)
        for given in fds:
            os.close(given)
        sock.send(json.dumps({"spawned": pid}).encode())


if __name__ == "__main__":
    serve(int(sys.argv[1]))
