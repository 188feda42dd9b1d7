"""The model card (README.md) of an exported folder: what the model is, how it was trained, its dev
scores, what to cite, and how to load it (transformers directly, or deepen_run.load, and why)."""
from __future__ import annotations

from typing import Optional

from deepen_run.serve.table import predict_args

SETTINGS = ("backbone.path", "backbone.duplicate_layers", "backbone.duplicate_init", "task.names", "schedule.name",
            "train.learning_rate", "train.batch_size", "train.max_steps", "train.num_epochs", "train.model_selection",
            "data.max_seq_length", "data.max_train_samples", "data.train_fraction", "data.max_eval_samples", "seed")


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = node.get(part) if hasattr(node, "get") else None
        if node is None:
            return None
    return node


def citation(cfg) -> list[str]:
    """What the method's model module (and a layer-duplication step) says it implements."""
    from deepen_run.methods import METHODS

    out = []
    doc = METHODS[cfg.method.name].__doc__ or ""
    out.append(doc.strip().splitlines()[0] if doc.strip() else cfg.method.name)
    if list(cfg.backbone.duplicate_layers or []):
        from deepen_run.model import duplication

        out.append(" ".join(duplication.__doc__.split("\n\n")[0].split()))
    return out


def precision_note(precision: str, plain: bool) -> str:
    """What precision deepen_run.load predicts in (the run's own: serve/bundle.py run_choices), and what
    that means beside transformers, which loads the weights in fp32."""
    if precision in ("bf16", "fp16"):
        vs = (" transformers computes in fp32, so its logits differ by about 1e-3 and a prediction near a "
              "class boundary can differ;") if plain else ""
        return (f"Precision: deepen_run.load predicts in {precision}, as the run evaluated (its dev scores "
                f"below and predictions/ are reproduced exactly);{vs} `m.precision = \"no\"` predicts in fp32.")
    return ("Precision: fp32, as the run evaluated" + (" (deepen_run.load gives transformers' logits to within 1e-5)."
                                                      if plain else "."))


def text(cfg, info: dict, hf_class: Optional[str], why_not: Optional[str], method_files: Optional[str] = None) -> str:
    """method_files: the method's paragraph on its own files in the folder (methods' model_files hook)."""
    from omegaconf import OmegaConf

    tasks = ", ".join(info["tasks"])
    front = ["---", "tags: [deepen-run, glue, text-classification]", "datasets: [nyu-mll/glue]"]
    if hf_class:
        front.insert(1, "library_name: transformers")
    lines = front + ["---", "", f"# {info['backbone']} + {info['method']} on {tasks}", "",
                     f"Fine-tuned with deepen-run (run `{info.get('run_id', 'unknown')}`, step {info.get('step', '?')}): "
                     f"method `{info['method']}` on backbone `{info['backbone']}` ({_get(cfg, 'backbone.path')}), "
                     f"task(s) {tasks}.", "", "## How to load it", ""]
    if hf_class:
        lines += [f"A plain transformers classifier ({hf_class}):", "", "```python",
                  "from transformers import AutoModelForSequenceClassification, AutoTokenizer",
                  "model = AutoModelForSequenceClassification.from_pretrained(FOLDER)",
                  "tokenizer = AutoTokenizer.from_pretrained(FOLDER)", "```", "",
                  "or with deepen-run:", ""]
    else:
        lines += [f"With deepen-run only: {why_not}, so transformers' Auto classes cannot hold it.", ""]
    lines += [precision_note(info.get("precision") or "no", bool(hf_class)), ""]
    lines += ["```python", "import deepen_run", "m = deepen_run.load(FOLDER)",
              f"m.predict([...], task={info['tasks'][0]!r})  # labels, probabilities (STS-B: the score)", "```", "",
              f"or `deepen-predict --run FOLDER {predict_args('+'.join(info['tasks']))}`. The folder's config.yaml holds the run's whole "
              "config; deepen_run.json says what the weights are.", ""] + ([method_files] if method_files else []) + \
             ["## Training settings", "",
              "| key | value |", "|---|---|"]
    for key in SETTINGS:
        value = _get(cfg, key)
        if value is not None:
            shown = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            lines.append(f"| {key} | {shown} |")
    cut = _get(cfg, "data.max_eval_samples")
    lines += ["", "## Dev scores", ""] + \
        ([f"On a seeded {cut} examples of each dev set (data.max_eval_samples), not the whole set.", ""] if cut else []) + \
        ["| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v:.4f} |" for k, v in info.get("scores", {}).items()] or ["| (none recorded) | |"]
    lines += ["", "## Citation", ""] + [f"- {c}" for c in citation(cfg)] + \
             ["- GLUE: Wang et al. 2018, arXiv 1804.07461", ""]
    return "\n".join(lines)
