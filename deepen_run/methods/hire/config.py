"""HIRE's options and their checks: light (no torch), so the schema registers and bad options
fail before anything heavy loads. The model is in deepen_run/methods/hire/model.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from deepen_run.config.choices import Pool, StrEnum
from deepen_run.config.schema import neutral
from deepen_run.errors import UserError


class Summary(StrEnum):
    """method.summary: a layer's BiGRU outputs -> s_j (see deepen_run.config.choices for why StrEnum)."""
    mean = "mean"
    last = "last"


class Importance(StrEnum):
    """method.importance: the paper's dynamic weights, or a fixed ablation."""
    dynamic = "dynamic"
    mean = "mean"
    random = "random"


@dataclass
class Config:
    """method=hire: HIRE layer importances + BiGRU fusion (Yang & Zhao 2019).

    name: the method (set by method=<option>)
    gru_layers: depth of the fusion BiGRU (the paper: 2)
    include_embeddings: also offer the embedding output H_0 to the extractor
    summary: how a layer's BiGRU outputs become its summary: mean (masked mean) | last (final states)
    pool: fusion output -> sentence vector: cls | mean | max
    importance: dynamic (the paper) | mean (uniform 1/J) | random (fixed, drawn once): an ablation
    random_seed: seed of importance=random's weights, independent of the run's seed
    extractor: false = the capacity control: the fusion and head read the last layer alone (A = R), no extractor
    shared: one HIRE for all tasks (true) or one per task (false); heads are always per task
    dropout: head dropout; null = the backbone's hidden_dropout_prob
    report_examples: dev examples per task whose importances are recorded one by one
    """

    name: str = "hire"
    gru_layers: int = 2  # the paper's ablation: 2 was best on CoLA
    include_embeddings: bool = False
    summary: Summary = Summary.mean
    pool: Pool = Pool.cls
    importance: Importance = Importance.dynamic
    random_seed: int = 0
    # false: the capacity control. The fusion BiGRU and head stay, but read the last layer alone
    # (A = R, so M = [R; R; 2R; R*R]): what HIRE's extra parameters give without the other layers.
    extractor: bool = True
    shared: bool = True
    dropout: Optional[float] = None
    report_examples: int = neutral(16)


def check(cfg) -> None:
    """The run's pre-flight (whole config), before any model loads."""
    check_method(cfg.method)


def check_method(cfg: Config) -> None:
    if cfg.gru_layers < 1:
        raise UserError(f"method.gru_layers={cfg.gru_layers}: the fusion BiGRU needs at least 1 layer; "
                        "set method.gru_layers=1 or more (the paper uses 2)")
    if not cfg.extractor and cfg.importance != Importance.dynamic:
        raise UserError(f"method.extractor=false reads no intermediate layer, so method.importance={cfg.importance} "
                        "has nothing to weigh; drop one of the two")
    if cfg.report_examples < 0:
        raise UserError(f"method.report_examples={cfg.report_examples} must be >= 0")
    if cfg.dropout is not None and not 0 <= cfg.dropout < 1:  # `not` also catches NaN
        raise UserError(f"method.dropout={cfg.dropout} must be in [0, 1) (null: the backbone's hidden_dropout_prob)")
