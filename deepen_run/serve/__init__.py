"""A trained model as a product (docs/use-a-model.md): load it back (loading.py) from a run, a run
folder, a models:/ URI or an export (locate.py), rebuilt from the run's own config (bundle.py);
predict (predictor.py); export a self-describing folder with a model card (export.py, card.py; hf.py:
when it is a plain transformers classifier); the LoggedModel and dataset inputs a run logs (publish.py).
Nothing is imported here, so every module of the package can import its siblings.
May import: base, config, methods, data, model, tracking
"""
