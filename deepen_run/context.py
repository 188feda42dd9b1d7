"""What a method's hooks may read about the run: built by the entry point, passed along."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunContext:
    cfg: Any  # the resolved DictConfig
    tasks: list  # TaskSpec per task
    data: dict  # task name -> TaskData (tokenized splits)
    tokenizer: Any
    tracker: Any  # deepen_run.tracking.Tracker (no-op off the main process)
    accelerator: Any
    backbone_config: Any  # the original backbone's HF config, before any method changed it
    evaluation: Any = None  # the final evaluation (deepen_run.evaluation.Evaluation), for after_train
    extras: dict = field(default_factory=dict)
