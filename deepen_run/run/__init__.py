"""One run, start to end: pre-flight (preflight.py), the runner (runner.py), the recipe (train.py, its
counters in bookkeeping.py), evaluation and prediction, checkpoints and resume, the run dir's record
and guard (resume.py, rundir.py, clean.py), signals (stop.py) and how a run's record ends (record.py).
A method's model module is reached through the registry (deepen_run.methods.METHODS), never imported here.
May import: base, config, methods, data, model, tracking, serve
"""
