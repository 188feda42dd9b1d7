"""method=pals end to end: MiniLM on four real GLUE tasks with the annealed schedule, read back from MLflow."""
import csv
import math
from pathlib import Path

import pytest

from conftest import cli, runs_of
from deepen_run.methods.pals.model import pal_params_per_task

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.subprocess]

TASKS = ["sst2", "mrpc", "rte", "stsb"]


def test_pals_multitask_run_records_metrics_sizes_and_schedule(glue_dir, mlflow_uri):
    cap = 2600  # above RTE's 2,490 training examples, below the others': unequal N_i
    r = cli("method=pals", f"task.names=[{','.join(TASKS)}]", "schedule=annealed", "backbone=minilm",
            f"data.glue_dir={glue_dir}", f"data.max_train_samples={cap}", "data.max_eval_samples=48",
            "data.max_seq_length=64", "train.max_steps=6", "train.steps_per_epoch=3", "train.batch_size=8",
            "train.log_every=3", f"tracking.uri={mlflow_uri}")
    assert r.returncode == 0, r.stderr[-3000:]
    client, (run,) = runs_of(mlflow_uri)
    assert run.info.status == "FINISHED" and run.data.tags["method"] == "pals"
    m = run.data.metrics

    wanted = ["eval/sst2/accuracy", "eval/mrpc/accuracy", "eval/mrpc/f1", "eval/rte/accuracy",
              "eval/stsb/pearson", "eval/stsb/spearmanr"]
    assert all(k in m and math.isfinite(m[k]) for k in wanted), {k: m.get(k) for k in wanted}
    means = [m["eval/sst2/accuracy"], (m["eval/mrpc/accuracy"] + m["eval/mrpc/f1"]) / 2, m["eval/rte/accuracy"],
             (m["eval/stsb/pearson"] + m["eval/stsb/spearmanr"]) / 2]
    assert m["eval/score"] == pytest.approx(sum(means) / 4)

    per_task = pal_params_per_task(384, 204, 6)
    assert m["params/backbone"] == 22_713_216 and m["params/method"] == 4 * per_task
    assert m["params/ratio"] == pytest.approx(m["params/total"] / m["params/backbone"])
    assert f"method {4 * per_task:,}" in r.stdout

    # The schedule: N_i from the data, alpha 1 in the first of the two epochs and 0.2 in the last.
    rte_n = sum(1 for _ in open(Path(glue_dir, "RTE", "train.tsv"), encoding="utf-8")) - 1
    sizes = {t: cap for t in TASKS} | {"rte": rte_n}
    rows = list(csv.DictReader(open(client.download_artifacts(run.info.run_id, "sampling/probabilities.csv"))))
    assert [(int(float(x["epoch"])), float(x["alpha"])) for x in rows] == [(1, 1.0), (2, pytest.approx(0.2))]
    for row in rows:
        a = float(row["alpha"])
        z = sum(n ** a for n in sizes.values())
        assert {t: float(row[t]) for t in TASKS} == pytest.approx({t: n ** a / z for t, n in sizes.items()})
    hist = client.get_metric_history(run.info.run_id, "sampling/p/rte")
    assert [(h.step, h.value) for h in hist] == [(0, pytest.approx(float(rows[0]["rte"]))),
                                                 (3, pytest.approx(float(rows[1]["rte"])))]
    arts = {a.path for a in client.list_artifacts(run.info.run_id, "sampling")}
    assert {"sampling/probabilities.csv", "sampling/probabilities.png"} <= arts
    preds = {a.path for a in client.list_artifacts(run.info.run_id, "predictions")}
    assert preds == {f"predictions/{t}.tsv" for t in TASKS}
