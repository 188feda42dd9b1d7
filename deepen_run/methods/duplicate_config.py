"""Layer duplication's options and their check: light (no torch), so the schema registers and bad
indices fail before any weights load. The model surgery is in deepen_run/methods/duplicate.py."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Config:
    name: str = "duplicate"
    layers: list[int] = field(default_factory=list)
    pooling: str = "pooler"  # as the baseline: pooler | cls | mean | max
    # Dev examples per task for duplicate/cosine_before_finetune.
    cosine_samples: int = 256


def backbone_depth(bcfg) -> int:
    """The backbone's layer count from its config file alone (no weights load)."""
    if not bcfg.pretrained:
        return bcfg.num_hidden_layers
    from transformers import AutoConfig

    from deepen_run.backbone import resolve

    kw = dict(revision=bcfg.revision, trust_remote_code=bcfg.trust_remote_code)
    try:  # a cached Hub config reads without the network (the preflight already found it)
        return AutoConfig.from_pretrained(resolve(bcfg.path), local_files_only=True, **kw).num_hidden_layers
    except (OSError, ValueError):
        return AutoConfig.from_pretrained(resolve(bcfg.path), **kw).num_hidden_layers


def check(cfg) -> None:
    """Runner hook, after the backbone preflight: bad indices fail before any weights load."""
    from deepen_run.layers import check_indices  # torch.nn: only once the config is otherwise sound

    check_indices(list(cfg.method.layers), backbone_depth(cfg.backbone))
    if cfg.method.cosine_samples <= 0:
        from deepen_run.errors import UserError

        raise UserError(f"method.cosine_samples={cfg.method.cosine_samples} must be positive")
