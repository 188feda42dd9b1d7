"""deepen-run: config-driven GLUE experiments on BERT-style encoders (HIRE, PALs, layer duplication).

Layout: one subpackage per stage, each importing only the layers below it (tests/test_layers.py
checks every import statement, function-level ones included, against the `May import:` line of
each subpackage's docstring; that line is the one place the rule is written). Bottom to top:

  base         errors, util, masking, figures, output (this package's top-level modules)
  config       the structured schema, choices, redaction (the entry points hand it the methods' schemas)
  methods      the registry, contract, each method's config (they use config's types)
  data, tracking, model   GLUE files and loaders; MLflow; backbones and layer surgery (model > data)
  method models           each method's model (methods/<name>/model.py, report.py)
  run          one run: pre-flight, runner, training loop, evaluation, checkpoints, resume
  report       deepen-report: the results table from MLflow
  sweep        a multirun: parent run, jobs, resume, summary
  serve        a trained model: load, predict, export, its MLflow LoggedModel (deepen_run.load below)
  cli          the commands

The base modules here import nothing of ours but each other.
May import: base
"""
import importlib


def load(source, tracking_uri=None, device=None, trust_remote_code=False):
    """A trained model back from a run id, a run folder, a models:/ URI or an export folder: a
    deepen_run.serve.predictor.TrainedModel with .model, .tokenizer, .tasks, .heads and .predict(texts,
    task=...) (docs/use-a-model.md). Reached by name, so `import deepen_run` stays light. Code shipped with
    the model runs only with trust_remote_code=True (never because its folder says so)."""
    return importlib.import_module("deepen_run.serve.loading").load(source, tracking_uri=tracking_uri, device=device,
                                                                     trust_remote_code=trust_remote_code)

