"""A trained model in memory: deepen_run.load's result, and its predict().

Texts are tokenized and batched exactly as the run's evaluation did (data/loaders.py: the run's
tokenizer and data.max_seq_length, longest first, train.eval_batch_size a batch), so a dev set
through predict() gives the run's own predictions/<task>.tsv.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import torch

from deepen_run.errors import UserError
from deepen_run.serve.table import Text, pick_task, split_inputs

INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # what a model's forward takes from a batch


def pick_device(name: Optional[str]) -> torch.device:
    """The device to predict on: cuda if there is one, else cpu; a named one must be usable here
    (an empty tensor on it), so a typo or a missing GPU is one line before any weights load."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
        torch.empty(0, device=device)
    except (RuntimeError, ValueError, AssertionError) as e:  # AssertionError: "Torch not compiled with CUDA"
        from deepen_run.util import first_line

        raise UserError(f"device {name!r} is not usable here ({first_line(e)}); use cpu or a device torch sees") from None
    return device


@dataclass
class Prediction:
    """One input's result. label/probabilities for a classification task, score for STS-B;
    extras: what else the method hands out per example (HIRE: "alpha", its layer importances)."""
    label: Optional[str] = None
    label_id: Optional[int] = None
    probability: Optional[float] = None
    probabilities: dict = field(default_factory=dict)
    score: Optional[float] = None
    extras: dict = field(default_factory=dict)


class TrainedModel:
    """model (eval mode), tokenizer, tasks (name -> TaskSpec), heads, cfg (the run's config), info."""

    def __init__(self, model, tokenizer, tasks, cfg, info: dict, folder: Path, device: Optional[str] = None,
                 precision: str = "no"):
        self.device = pick_device(device)
        self.model, self.tokenizer, self.cfg, self.info, self.folder = model.to(self.device), tokenizer, cfg, info, folder
        self.tasks = {t.name: t for t in tasks}
        self.heads = model.heads
        # The run's own precision (bundle.run_choices: its evaluation ran under Accelerate's autocast), so
        # a dev set through predict() gives the run's predictions/<task>.tsv exactly; "no" = full fp32,
        # what an export to transformers computes.
        self.precision = precision

    def __repr__(self) -> str:
        return (f"TrainedModel({self.info.get('method')} on {self.info.get('backbone')}, tasks "
                f"{', '.join(self.tasks)}, run {self.info.get('run_id')})")

    def spec(self, task: Optional[str]):
        return pick_task(self.tasks, task)

    @torch.no_grad()
    def forward(self, texts: Sequence[Text], task: Optional[str] = None, batch_size: Optional[int] = None):
        """-> (logits (N, C), extras {key: (N, ...)}) in input order."""
        import datasets

        from deepen_run.data import loaders as gd

        spec = self.spec(task)
        a, b = split_inputs(texts, spec)
        if not a:  # nothing to tokenize (datasets builds no columns from empty lists)
            return torch.zeros(0, spec.num_labels), {}
        cols = {"text_a": a} | ({"text_b": b} if b is not None else {})
        datasets.disable_progress_bars()
        ds = gd.tokenize(datasets.Dataset.from_dict(cols), self.tokenizer, self.cfg.data.max_seq_length, None,
                         spec.name)
        loader = gd.eval_loader(ds, self.tokenizer, batch_size or self.cfg.train.eval_batch_size)
        logits, extras = [], {}
        half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        for batch in loader:
            with torch.autocast(self.device.type, dtype=half or torch.bfloat16, enabled=half is not None):
                out = self.model(spec.name, **{k: batch[k].to(self.device) for k in INPUTS if k in batch})
            logits.append(out.logits.float().cpu())
            for k, v in out.extras.items():
                extras.setdefault(k, []).append(v.float().cpu())
        back = torch.argsort(torch.tensor(loader.dataset.order))
        return torch.cat(logits)[back], {k: torch.cat(v)[back] for k, v in extras.items()}

    def predict(self, texts: Sequence[Text], task: Optional[str] = None,
                batch_size: Optional[int] = None) -> list[Prediction]:
        """Sentences (or pairs, for a pair task) -> one Prediction each, in order."""
        spec = self.spec(task)
        logits, extras = self.forward(texts, task, batch_size)
        out = []
        for i, row in enumerate(logits):
            ex = {k: v[i].reshape(-1).tolist() for k, v in extras.items()}
            if spec.is_regression:
                out.append(Prediction(score=float(row.squeeze(-1)), extras=ex))
                continue
            p = torch.softmax(row, -1)
            k = int(row.argmax())
            out.append(Prediction(spec.label_names[k], k, float(p[k]),
                                  {n: float(v) for n, v in zip(spec.label_names, p)}, extras=ex))
        return out
