"""Choice-valued options, as Enums in the schema: composition rejects any other value with Hydra's
one-line message naming the key and the choices (no hand check anywhere).

StrEnum, so a value is also the plain string it stands for: code compares it with "mean", passes it
where a string is expected, and str()/f-strings/YAML give "mean". Member names equal their values
because OmegaConf turns a string into a member by name. Light (no torch): the schema imports it.
"""
from __future__ import annotations

try:
    from enum import StrEnum
except ImportError:  # Python 3.10: the same behaviour from a str mixin
    from enum import Enum

    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return self.value

        __format__ = str.__format__


class Precision(StrEnum):
    """train.mixed_precision: auto = bf16 on a bf16 GPU or a CPU with AMX / AVX-512 BF16, else no
    (deepen_run/run/fast.py)."""
    auto = "auto"
    no = "no"
    fp16 = "fp16"
    bf16 = "bf16"


class OptimizerImpl(StrEnum):
    """train.optimizer_impl: AdamW's kernel (deepen_run/run/fast.py, adamw_kwargs)."""
    auto = "auto"
    fused = "fused"
    foreach = "foreach"
    loop = "loop"


class Attention(StrEnum):
    """train.attention: the backbone's attention implementation (transformers' attn_implementation);
    auto = eager for bf16 on a CPU, else transformers' default (deepen_run/precision.py)."""
    auto = "auto"
    sdpa = "sdpa"
    eager = "eager"


class DropoutMasks(StrEnum):
    """train.dropout_masks: how dropout draws its masks; auto = fast for bf16 on a CPU, else torch's
    (deepen_run/precision.py, deepen_run/model/dropout.py)."""
    auto = "auto"
    torch = "torch"
    fast = "fast"


class Unpad(StrEnum):
    """train.unpad: whether training's layer Linears skip the padding; auto = on for bf16 on a CPU, else
    off (deepen_run/precision.py, deepen_run/model/unpad.py)."""
    auto = "auto"
    on = "on"
    off = "off"


class Selection(StrEnum):
    """train.model_selection: whose evaluation is the run's result (deepen_run/run/train.py)."""
    final = "final"
    best = "best"


class ScheduleKind(StrEnum):
    """schedule.kind (deepen_run/data/sampling.py)."""
    power = "power"
    annealed = "annealed"
    round_robin = "round_robin"


class Pool(StrEnum):
    """Token vectors -> one sentence vector (deepen_run.model.heads.pool)."""
    cls = "cls"
    mean = "mean"
    max = "max"


class Pooling(StrEnum):
    """A method's pooling: Pool, the backbone's pooler, or auto: the family's own convention
    (deepen_run/model/adapter.py, pooling), which never reads a pooler its checkpoint lacks."""
    auto = "auto"
    pooler = "pooler"
    cls = "cls"
    mean = "mean"
    max = "max"


class DuplicateInit(StrEnum):
    """backbone.duplicate_init: how a layer copy enters the stack (deepen_run/model/duplication.py)."""
    plain = "plain"
    gated = "gated"


class DuplicateTrain(StrEnum):
    """backbone.duplicate_train: what of a deepened backbone trains (deepen_run/model/duplication.py)."""
    all = "all"
    copies = "copies"
