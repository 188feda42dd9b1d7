"""One run's state, typed: the runner builds it, train.setup fills in the training pieces, train.fit
works on it, and a method's hooks read it (after_build(model, ctx), after_train(model, ctx)).
The imports are for annotations only (no torch or MLflow at import)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from omegaconf import DictConfig
    from torch.utils.data import DataLoader
    from transformers import PreTrainedTokenizerBase

    from deepen_run.data.glue import TaskSpec
    from deepen_run.data.loaders import TaskData
    from deepen_run.data.sampling import TaskSampler
    from deepen_run.data.stream import TaskStream
    from deepen_run.methods.contract import MethodModel
    from deepen_run.precision import Compute
    from deepen_run.run.checkpoint import Checkpointer
    from deepen_run.run.evaluation import Evaluation
    from deepen_run.tracking.store import Tracker


@dataclass
class RunState:
    # What the runner built, before training.
    cfg: DictConfig  # the resolved config
    tasks: list[TaskSpec]
    model: MethodModel  # the method's model on the stepped backbone; prepared by Accelerate in setup
    method: ModuleType  # the method's model module (its optional hooks)
    new_params: tuple  # every parameter that starts from scratch: the method's and the backbone steps'
    accelerator: Accelerator
    tracker: Tracker  # no-op off the main process
    compute: Compute  # precision, attention, fast paths: resolved once (deepen_run/precision.py)
    home: Optional[Path] = None  # the run dir (checkpoints)
    resume_home: Optional[Path] = None  # a killed run's dir to continue from, or None
    # What train.setup adds.
    tokenizer: Optional[PreTrainedTokenizerBase] = None
    data: dict[str, TaskData] = field(default_factory=dict)  # task name -> tokenized splits
    optimizer: Optional[torch.optim.Optimizer] = None
    scheduler: Optional[torch.optim.lr_scheduler.LRScheduler] = None
    sampler: Optional[TaskSampler] = None
    streams: dict[str, TaskStream] = field(default_factory=dict)  # task -> its endless, resumable batches
    dev: dict[str, DataLoader] = field(default_factory=dict)  # eval name -> prepared dev loader
    eval_specs: dict[str, TaskSpec] = field(default_factory=dict)  # eval name -> its task
    saver: Optional[Checkpointer] = None
    total: int = 0  # steps of the whole run (early stopping may lower it)
    start: int = 0  # the first step to run: 0, or a resumed checkpoint's step
    undefined: list[str] = field(default_factory=list)  # metrics already reported undefined (warned once)
    evaluation: Optional[Evaluation] = None  # the final evaluation, for after_train; None before
