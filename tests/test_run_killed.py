"""RunKilled: how a stopped run tells its caller (the command's exit message, a sweep job's outcome)
which signal stopped it and which checkpoint it left: named fields, kept across the pickling that
carries a sweep job's exception back to its launcher (joblib/loky, submitit)."""
import pickle
import signal
from pathlib import Path

from deepen_run.run.lifecycle import Interrupted
from deepen_run.run.runner import RunKilled


def test_a_killed_run_names_its_signal_and_checkpoint_across_pickling():
    for ckpt in (Path("/runs/a/checkpoints/step-40"), None):
        e = pickle.loads(pickle.dumps(RunKilled(signal.SIGUSR1, ckpt)))
        assert isinstance(e, RunKilled) and isinstance(e, Interrupted) and isinstance(e, KeyboardInterrupt)
        assert (e.signum, e.checkpoint, str(e)) == (signal.SIGUSR1, ckpt, "SIGUSR1")
