"""A multirun: the Hydra callback and the MLflow parent run (callback.py), the jobs and the files
they share with the launcher (jobs.py), every job checked before any launches (check.py), the
launch (launch.py, counts.py), continuing a sweep (resume.py) and its live summary (summary.py, its figure in figure.py).
May import: base, config, methods, data, model, tracking, run, report
"""
