"""A run's threads suit the machine (deepen_run/run/threads.py): as many as the CPUs it may use
(OMP_NUM_THREADS, else affinity and cgroup quota, shared by a node's processes), OpenMP waiting
passively, the choice recorded as params."""
from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import cli, runs_of

from deepen_run.run.threads import cgroup_quota, choose_threads, quiet_waits


def test_omp_num_threads_wins_else_the_smaller_of_affinity_and_quota():
    assert choose_threads({"OMP_NUM_THREADS": "3"}, cpus=16, quota=None) == (3, "OMP_NUM_THREADS=3")
    n, why = choose_threads({}, cpus=16, quota=None)
    assert n == 16 and why == "16 CPUs in affinity, cgroup quota none"
    assert choose_threads({}, cpus=16, quota=2.5)[0] == 2  # a container's 2.5 CPUs: 2 threads, not 16
    assert choose_threads({}, cpus=2, quota=8.0)[0] == 2  # `taskset -c 0,1` on a bigger quota
    assert choose_threads({}, cpus=16, quota=0.5)[0] == 1
    # accelerate launch / torchrun: the node's processes share its CPUs
    n, why = choose_threads({"LOCAL_WORLD_SIZE": "4"}, cpus=16, quota=None)
    assert n == 4 and why.endswith("shared by 4 processes on this node")
    assert choose_threads({"LOCAL_WORLD_SIZE": "4"}, cpus=2, quota=None)[0] == 1
    # nonsense in the environment is not a choice
    assert choose_threads({"OMP_NUM_THREADS": "0", "LOCAL_WORLD_SIZE": "x"}, cpus=6, quota=None)[0] == 6


def test_the_cgroup_quota_is_read_from_v2_and_v1_files(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(v1) == 3.0
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_quota(v1) is None and cgroup_quota(tmp_path / "none") is None


def test_openmp_waits_passively_unless_the_user_chose_and_only_before_torch_loads():
    env: dict[str, str] = {}
    if "torch" in sys.modules:  # in this test process torch is loaded: setting it now would not take
        quiet_waits(env)
        assert env == {}
    code = ("import os, sys; import deepen_run.cli.run; "
            "print('torch' in sys.modules, os.environ.get('OMP_WAIT_POLICY'))")
    for given, shown in ((None, "False PASSIVE"), ("ACTIVE", "False ACTIVE")):
        e = {k: v for k, v in __import__("os").environ.items() if k != "OMP_WAIT_POLICY"}
        if given:
            e["OMP_WAIT_POLICY"] = given
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, check=True)
        assert out.stdout.strip() == shown, out.stderr[-2000:]


@pytest.mark.subprocess
def test_a_run_records_its_threads_and_why(tmp_path, glue_dir):
    uri = f"sqlite:///{tmp_path}/m.db"
    r = cli("backbone=tiny", "task=rte", "train.batch_size=8", "data.max_train_samples=16",
            "data.max_eval_samples=16", "data.max_seq_length=32", "train.max_steps=1",
            f"tracking.uri={uri}", f"data.glue_dir={glue_dir}", env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    _, (run,) = runs_of(uri)
    p = run.data.params
    assert p["train/threads"] == "1" and p["train/threads_reason"].startswith("OMP_NUM_THREADS=1; OMP_WAIT_POLICY ")
