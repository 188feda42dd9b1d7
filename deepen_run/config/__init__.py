"""The configuration: the structured schema Hydra validates against (schema.py), the choice-valued
options as Enums (choices.py), the values each section refuses (checks.py, from __post_init__), the
schema's keys by kind (keys.py), and what is kept out of MLflow (redact.py). Light: no torch.

The pre-flight that checks a composed config against data, backbone and methods needs those
layers, so it lives in run/ (run/preflight.py), not here.
Below methods/: the method schemas are handed to schema.register by the entry points.
May import: base
"""
