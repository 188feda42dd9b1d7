"""What the runner hands the training recipe (Run), and what a method's hooks may read (RunContext)."""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass
class Run:
    """One run as the runner built it, before training: train.setup(cfg, run) takes it from here."""
    tasks: list  # TaskSpec per task
    model: Any  # the method's model (contract.MethodModel) on the stepped backbone
    method: ModuleType  # the method's model module (its optional hooks)
    new_params: tuple  # every parameter that starts from scratch: the method's and the backbone steps'
    accelerator: Any
    tracker: Any  # deepen_run.tracking.store.Tracker (no-op off the main process)
    home: Any = None  # the run dir (checkpoints)
    resume_home: Any = None  # a killed run's dir to continue from, or None


@dataclass
class RunContext:
    cfg: Any  # the resolved DictConfig
    tasks: list  # TaskSpec per task
    data: dict  # task name -> TaskData (tokenized splits)
    tokenizer: Any
    tracker: Any  # deepen_run.tracking.store.Tracker (no-op off the main process)
    accelerator: Any
    evaluation: Any = None  # the final evaluation (run.evaluation.Evaluation): in the context after_train gets; None before
