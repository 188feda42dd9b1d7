"""MLflow, and only here: the tracker and run queries (store.py, the one module importing mlflow)
and `make ui`'s server and runs-table view (ui.py).
May import: base, config
"""
