"""A multirun: the Hydra callback and the MLflow parent run (callback.py), the jobs (jobs.py) and the
files they share with the launcher (outcomes.py), every job checked before any launches (check.py), the
launch (launch.py), continuing a sweep (resume.py) and its live summary (summary.py, figure.py).
May import: base, config, methods, data, model, tracking, run, report
"""
