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
