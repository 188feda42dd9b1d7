"""`hparams_search=lr`: the Optuna sweeper (in-memory study) maximising dev eval/score, one child run per trial."""
import pytest
import yaml

from conftest import cli, runs_of

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]


def test_optuna_search_runs_trials_as_children(glue_dir, mlflow_uri, tmp_path):
    r = cli("hparams_search=lr", "hydra.sweeper.n_trials=2", "task=rte", "backbone=tiny", "train.max_steps=2",
            "data.max_train_samples=32", "data.max_eval_samples=64", "data.max_seq_length=32",
            f"data.glue_dir={glue_dir}", f"tracking.uri={mlflow_uri}", f"hydra.sweep.dir={tmp_path}/sweep")
    assert r.returncode == 0, r.stderr[-3000:]
    client, runs = runs_of(mlflow_uri)
    (parent,) = [x for x in runs if x.data.tags.get("sweep_role") == "parent"]
    trials = [x for x in runs if x.data.tags.get("sweep_role") == "child"]
    assert parent.info.status == "FINISHED" and parent.data.tags["sweeper"] == "OptunaSweeper"
    assert parent.data.params["train.learning_rate"] == "tag(log, interval(1e-5, 1e-4))"
    assert len(trials) == 2 and all(t.info.status == "FINISHED" for t in trials)
    lrs = [float(t.data.params["train.learning_rate"]) for t in trials]
    assert all(1e-5 <= lr <= 1e-4 for lr in lrs) and lrs[0] != lrs[1]
    best = yaml.safe_load(open(client.download_artifacts(parent.info.run_id, "optimization_results.yaml")))
    assert best["best_value"] == max(t.data.metrics["eval/score"] for t in trials)
    assert parent.data.metrics["sweep/best_score"] == best["best_value"]


def test_a_failed_trial_is_an_optuna_fail_and_the_search_goes_on(glue_dir, mlflow_uri, tmp_path):
    """Trial 1 diverges (learning rate 1e12: a NaN loss, a FAILED child); trial 2 still runs and
    finishes (sampler seed 3 draws them in that order)."""
    a = ["hparams_search=lr", "train.learning_rate=choice(1e-4,1e12)", "hydra.sweeper.sampler.seed=3",
         "hydra.sweeper.n_trials=2", "task=rte", "backbone=tiny", "train.max_steps=3", "data.max_train_samples=32",
         "data.max_eval_samples=32", f"data.glue_dir={glue_dir}", f"tracking.uri={mlflow_uri}"]
    r = cli(*a, f"hydra.sweep.dir={tmp_path}/sweep")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    client, runs = runs_of(mlflow_uri)
    (parent,) = [x for x in runs if x.data.tags.get("sweep_role") == "parent"]
    trials = sorted((x for x in runs if x.data.tags.get("sweep_role") == "child"), key=lambda x: x.data.tags["sweep_job"])
    assert [t.info.status for t in trials] == ["FAILED", "FINISHED"] and parent.info.status == "FAILED"
    assert float(trials[0].data.params["train.learning_rate"]) == 1e12
    # Every trial failed: Optuna's sweeper raises at its end (no best trial), and the parent says FAILED,
    # not KILLED with a resume hint (there is nothing to continue).
    r = cli(*[x.replace("choice(1e-4,1e12)", "choice(1e12)") for x in a], f"hydra.sweep.dir={tmp_path}/all")
    line = r.stderr.strip().splitlines()[-1]  # one line, not Optuna's traceback
    assert r.returncode == 1 and "Traceback" not in r.stderr and "resume=auto" not in r.stderr, r.stderr[-3000:]
    assert line.startswith("deepen-run: error: every trial of the search failed"), line
    parents = [x for x in runs_of(mlflow_uri)[1] if x.data.tags.get("sweep_role") == "parent"]
    assert sorted(x.info.status for x in parents) == ["FAILED", "FAILED"]
