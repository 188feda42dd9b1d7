"""Shared fixtures: the real GLUE folder, a throwaway MLflow store, config composition, the CLI."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient

from deepen_run.config.schema import ROOT, register
from deepen_run.methods import schemas
from deepen_run.util import sqlite_path

import forkserver  # noqa: I001 (the tests' own helper, beside this file)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# MLflow's variables are the defaults of tracking.uri/experiment (and of the tools): a user's
# settings must not send the suite's runs to their store (tests/test_mlflow_env.py sets them itself).
for _var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
    os.environ.pop(_var, None)
# `make test` runs one test process a core (pytest-xdist), which fills the cores: each of them, and
# every run it starts, then computes on one thread. Two threads a process would oversubscribe the
# cores (torch's OpenMP threads spin while they wait): measured here, a pair of MiniLM runs side by
# side used about a fifth more CPU time that way.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# A test's commands start as if typed at a terminal. A suite started in the background (`make test &`,
# nohup) ignores SIGINT or SIGHUP, which exec'd children inherit and deepen-run honours, as nohup asks
# (tests/test_edge_cases.py): the tests that send them would see them ignored. A Python handler is
# reset to the default at exec, and this process still shrugs them off.
for _sig in (signal.SIGINT, signal.SIGHUP):
    if signal.getsignal(_sig) == signal.SIG_IGN:
        signal.signal(_sig, lambda signum, frame: None)
forkserver.base_env = dict(os.environ)
register(schemas())


# The test modules that take longest, longest first (seconds summed over their tests in a `make test`
# of 42d1246, --durations=0): only an order, so a stale entry costs time, never a result. test_slurm
# leads: its 3-4 min are mostly waits on SLURM (daemons, scheduling, a requeue), so started first they
# overlap the other worker's work; unlisted, they came after every listed module, where waits late in
# the suite can leave a core idle. test_mlflow_env, test_hire and test_row_key each hold a test of
# 45-65 s (CI of ca1a16a).
LONGEST = ("test_slurm", "test_sweep_resume", "test_resume", "test_faults", "test_edge_cases", "test_model_product",
           "test_sweeps", "test_report", "test_compose", "test_e2e", "test_mlflow_env", "test_hire", "test_row_key",
           "test_multiprocess", "test_rundir",
           "test_hparams_search", "test_habits_early_stop", "test_fast", "test_sweep_summary", "test_bad_input",
           "test_probe", "test_duplicate", "test_tracking_server", "test_model_selection", "test_families")


def pytest_collection_modifyitems(config, items):
    """The longest modules first, each module's tests kept together (their module fixtures are made
    once). pytest-xdist's worksteal gives each worker a contiguous share of this list and lets a worker
    that runs dry take tests from the end of the other's queue: the two then meet among short tests,
    where a long one left last would keep one core busy while the other waits."""
    rank = {name: k for k, name in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(item.module.__name__, len(LONGEST)))  # stable: order kept within


@pytest.fixture(scope="session")
def glue_dir() -> str:
    path = os.environ.get("DEEPEN_GLUE_DIR") or str(ROOT.parent / "shared" / "glue")
    assert Path(path, "SST-2", "train.tsv").is_file(), f"GLUE files not found at {path}; set DEEPEN_GLUE_DIR"
    return path


@pytest.fixture
def mlflow_uri(tmp_path) -> str:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    existing_store(uri)
    return uri


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A live `mlflow server` on a SQLite store, one a test process: each test that uses it logs to an
    experiment of its own (starting a server costs seconds of CPU)."""
    tmp_path = tmp_path_factory.mktemp("mlflow_server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("mlflow")
    proc = subprocess.Popen([str(exe), "server", "--backend-store-uri", f"sqlite:///{tmp_path}/server.db",
                             "--artifacts-destination", str(tmp_path / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "server.log", "w"),
                            # its GenAI job runner (a pool of worker processes) serves nothing here
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + HANG  # bounds a hang only: a loaded machine starts it slowly
        while time.time() < deadline and proc.poll() is None:
            try:
                if urllib.request.urlopen(f"{url}/health", timeout=5).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("mlflow server did not start: " + (tmp_path / "server.log").read_text()[-2000:])
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=HANG)


def make_cfg(*overrides: str):
    """Compose the real config (conf/) with overrides, as the CLI would."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def runs_of(uri: str, experiment: str = "deepen-run"):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r} in {uri}"
    return client, client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


# Only bounds a hang: a loaded 2-core machine may be many times slower than usual, and
# `pytest --durations` reports how long tests really take (make test prints the slowest).
HANG = 3600
_tmp: dict[str, Path] = {}


@pytest.fixture(scope="session", autouse=True)
def _session_tmp(tmp_path_factory):
    """Every command a test starts writes into tmp folders, never into the checkout's outputs/:
    the test's tmp_path, or (for module/session fixtures) one of the session; the tokenization
    cache is shared by the session's tests."""
    _tmp.update(session=tmp_path_factory.mktemp("cli"), cache=tmp_path_factory.getbasetemp() / "cache")


@pytest.fixture(autouse=True)
def _test_tmp(tmp_path, request):
    _tmp.update(test=tmp_path, fresh=request.node.get_closest_marker("fresh_store") is not None)
    yield
    _tmp.pop("test", None)
    _tmp.pop("fresh", None)


def _store_template() -> Path:
    """An empty SQLite store with MLflow's schema, made by MLflow once a test process: a fresh store
    costs 0.6-1 s of CPU in its ~50 alembic migrations, and the suite opens over a hundred. Its
    experiments are deleted, so MLflow makes its Default experiment (id 0) again, with the new
    store's own artifact location, when it first opens a copy: a copy is a store as MLflow leaves it."""
    made = _tmp["session"] / "store-template.db"
    if not made.is_file():
        tmp = made.with_suffix(".making")
        MlflowClient(f"sqlite:///{tmp}").search_experiments(max_results=1)
        con = sqlite3.connect(tmp)
        con.execute("DELETE FROM experiments")
        con.commit()
        con.close()
        tmp.rename(made)
    return made


def existing_store(uri: str) -> None:
    """Tests run in a store that exists already, as a user's second run does (its own empty SQLite
    file, copied from the template), unless marked fresh_store: those check what a run does to a
    store it creates (refusals leave none, a failed attempt removes its own), and
    tests/test_tracking_store.py creates its stores by hand."""
    db = sqlite_path(uri)
    if db is None or db.exists() or not db.parent.is_dir() or _tmp.get("fresh") or "session" not in _tmp:
        return
    shutil.copyfile(_store_template(), db)


def isolated(args, kind: str = "run") -> list[str]:
    """args plus run dir, sweep dir, tracking store and cache in tmp folders, unless given; the store
    exists already (existing_store)."""
    if "session" not in _tmp:
        return list(args)
    home = _tmp.get("test") or _tmp["session"]
    base = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=home))
    given = {a.split("=", 1)[0].lstrip("+~") for a in args if "=" in a}
    defaults = {"hydra.run.dir": base / "run", "hydra.sweep.dir": base / "sweep",
                "tracking.uri": f"sqlite:///{home}/mlflow.db", "data.cache_dir": _tmp["cache"]}
    out = [*args, *(f"{k}={v}" for k, v in defaults.items() if k not in given)]
    for a in out:
        if a.startswith("tracking.uri="):
            existing_store(a.split("=", 1)[1])
    return out


def cli(*args: str, timeout: int = HANG, env: dict | None = None, prog: str = "deepen-run") -> subprocess.CompletedProcess:
    """Run `deepen-run` as a user would, in a fresh process (its outputs in tmp folders)."""
    e = {**os.environ, **(env or {})}
    exe = Path(sys.executable).with_name(prog)
    return forkserver.run([str(exe), *isolated(args)], timeout=timeout, env=e)


def token_batch(B=3, T=9) -> dict:
    """A fixed batch of B token sequences of length T, the first padded after 5 tokens."""
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 2000, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


@pytest.fixture(autouse=True)
def _fresh_accelerator_state():
    """Accelerate keeps one process-wide state, fixed by the first Accelerator: an in-process run at
    one precision (bf16 by default on a CPU with AMX) would refuse the next test's other precision.
    Each test starts from a fresh state, as each `deepen-run` process does (accelerate's own test
    case resets it the same way)."""
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
