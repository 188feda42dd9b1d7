"""The team setup of docs/scale-out.md, run here: Debian's PostgreSQL (installed with apt-get when
missing) as the database of a real `mlflow server` (psycopg2-binary, in the dev extra), and a tiny
run recorded through that server, read back with MLflow's client and found in PostgreSQL's own
tables. The database runs as the `postgres` user (PostgreSQL refuses root) with its data dir, socket
and port private to the test, and is stopped by the pid in its postmaster.pid, never by name.
"""
from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import HANG, cli, runs_of

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.subprocess]


def bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def install() -> str:
    """apt-get Debian's postgresql when missing; '' on success, else why not (the test is then skipped)."""
    if bin_dir() is None:
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            return "postgresql is not installed, and apt-get cannot install it here (not root)"
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "postgresql"]):
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            if r.returncode != 0:
                return f"{' '.join(cmd)} failed: {(r.stderr or r.stdout).strip()[-300:]}"
    try:
        import psycopg2  # noqa: F401 (the driver of postgresql+psycopg2:// URIs)
    except ImportError:
        return "psycopg2 is missing: pip install psycopg2-binary (the dev extra has it)"
    return "" if bin_dir() is not None else "apt-get installed postgresql, but initdb is missing"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def postgres():
    """A private PostgreSQL server -> its mlflow database (user@host:port/name). As root it runs as `postgres`, so its
    folder is one that user owns (pytest's tmp folders are root's alone)."""
    why = install()
    if why:
        pytest.skip(why)
    as_root = os.geteuid() == 0
    home = Path(tempfile.mkdtemp(prefix="deepen-pg-"))
    if as_root:
        shutil.chown(home, "postgres", "postgres")
    user = {"user": "postgres", "group": "postgres"} if as_root else {}
    data, port, pg = home / "data", free_port(), bin_dir()
    subprocess.run([str(pg / "initdb"), "-D", str(data), "-U", "mlflow", "--auth=trust", "-E", "UTF8"],
                   check=True, capture_output=True, cwd=home, **user)
    with open(home / "postgres.log", "wb") as log:
        proc = subprocess.Popen([str(pg / "postgres"), "-D", str(data), "-p", str(port), "-k", str(home),
                                 "-c", "listen_addresses=127.0.0.1"], stdout=log, stderr=log, cwd=home,
                                start_new_session=True, **user)
    try:
        deadline = time.time() + 120
        while subprocess.run([str(pg / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port)]).returncode != 0:
            assert proc.poll() is None and time.time() < deadline, (home / "postgres.log").read_text()[-2000:]
            time.sleep(0.3)
        subprocess.run([str(pg / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "mlflow", "mlflow"],
                       check=True, capture_output=True)
        yield f"mlflow@127.0.0.1:{port}/mlflow"
    finally:
        pid_file = data / "postmaster.pid"
        pid = int(pid_file.read_text().split()[0]) if pid_file.is_file() else proc.pid
        if proc.poll() is None:
            os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown
            proc.wait(timeout=60)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def server(postgres, tmp_path):
    port = free_port()
    exe = Path(sys.executable).with_name("mlflow")
    with open(tmp_path / "server.log", "w") as log:
        proc = subprocess.Popen([str(exe), "server", "--backend-store-uri",
                                 # SQLAlchemy 2.1's plain postgresql:// means psycopg 3; psycopg2 is named
                                 f"postgresql+psycopg2://{postgres}", "--artifacts-destination",
                                 str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
                                 "--workers", "1"], stdout=subprocess.DEVNULL, stderr=log,
                                env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + HANG  # bounds a hang only: MLflow migrates the empty database first
        while True:
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "server.log").read_text()[-3000:]
            try:
                if urllib.request.urlopen(f"{url}/health", timeout=5).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_a_run_through_a_tracking_server_on_postgresql(server, postgres, glue_dir):
    import psycopg2

    r = cli("backbone=tiny", "task=rte", "train.max_steps=2", "train.batch_size=8", "data.max_train_samples=16",
            "data.max_eval_samples=16", "data.max_seq_length=32", f"data.glue_dir={glue_dir}",
            f"tracking.uri={server}")
    assert r.returncode == 0, r.stderr[-3000:]
    client, runs = runs_of(server)
    (run,) = runs
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")][-1:] == [2]
    assert "eval/score" in run.data.metrics
    # The server kept it in PostgreSQL, not in a store of its own.
    with psycopg2.connect(f"postgresql://{postgres}") as db, db.cursor() as cur:
        cur.execute("SELECT status FROM runs WHERE run_uuid = %s", (run.info.run_id,))
        assert cur.fetchall() == [("FINISHED",)]
