"""`make ui` (deepen_run/tracking/ui.py) sent SIGTERM stops its MLflow server: nothing is left
listening on its port."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import HANG

pytestmark = [pytest.mark.subprocess]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_port_in_use_or_not_a_port_is_one_line_and_no_links(tmp_path):
    """The links `make ui` prints must lead to its own server: a port another process holds is
    refused before the server starts (was: 'MLflow UI is up' with links to the other server), as is
    a UI_PORT that is not a port (was: a traceback and exit 0)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        for given, code, culprit in ((str(port), 1, f"port {port} is not free"), ("abc", 2, "UI_PORT=abc is not a port"),
                                     ("99999", 2, "UI_PORT=99999 is not a port")):
            r = subprocess.run([sys.executable, "-m", "deepen_run.tracking.ui", f"sqlite:///{tmp_path}/mlflow.db",
                                str(tmp_path / "art"), given], capture_output=True, text=True, timeout=HANG)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == code and len(lines) == 1 and culprit in lines[0], (given, r.stderr[-2000:])
            assert "MLflow UI is up" not in r.stdout


def test_make_ui_listens_on_the_loopback_address_only_and_sigterm_stops_it(tmp_path):
    """docs/reliability.md, Safety: `make ui` (its very command) listens on 127.0.0.1 only: every
    socket listening on its port is bound to 127.0.0.1, none to all addresses (0.0.0.0 or ::). Sent
    SIGTERM, it stops its MLflow server: nothing is left listening on its port."""
    import psutil

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "deepen_run.tracking.ui", f"sqlite:///{tmp_path}/mlflow.db",
                             str(tmp_path / "art"), str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        t0 = time.time()
        for line in proc.stdout:
            if "MLflow UI is up" in line:
                break
            assert time.time() - t0 < HANG
        assert listening(port)
        bound = {c.laddr.ip for c in psutil.net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    assert bound == {"127.0.0.1"}, bound
    deadline = time.time() + 30
    while listening(port) and time.time() < deadline:
        time.sleep(0.2)
    assert not listening(port), f"something still listens on {port} after SIGTERM"
