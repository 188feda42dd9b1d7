"""MLflow, and only here: the tracker and run queries (store.py), opening a store (connect.py), a
run's LoggedModel and registry (models.py), and `make ui`'s server and runs-table view (ui.py).
May import: base, config
"""
