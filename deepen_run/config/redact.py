"""Keep secrets out of MLflow: the logged params and config.yaml are the resolved config, and a
resolved ${oc.env:...} may hold a password or token.

Masked: the value of any key that looks secret (password, token, api_key, ...), the password of a
URL's user:password@ part, and every occurrence of the value of a secret-looking environment
variable (MLFLOW_TRACKING_PASSWORD, HF_TOKEN, ...) wherever it ended up in a string.
"""
from __future__ import annotations

import os
import re
from typing import Any

from omegaconf import OmegaConf

MASK = "***"
SECRET_NAME = re.compile(r"pass(word|wd)?|secret|token|api[_-]?key|credential|private[_-]?key|auth", re.I)
URL_PASSWORD = re.compile(r"(://[^/:@\s]+:)([^/@\s]+)(@)")


def secret_env_values() -> list[str]:
    # Longest first, so a secret that contains another is masked whole; short values would mask noise.
    vals = {v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v) >= 4}
    return sorted(vals, key=len, reverse=True)


def mask_string(s: str, secrets: list[str]) -> str:
    for v in secrets:
        s = s.replace(v, MASK)
    return URL_PASSWORD.sub(rf"\g<1>{MASK}\g<3>", s)


def scrub(obj: Any, secrets: list[str], key: str = "") -> Any:
    if isinstance(obj, dict):
        return {k: scrub(v, secrets, str(k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub(v, secrets, key) for v in obj]
    if obj is not None and SECRET_NAME.search(key):
        return MASK
    return mask_string(obj, secrets) if isinstance(obj, str) else obj


def public_config(cfg) -> dict:
    """The resolved config as MLflow may see it: secrets masked, `resume` left out (it differs
    between the first attempt and a resume of the same run, and MLflow params are write-once)."""
    # enum_to_str: choice options (deepen_run/config/choices.py) become the plain strings MLflow shows.
    resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    resolved.pop("resume", None)
    return scrub(resolved, secret_env_values())
