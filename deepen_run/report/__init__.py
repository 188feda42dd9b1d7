"""deepen-report: runs from MLflow -> the results table (main.py), its rows (rows.py), contrasts
(contrasts.py), missing runs (missing.py), Markdown/CSV (output.py) and figure (figure.py).
May import: base, config, methods, data, tracking, run
"""
