"""What the runner hands the training recipe (Run), and what a method's hooks may read (RunContext).
Typed for readers and checkers; the imports are for annotations only (no torch or MLflow at import)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from accelerate import Accelerator
    from omegaconf import DictConfig
    from transformers import PreTrainedTokenizerBase

    from deepen_run.data.glue import TaskSpec
    from deepen_run.data.loaders import TaskData
    from deepen_run.methods.contract import MethodModel
    from deepen_run.run.evaluation import Evaluation
    from deepen_run.tracking.store import Tracker


@dataclass
class Run:
    """One run as the runner built it, before training: train.setup(cfg, run) takes it from here."""
    tasks: list[TaskSpec]
    model: MethodModel  # the method's model on the stepped backbone
    method: ModuleType  # the method's model module (its optional hooks)
    new_params: tuple  # every parameter that starts from scratch: the method's and the backbone steps'
    accelerator: Accelerator
    tracker: Tracker  # no-op off the main process
    home: Optional[Path] = None  # the run dir (checkpoints)
    resume_home: Optional[Path] = None  # a killed run's dir to continue from, or None


@dataclass
class RunContext:
    cfg: DictConfig  # the resolved config
    tasks: list[TaskSpec]
    data: dict[str, TaskData]  # task name -> tokenized splits
    tokenizer: PreTrainedTokenizerBase
    tracker: Tracker  # no-op off the main process
    accelerator: Accelerator
    evaluation: Optional[Evaluation] = None  # the final evaluation: in the context after_train gets; None before
