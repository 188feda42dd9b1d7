"""Keep secrets out of MLflow: the logged params and config.yaml are the resolved config, and a
resolved ${oc.env:...} may hold a password or token.

Masked: the value of any key that looks secret (password, token, api_key, ...), the password of a
URL's user:password@ part, and every occurrence of the value of a secret-looking environment
variable (MLFLOW_TRACKING_PASSWORD, HF_TOKEN, ...) wherever it ended up in a string.

A name looks secret by its words (split at _ . - and case): hf_token, MLFLOW_TRACKING_PASSWORD,
api_key do; pad_token_id, token_type_ids (an id is a number, not a secret) and TOKENIZERS_PARALLELISM
do not. docs/reliability.md, "Secrets".
"""
from __future__ import annotations

import os
import re
from typing import Any

from omegaconf import OmegaConf

MASK = "***"
SECRET_WORDS = frozenset({"pass", "password", "passwd", "pwd", "secret", "token", "apikey", "credential",
                          "credentials", "auth", "authorization"})
NOT_SECRET_LAST = frozenset({"id", "ids", "type", "types"})  # pad_token_id: a number naming a token
# user:password@ in a URL; the password runs to the last @ before the host (it may hold one).
URL_PASSWORD = re.compile(r"(://[^/:@\s]+:)([^\s/]+)(@)")


def looks_secret(name: str) -> bool:
    """Does this key or environment variable name look secret (by its words)?"""
    words = [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()) if w]
    if not words or words[-1] in NOT_SECRET_LAST:
        return False
    pairs = {" ".join(p) for p in zip(words, words[1:])}
    return bool(SECRET_WORDS & set(words)) or bool(pairs & {"api key", "private key", "access key"})


def mask_uri(uri: str) -> str:
    """The URI as it may be shown: a user:password@ part's password as ***."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        u = urlsplit(str(uri))
    except ValueError:
        return mask_string(str(uri), [])
    if u.password is None:
        return str(uri)
    host = u.netloc.rpartition("@")[2]
    return urlunsplit(u._replace(netloc=f"{u.username}:{MASK}@{host}"))


def secret_env_values() -> list[str]:
    # Longest first, so a secret that contains another is masked whole; short values would mask noise.
    vals = {v for k, v in os.environ.items() if looks_secret(k) and len(v) >= 4}
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
    if obj is not None and looks_secret(key):
        return MASK
    return mask_string(obj, secrets) if isinstance(obj, str) else obj


def restore_masked(saved: Any, now: Any) -> Any:
    """A saved config's masked leaves given back from the current one, where masking the current value
    gives the saved one (a resume reads run_config.yaml, which holds no secret)."""
    if isinstance(saved, dict) and isinstance(now, dict):
        return {k: restore_masked(v, now.get(k)) for k, v in saved.items()}
    if isinstance(saved, str) and MASK in saved and isinstance(now, str) and \
            mask_string(now, secret_env_values()) == saved:
        return now
    return saved


def public_config(cfg) -> dict:
    """The resolved config as MLflow may see it: secrets masked, `resume` left out (it differs
    between the first attempt and a resume of the same run, and MLflow params are write-once)."""
    # enum_to_str: choice options (deepen_run/config/choices.py) become the plain strings MLflow shows.
    resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    resolved.pop("resume", None)
    return scrub(resolved, secret_env_values())
