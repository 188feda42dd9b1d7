"""Parallel jobs of one sweep log the same GLUE files as dataset inputs at the same moment (the
fresh-clone CI's joblib sweep lost a job to it: MLflow's SQL store looks the datasets up, then
inserts, so the later job hit the UNIQUE constraint). Here four processes, held at a barrier, log the
same two files to their own runs in one real SQLite store at once: each run ends up linked to both,
and the experiment holds each file once."""
from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from deepen_run.tracking.store import Tracker

N = 4


def job(uri: str, glue_dir: str, barrier, out) -> None:
    from deepen_run.tracking.models import dataset_input, log_datasets

    tracker = Tracker(uri, "race")
    tracker.check()
    tracker.start("job", {})
    files = [dataset_input(f"rte/{s}", "train" if s == "train" else "dev", Path(glue_dir, "RTE", f"{s}.tsv"),
                           f"1:{s * 8}") for s in ("train", "dev")]
    barrier.wait()
    try:
        log_datasets(tracker, files)
        out.put((tracker.run_id, None))
    except Exception as e:  # noqa: BLE001 (the parent reports it)
        out.put((tracker.run_id, repr(e)[:300]))
    tracker.end()


@pytest.mark.slow
@pytest.mark.subprocess
def test_jobs_that_log_the_same_files_at_once_all_record_them(tmp_path, glue_dir):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    Tracker(uri, "race").check()  # the schema and the experiment first, as a sweep's parent does
    # Fresh processes, not forks of this one (which holds an open store): multiprocessing's fork
    # server imports the tracking code once, and each job is a fork of it.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["deepen_run.tracking.store", "deepen_run.tracking.models"])
    barrier, out = ctx.Barrier(N), ctx.Queue()
    procs = [ctx.Process(target=job, args=(uri, glue_dir, barrier, out)) for _ in range(N)]
    for p in procs:
        p.start()
    results = [out.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
    assert [err for _, err in results] == [None] * N, results
    client = MlflowClient(uri)
    for run_id, _ in results:
        names = sorted(d.dataset.name for d in client.get_run(run_id).inputs.dataset_inputs)
        assert names == ["rte/dev", "rte/train"]
