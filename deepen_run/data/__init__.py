"""GLUE data: task specs (glue.py), the TSV files and their checks (tsv.py), tokenized loaders
(loaders.py), a task's resumable stream of batches (stream.py), multi-task sampling (sampling.py), the data fingerprint a resume compares
(fingerprint.py) and the metrics (metrics/, an `evaluate` module loaded by its file path).
May import: base, config
"""
