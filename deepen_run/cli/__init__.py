"""The commands: deepen-run (run.py, the Hydra entry point), deepen-probe (probe.py) and
their --help, generated from the schema (usage.py); deepen-predict (predict.py) and deepen-export
(export.py), a trained model's (deepen_run/serve/). deepen-report lives in report/.
May import: base, config, methods, data, model, tracking, serve, run, report, sweep
"""
