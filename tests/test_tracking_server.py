"""A real `mlflow server` as the store: a sweep whose first job has bad input and whose second writes
GLUE test-server files. Checks the HTTP store, a failing job, and submissions in one sweep (each
CLI process costs seconds here)."""

import pytest

from conftest import cli, runs_of


@pytest.mark.slow
@pytest.mark.subprocess
def test_sweep_on_a_tracking_server_with_a_failing_job_and_a_submission(glue_dir, mlflow_server, tmp_path):
    # Job 1 diverges at run time (lr 1e30: the NaN stop), which no pre-launch check can see; job 2 finishes.
    r = cli("-m", "train.learning_rate=1e30,5e-5", "data.max_train_samples=32", "predict=true", "task=sst2", "backbone=tiny", "train.max_steps=2",
            "train.batch_size=8", "data.max_eval_samples=32", "data.max_seq_length=32", f"data.glue_dir={glue_dir}",
            f"tracking.uri={mlflow_server}", f"hydra.sweep.dir={tmp_path}/sweep")
    assert r.returncode == 1, r.stderr[-3000:]  # a sweep with a failed job exits non-zero
    client, runs = runs_of(mlflow_server)
    (parent,) = [x for x in runs if x.data.tags.get("sweep_role") == "parent"]
    bad, good = sorted((x for x in runs if x.data.tags.get("sweep_role") == "child"),
                       key=lambda x: x.data.tags["sweep_job"])
    assert parent.info.status == "FAILED"
    assert parent.data.metrics["sweep/failed"] == 1 and parent.data.metrics["sweep/finished"] == 1
    assert parent.data.tags["sweep_failed"].startswith("1 of 2 jobs failed: job 1 (NonFiniteLoss: training loss is")
    assert bad.info.status == "FAILED" and "training loss is" in bad.data.tags["error"]
    assert good.info.status == "FINISHED" and "eval/sst2/accuracy" in good.data.metrics
    assert good.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert "[job 1/2] FAILED" in r.stdout and "[job 2/2] FINISHED" in r.stdout
    assert "1/2 jobs FINISHED, 1 failed" in r.stdout
    # The submission file went through the server's artifact proxy.
    rows = open(client.download_artifacts(good.info.run_id, "submission/SST-2.tsv")).read().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 1 + 1821
    assert [int(x.split("\t")[0]) for x in rows[1:]] == list(range(1821))
    assert {x.split("\t")[1] for x in rows[1:]} <= {"0", "1"}
