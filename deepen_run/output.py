"""What a model's forward returns, shared by the model layer's heads and every method (the method
contract, deepen_run/methods/contract.py, re-exports it): a plain value type, below both."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Output:
    """What a method's forward returns. extras: whatever else the method hands out per example
    (HIRE: its layer importances "alpha", (B, J)), each a tensor whose first dim is the batch; the
    shared prediction loop (deepen_run/run/evaluation.py) gathers them in dev order during evaluation, so a
    method's report needs no second pass over the dev set and no state left on the module."""

    logits: Any
    extras: dict = field(default_factory=dict)
