"""The three commands: deepen-run (run.py, the Hydra entry point), deepen-probe (probe.py) and
their --help, generated from the schema (usage.py).
May import: base, config, methods, data, model, tracking, serve, run, report, sweep
"""
