"""A signal that lands inside an MLflow call: a run's Ctrl-C while it writes to its SQLite store.

Raised there, after a SELECT inside a write transaction (MLflow's log_batch reads latest_metrics
after inserting the metrics), the exception's traceback kept the SELECT's cursor alive: SQLAlchemy
closed the connection, but SQLite keeps a connection with an unfinished statement open, write lock
and all. The run's next write, ending it KILLED while the exception was in hand, waited out MLflow's
20 s busy timeout, failed "database is locked", and the run stayed RUNNING (seen in CI: a Ctrl-C'd
sweep's job). A run's MLflow calls now run whole, and the signal acts at the call's end. A real
SIGINT to this process, sent from inside MLflow's own call (SQLAlchemy's statement hook)."""
import os
import signal

import pytest
import sqlalchemy
from mlflow.tracking import MlflowClient
from sqlalchemy import event

from deepen_run.run.lifecycle import Interrupted, SignalGuard
from deepen_run.tracking.store import Tracker


def ctrl_c_after(select: str):
    """SQLAlchemy's hook that runs a statement (DialectEvents.do_execute): the statement runs, then
    the signal lands where a real one does, inside the call, its rows not yet read."""
    def hook(cursor, statement, parameters, context):
        cursor.execute(statement, parameters)
        if statement.startswith(select):
            os.kill(os.getpid(), signal.SIGINT)
        return True  # executed here
    return hook


@pytest.mark.parametrize("where", ["raised-at-once", "in-a-step", "second-signal"])
def test_a_signal_inside_an_mlflow_write_waits_for_the_write_to_end(tmp_path, where):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    guard = SignalGuard().install()
    tracker = Tracker(uri, "exp", signals=guard)
    tracker.start("r", {})
    tracker.log_metrics({"train/loss": 0.7}, step=0)  # latest_metrics has a row: the SELECT below finds it
    hook, written = ctrl_c_after("SELECT latest_metrics"), []
    event.listen(sqlalchemy.engine.Engine, "do_execute", hook)
    try:
        if where == "in-a-step":  # the write ends, and the signal waits for the step's end
            with guard.deferred():
                tracker.log_metrics({"train/loss": 0.5}, step=5)
                written.append(guard.pending)
                with pytest.raises(Interrupted) as stopped:
                    guard.raise_pending()
            assert written == [signal.SIGINT]
        else:
            if where == "second-signal":  # one came before and was raised at once: it stays pending
                with pytest.raises(Interrupted):
                    os.kill(os.getpid(), signal.SIGTERM)
            with pytest.raises(Interrupted) as stopped:  # raised at the write's end, not inside it
                tracker.log_metrics({"train/loss": 0.5}, step=5)
    finally:
        event.remove(sqlalchemy.engine.Engine, "do_execute", hook)
        guard.uninstall()
    # What the runner writes next, the exception in hand: it waited 20 s and failed
    tracker.set_tags({"interrupted": str(stopped.value)})
    tracker.end("KILLED")
    run = MlflowClient(uri).get_run(tracker.run_id)
    assert (run.info.status, run.data.tags["interrupted"]) == ("KILLED", "SIGTERM" if where == "second-signal" else "SIGINT")
    history = MlflowClient(uri).get_metric_history(tracker.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(0, 0.7), (5, 0.5)]


@pytest.mark.parametrize("where", ["raised-in-evaluation", "deferred-in-a-step"])
def test_a_signal_that_library_code_turns_into_another_error_still_ends_the_run_killed(tmp_path, glue_dir,
                                                                                      monkeypatch, where):
    """Raised inside library code, a signal can come out as another exception: CPython's `from os
    import <a name it lacks>` (tqdm, under datasets' reader in the evaluation) turned a SIGUSR1 into
    "TypeError: expected a message argument", and the run ended FAILED, exit 1 (seen in CI). The
    signal came first: the run ends KILLED with its checkpoint, as for any signal. The same turn,
    played by a metric computation that catches the KeyboardInterrupt and raises a TypeError. A
    signal only deferred (inside a step) raised nothing: an error in that step is the run's own, and
    the run ends FAILED with it."""
    import time

    from conftest import make_cfg
    from deepen_run.data import metrics
    from deepen_run.run import runner, train
    from deepen_run.run.preflight import check

    real_compute, real_loss, calls = metrics.compute, train.task_loss, []

    def compute(*a, **k):
        try:
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(5)  # the handler raises Interrupted here, at once (evaluation is not deferred)
        except KeyboardInterrupt:
            raise TypeError("expected a message argument") from None
        return real_compute(*a, **k)

    def task_loss(*a, **k):
        calls.append(1)
        if len(calls) == 3:  # step 3, after the checkpoint of step 2
            os.kill(os.getpid(), signal.SIGUSR1)  # deferred to the step's end
            raise RuntimeError("a real failure in the step")
        return real_loss(*a, **k)

    home = tmp_path / "run"
    home.mkdir()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_cfg("backbone=tiny", "task=rte", "train.max_steps=4", "train.save_every=2", "train.eval_every=2",
                   "data.max_train_samples=16", "data.max_eval_samples=8", "data.max_seq_length=32",
                   "train.mixed_precision=no", f"data.glue_dir={glue_dir}", f"tracking.uri={uri}",
                   f"data.cache_dir={tmp_path}/cache")
    monkeypatch.setattr(runner, "current_dir", lambda: home)
    if where == "raised-in-evaluation":
        monkeypatch.setattr(metrics, "compute", compute)
    else:
        monkeypatch.setattr(train, "task_loss", task_loss)
    guard = SignalGuard().install()
    try:
        with pytest.raises(runner.RunKilled if where == "raised-in-evaluation" else RuntimeError) as ended:
            runner.run(cfg, check(cfg), signals=guard)
    finally:
        guard.uninstall()
    run = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("deepen-run").experiment_id])[0]
    if where == "raised-in-evaluation":
        assert ended.value.signum == signal.SIGUSR1 and ended.value.checkpoint == home / "checkpoints" / "step-2"
        assert run.info.status == "KILLED", run.data.tags
        assert run.data.tags["interrupted"] == "SIGUSR1 (it surfaced as TypeError: expected a message argument)"
        assert "error" not in run.data.tags
    else:
        assert run.info.status == "FAILED", run.data.tags
        assert run.data.tags["error"] == "RuntimeError: a real failure in the step"
        assert "interrupted" not in run.data.tags


def test_a_signal_at_the_end_of_the_models_creation_leaves_no_pending_model(tmp_path):
    """Raised at the end of create_logged_model, a signal left a PENDING model in the Models tab whose
    id the run never saw (so never finalized). It now waits for the id, and the model ends FAILED
    (the resumed run publishes a new one); the run's tag names no model."""
    from deepen_run.tracking import models

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    guard = SignalGuard().install()
    tracker = Tracker(uri, "exp", signals=guard)
    tracker.start("r", {})
    tracker.log_metrics({"eval/score": 0.75}, step=4)
    hook, filled = ctrl_c_after("INSERT INTO logged_models"), []
    event.listen(sqlalchemy.engine.Engine, "do_execute", hook)
    try:
        with pytest.raises(Interrupted):
            models.log_model(tracker, "m", {}, {}, filled.append, step=4)
    finally:
        event.remove(sqlalchemy.engine.Engine, "do_execute", hook)
        guard.uninstall()
    client = MlflowClient(uri)
    [model] = client.search_logged_models([tracker.experiment_id])
    assert model.status.name == "FAILED" and not filled  # stopped before any file was written
    assert models.MODEL_TAG not in client.get_run(tracker.run_id).data.tags


def test_a_signal_as_the_model_is_marked_ready_leaves_it_ready(tmp_path):
    """The signal of a call is raised as the call returns: at the end of the one that marks the model
    READY, it must not reach the handler that marks a failed publishing FAILED."""
    from deepen_run.tracking import models

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    guard = SignalGuard().install()
    tracker = Tracker(uri, "exp", signals=guard)
    tracker.start("r", {})
    hook = ctrl_c_after("UPDATE logged_models SET")  # finalize: its only UPDATE here
    event.listen(sqlalchemy.engine.Engine, "do_execute", hook)
    try:
        with pytest.raises(Interrupted):
            models.log_model(tracker, "m", {}, {}, lambda folder: (folder / "weights").write_text("w"), step=4)
    finally:
        event.remove(sqlalchemy.engine.Engine, "do_execute", hook)
        guard.uninstall()
    client = MlflowClient(uri)
    [model] = client.search_logged_models([tracker.experiment_id])
    assert model.status.name == "READY"
    assert client.get_run(tracker.run_id).data.tags[models.MODEL_TAG] == model.model_id


def test_a_signal_that_surfaces_as_another_error_while_the_weights_load_stops_the_command(tmp_path, glue_dir,
                                                                                       monkeypatch):
    """Before the run exists in MLflow (loading the weights), the same turn of a signal into another
    error made the command fail (exit 1, a sweep's job FAILED): it now stops it as that signal."""
    from conftest import make_cfg
    from deepen_run.cli.run import checked_run
    from deepen_run.model import steps
    from deepen_run.run import resume, runner

    import time

    def load(cfg):
        try:
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(5)  # the handler raises Interrupted here, at once (loading is not deferred)
        except KeyboardInterrupt:
            raise TypeError("expected a message argument") from None

    home = tmp_path / "run"
    home.mkdir()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_cfg("backbone=tiny", "task=rte", "train.max_steps=2", "data.max_train_samples=16",
                   f"data.glue_dir={glue_dir}", f"tracking.uri={uri}", f"data.cache_dir={tmp_path}/cache")
    monkeypatch.setattr(resume, "current_dir", lambda: home)
    monkeypatch.setattr(runner, "current_dir", lambda: home)
    monkeypatch.setattr(steps, "load", load)
    with pytest.raises(Interrupted) as stopped:
        checked_run(cfg)
    assert stopped.value.signum == signal.SIGUSR1 and isinstance(stopped.value.__cause__, TypeError)
    assert not isinstance(getattr(signal.getsignal(signal.SIGUSR1), "__self__", None), SignalGuard)  # given back
    assert not MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("deepen-run").experiment_id])


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_kept(tmp_path):
    """The lock was opened following links, then emptied: a run dir's `.lock` linked to a file of the
    user's would have lost that file's content."""
    from deepen_run.errors import UserError
    from deepen_run.run.lifecycle import LOCK, run_dir_lock

    mine = tmp_path / "notes.txt"
    mine.write_text("a user's file")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LOCK).symlink_to(mine)
    with pytest.raises(UserError, match="is a link"):
        with run_dir_lock(tmp_path / "run"):
            pass
    assert mine.read_text() == "a user's file"
