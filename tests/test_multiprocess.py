"""Scale-out: two CPU processes (gloo) under torchrun train one model and record one MLflow run.

torchrun is the engine under `accelerate launch --multi_gpu`; on a machine without a GPU,
deepen_run.run.fast tells Accelerate to use CPU DDP (gloo).
"""
import csv
import math
import os
import subprocess
import sys

import pytest
import torch
from hydra.errors import ConfigCompositionException

from conftest import HANG, make_cfg, runs_of
from deepen_run.cli.run import quiet_other_ranks
from deepen_run.config.schema import ROOT
from deepen_run.precision import resolve_precision
from deepen_run.run.optim import scheduler_for


def test_only_rank_zero_keeps_hydra_outputs(monkeypatch):
    argv = ["deepen-run", "task=rte", "hydra.run.dir=/somewhere"]
    monkeypatch.setenv("RANK", "0")
    assert quiet_other_ranks(argv) == argv
    monkeypatch.setenv("RANK", "1")
    quiet = quiet_other_ranks(argv)
    assert quiet[:2] == ["deepen-run", "task=rte"] and "hydra.run.dir=/somewhere" not in quiet
    assert {"hydra.output_subdir=null", "hydra/job_logging=disabled"} <= set(quiet)
    (scratch,) = [a.split("=", 1)[1] for a in quiet if a.startswith("hydra.run.dir=")]
    assert os.path.isdir(scratch) and not os.listdir(scratch)  # a private, empty dir; not the cwd
    assert os.path.realpath(scratch) != os.path.realpath(os.getcwd())


def test_mixed_precision_auto_follows_the_hardware_and_typos_fail(glue_dir):
    from deepen_run.precision import cpu_flags

    if not __import__("torch").cuda.is_available():  # bf16 only on a CPU with native bf16 matmuls
        assert resolve_precision("auto") == ("bf16" if {"amx_bf16", "avx512_bf16"} & cpu_flags() else "no")
    assert resolve_precision("bf16") == "bf16"
    assert resolve_precision(make_cfg("train.mixed_precision=no").train.mixed_precision) == "no"
    with pytest.raises(ConfigCompositionException, match="train.mixed_precision=fp8") as e:
        make_cfg("backbone=tiny", f"data.glue_dir={glue_dir}", "train.mixed_precision=fp8")
    assert "Invalid value 'fp8', expected one of [auto, no, fp16, bf16]" in str(e.value.__cause__)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("method", ["baseline", "hire"])
def test_two_cpu_processes_make_one_run(glue_dir, tmp_path, method):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "CUDA_VISIBLE_DEVICES": ""}
    # Two tasks: both ranks must draw the same task each step, and DDP must accept the other
    # task's head getting no gradient.
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "-m", "deepen_run.cli.run", "task.names=[sst2,rte]", "backbone=tiny", f"method={method}",
                        "method.include_embeddings=true" if method == "hire" else "seed=42", f"data.glue_dir={glue_dir}",
                        "data.max_train_samples=256", "data.max_eval_samples=101", "data.max_seq_length=48",
                        "train.max_steps=6", "train.log_every=2", "train.batch_size=8", "train.learning_rate=1e-3",
                        "train.eval_batch_size=16",  # 7 dev batches a task: both ranks evaluate, the last round uneven
                        f"tracking.uri={uri}", f"hydra.run.dir={tmp_path}/run", f"data.cache_dir={tmp_path}/cache"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 0, r.stderr[-3000:]
    client, runs = runs_of(uri)
    assert len(runs) == 1, [x.info.run_name for x in runs]
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags["num_processes"] == "2"
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in losses] == [2, 4, 6]
    assert all(0.0 < m.value < 3.0 for m in losses)  # two classes each: ln 2 = 0.69 at the start
    # The learning rate follows the one-process schedule over 6 steps (Accelerate steps a prepared
    # scheduler once per process: laid out for one, it ran twice as fast and reached 0 at step 3).
    lrs = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/lr")}
    one = scheduler_for(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0),
                        make_cfg("train.max_steps=6").train, 6)
    expected = {}
    for step in range(1, 7):
        one.step()
        expected[step] = one.get_last_lr()[0]
    assert lrs[4] > 0 and lrs[4] / lrs[2] == pytest.approx(expected[4] / expected[2])
    m = run.data.metrics
    for key in ("eval/sst2/accuracy", "eval/rte/accuracy"):
        assert 0.0 <= m[key] <= 1.0
    assert math.isfinite(m["eval/score"])
    # Evaluation gathered both ranks' shards and dropped the padding duplicates: every dev row once.
    for task in ("sst2", "rte"):
        rows = open(client.download_artifacts(run.info.run_id, f"predictions/{task}.tsv")).read().splitlines()
        assert len(rows) == 1 + 101
        assert len({row.split("\t")[0] for row in rows[1:]}) == 101
        # Each prediction sits on its own example's row: accuracy from the file is the run's.
        hits = sum(row.split("\t")[1] == row.split("\t")[2] for row in rows[1:])
        assert hits / 101 == pytest.approx(m[f"eval/{task}/accuracy"])
        if method == "hire":  # the report's importances came gathered, in dev order, from the evaluation
            report = list(csv.DictReader(open(client.download_artifacts(run.info.run_id, "hire/examples.csv"))))
            labels = [float(row.split("\t")[2]) for row in rows[1:17]]
            assert [float(e["label"]) for e in report if e["task"] == task] == labels
            assert sum(m[f"hire/{task}/layer_{j}"] for j in (0, 1)) == pytest.approx(1, abs=1e-5)
    # One Hydra run directory (rank 0's); the other rank wrote nothing of Hydra's.
    assert (tmp_path / "run" / ".hydra" / "config.yaml").is_file()
    assert not (tmp_path / ".hydra").exists() and not list(tmp_path.glob("*.log"))
    assert {p.name for p in tmp_path.iterdir()} <= {"run", "mlflow.db", "mlflow.db.lock", "mlartifacts", "cache"}


def torchrun(tmp_path, *args, signal_rank: str | None = None, at_step: int = 0) -> subprocess.CompletedProcess:
    """deepen-run on two CPU ranks under torchrun; with signal_rank, that rank sends itself SIGTERM
    during step at_step (before its end-of-step check), through the run's real handlers."""
    script = tmp_path / "ranked.py"
    script.write_text("\n".join([
        "import os, signal, sys",
        "from deepen_run.run import checkpoint",
        "real = checkpoint.Checkpointer.on_step",
        "def on_step(self, done):",
        f"    if done == {at_step} and os.environ.get('RANK') == {signal_rank!r}:",
        "        os.kill(os.getpid(), signal.SIGTERM)",
        "    return real(self, done)",
        "checkpoint.Checkpointer.on_step = on_step",
        "sys.argv[0] = 'deepen-run'",
        "from deepen_run.cli.run import main",
        "main()"]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG)


@pytest.mark.subprocess
def test_a_signal_to_one_rank_stops_both_at_one_step_and_resume_auto_logs_the_same_loss(glue_dir, tmp_path):
    """Stopping by agreement across processes: SIGTERM reaches rank 1 alone during step 3 of 6; the
    ranks agree through Accelerate's trigger at that step's end, rank 0 saves step 3's checkpoint and
    the one run ends KILLED (neither rank waits forever in a collective the other left).
    docs/reliability.md, Resume: with log_every=2 that stop falls between the log lines of steps 2 and
    4; the same command with resume=auto on two ranks again: both continue the run
    rank 0 finds (rank 1's run dir is a private scratch dir, where it alone would find none: it used to
    start afresh and wait on rank 0 forever), and the one MLflow run's train/loss history, read back
    from the store, is an uninterrupted two-rank run's: both ranks' RNG states and running losses are in
    the checkpoint (rank 1's used to go to its scratch dir)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    a = ["task=rte", "backbone=tiny", f"data.glue_dir={glue_dir}", "data.max_train_samples=64",
         "data.max_eval_samples=16", "data.max_seq_length=32", "train.max_steps=6", "train.log_every=2",
         "train.batch_size=8", f"tracking.uri={uri}", f"data.cache_dir={tmp_path}/cache"]
    whole = torchrun(tmp_path, *a, f"hydra.run.dir={tmp_path}/whole", "tracking.experiment=whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    b = [*a, f"hydra.run.dir={tmp_path}/cut", "tracking.experiment=cut"]
    r = torchrun(tmp_path, *b, signal_rank="1", at_step=3)
    assert r.returncode != 0 and "stopped by SIGTERM" in r.stderr and "checkpoint step-3 kept" in r.stderr, \
        r.stderr[-3000:]
    _, (cut,) = runs_of(uri, "cut")
    assert cut.info.status == "KILLED" and cut.data.tags["interrupted"] == "SIGTERM"
    assert [p.name for p in (tmp_path / "cut" / "checkpoints").glob("step-*")] == ["step-3"]
    kept = {p.name for p in (tmp_path / "cut" / "checkpoints" / "step-3").iterdir()}
    assert {"random_states_0.pkl", "random_states_1.pkl", "loop_state_0.json", "loop_state_1.json"} <= kept, kept
    r = torchrun(tmp_path, *b, "resume=auto")
    assert r.returncode == 0 and "at step 3 of 6" in r.stdout, (r.stdout + r.stderr)[-3000:]
    client, (done,) = runs_of(uri, "cut")
    _, (ref,) = runs_of(uri, "whole")
    assert done.info.status == "FINISHED" and done.data.tags["num_processes"] == "2"
    history = [[(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")]
               for run in (ref, done)]
    assert [step for step, _ in history[0]] == [2, 4, 6]
    assert history[1] == history[0], history


@pytest.mark.subprocess
def test_a_resume_refused_on_rank_0_stops_every_rank_with_its_line(glue_dir, tmp_path):
    """Rank 0 resolves resume= and hands its answer on: a refusal there reaches rank 1 too, so both
    stop with the one line (exit 2) instead of rank 1 waiting for an answer that never comes."""
    r = torchrun(tmp_path, "task=rte", "backbone=tiny", f"data.glue_dir={glue_dir}", f"resume={tmp_path}/nowhere",
                 f"hydra.run.dir={tmp_path}/run", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db")
    line = f"resume={tmp_path}/nowhere: {tmp_path}/nowhere is not a deepen-run run dir"
    # (torchrun adds its own traceback of the failed ranks; each rank printed the line alone)
    assert r.returncode != 0 and r.stderr.count(line) == 2, r.stderr[-3000:]
    assert not (tmp_path / "mlflow.db").exists()
