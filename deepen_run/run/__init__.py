"""One run, start to end: pre-flight (preflight.py), the runner (runner.py), the training recipe
(train.py), evaluation and prediction (evaluation.py, predict.py), checkpoints and resume
(checkpoint.py, resume.py), the run dir's record run.json (runfile.py), signals (stop.py), how a run's
record ends (record.py), the lock and dead runs (lifecycle.py), what method hooks see (context.py), the run dir's guard and `make clean`
(rundir.py), its log (runlog.py), the summary, submissions, progress bars and device fast paths. A method's model module is reached through the
registry (deepen_run.methods.METHODS, by name), never imported here.
May import: base, config, methods, data, model, tracking, serve
"""
