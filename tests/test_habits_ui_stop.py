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


def test_sigterm_stops_the_server(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "deepen_run.tracking.ui", f"sqlite:///{tmp_path}/mlflow.db",
                             str(tmp_path / "art"), str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    t0 = time.time()
    for line in proc.stdout:
        if "MLflow UI is up" in line:
            break
        assert time.time() - t0 < HANG
    assert listening(port)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    deadline = time.time() + 30
    while listening(port) and time.time() < deadline:
        time.sleep(0.2)
    assert not listening(port), f"something still listens on {port} after SIGTERM"
