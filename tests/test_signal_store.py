"""A signal that lands anywhere, MLflow's own calls included, is only recorded (run/stop.py): the
call runs to its end, and the run stops at its next check.

Raised inside an MLflow call (the old design), after a SELECT inside a write transaction (MLflow's
log_batch reads latest_metrics after inserting the metrics), the exception's traceback kept SQLite's
write lock alive and the run's next write, ending it KILLED, failed "database is locked" (seen in
CI). A real signal to this process, sent from inside MLflow's own call (SQLAlchemy's statement hook)."""
import os
import signal

import pytest
import sqlalchemy
from mlflow.tracking import MlflowClient
from sqlalchemy import event

from deepen_run.run.stop import Stopped, StopFlag, check
from deepen_run.tracking.store import Tracker


def signal_after(select: str, signum=signal.SIGINT):
    """SQLAlchemy's hook that runs a statement (DialectEvents.do_execute): the statement runs, then
    the signal lands where a real one does, inside the call, its rows not yet read. Once: a second
    signal of the same kind would end this process at once, as it must."""
    fired = []

    def hook(cursor, statement, parameters, context):
        cursor.execute(statement, parameters)
        if statement.startswith(select) and not fired:
            fired.append(os.kill(os.getpid(), signum))
        return True  # executed here
    return hook


@pytest.mark.parametrize("where", ["metrics", "model"])
def test_a_signal_inside_an_mlflow_write_lets_it_end_and_stops_at_the_next_check(tmp_path, where):
    from deepen_run.tracking import models

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    flag = StopFlag().install()
    tracker = Tracker(uri, "exp")
    tracker.start("r", {})
    tracker.log_metrics({"train/loss": 0.7}, step=0)  # latest_metrics has a row: the SELECT below finds it
    hook = signal_after("SELECT latest_metrics" if where == "metrics" else "INSERT INTO logged_models")
    event.listen(sqlalchemy.engine.Engine, "do_execute", hook)
    try:
        if where == "metrics":
            tracker.log_metrics({"train/loss": 0.5}, step=5)
        else:
            models.log_model(tracker, "m", {}, {}, lambda folder: (folder / "w").write_text("w"), step=5)
        with pytest.raises(Stopped) as stopped:
            check()
    finally:
        event.remove(sqlalchemy.engine.Engine, "do_execute", hook)
        flag.uninstall()
    assert stopped.value.signum == signal.SIGINT and str(stopped.value) == "SIGINT"
    # What the run's record writes next: at once, no lock held by an interrupted statement
    tracker.set_tags({"interrupted": str(stopped.value)})
    tracker.end("KILLED")
    client = MlflowClient(uri)
    run = client.get_run(tracker.run_id)
    assert (run.info.status, run.data.tags["interrupted"]) == ("KILLED", "SIGINT")
    if where == "metrics":
        history = client.get_metric_history(tracker.run_id, "train/loss")
        assert [(m.step, m.value) for m in history] == [(0, 0.7), (5, 0.5)]
    else:  # the model's creation ran whole: READY, named by the run
        [model] = client.search_logged_models([tracker.experiment_id])
        assert model.status.name == "READY" and run.data.tags[models.MODEL_TAG] == model.model_id


def test_a_second_signal_of_the_same_kind_stops_the_process_at_once(tmp_path):
    """The first is recorded; the second restores the default disposition and re-raises it, so an
    impatient user stops at once (no code runs on: the process ends by the signal itself)."""
    import subprocess
    import sys

    code = ("import os, signal, time\n"
            "from deepen_run.run.stop import StopFlag\n"
            "flag = StopFlag().install()\n"
            "os.kill(os.getpid(), signal.SIGINT)\n"
            "print('recorded', flag.signum, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"  # another kind: recorded too, the first one kept
            "print('still', flag.signum, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGINT)\n"
            "time.sleep(5)\n"
            "print('not reached', flush=True)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGINT, r.stderr
    assert r.stdout.split("\n")[:2] == ["recorded 2", "still 2"] and "not reached" not in r.stdout
    assert "Traceback" not in r.stderr


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
