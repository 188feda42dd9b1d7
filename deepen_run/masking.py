"""Secrets as they may be shown: masked in every string that leaves the process (MLflow, files,
console lines, error messages). Standard library only, so the one-line error printer (errors.fail)
masks what it prints too; config/redact.py applies it to whole configs.

Masked: the value of a key that looks secret (password, token, api_key, ...), the password of a URL's
user:password@ part, and every occurrence of the value of a secret-looking environment variable
(MLFLOW_TRACKING_PASSWORD, HF_TOKEN, ...). A name looks secret by its words (split at _ . - and
case): hf_token, MLFLOW_TRACKING_PASSWORD, api_key do; pad_token_id, token_type_ids (an id is a
number, not a secret) and TOKENIZERS_PARALLELISM do not. docs/reliability.md, "Secrets".
"""
from __future__ import annotations

import functools
import os
import re

MASK = "***"
SECRET_WORDS = frozenset({"pass", "password", "passwd", "pwd", "secret", "token", "apikey", "credential",
                          "credentials", "auth", "authorization"})
NOT_SECRET_LAST = frozenset({"id", "ids", "type", "types"})  # pad_token_id: a number naming a token
SPECIAL_TOKENS = frozenset({"pad", "unk", "cls", "sep", "mask", "bos", "eos"})  # pad_token: a tokenizer's [PAD]
# user:password@ in a URL; the password runs to the last @ before the host (it may hold @, # or ?).
URL_PASSWORD = re.compile(r"(://[^/:@\s]+:)([^\s/]+)(@)")


@functools.lru_cache(maxsize=4096)  # a pure function of the name, asked of every variable at each masking
def looks_secret(name: str) -> bool:
    """Does this key or environment variable name look secret (by its words)?"""
    words = [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()) if w]
    if not words or words[-1] in NOT_SECRET_LAST or words[0] in SPECIAL_TOKENS:
        return False
    pairs = {" ".join(p) for p in zip(words, words[1:])}
    joined = any(w.endswith(("password", "passwd", "token", "secret")) for w in words)  # PGPASSWORD, HFTOKEN
    return bool(SECRET_WORDS & set(words)) or joined or "pat" in words or \
        bool(pairs & {"api key", "private key", "access key", "secret key", "storage key", "account key"})


def mask_uri(uri: str) -> str:
    """The URI as it may be shown: a user:password@ part's password as ***."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        u = urlsplit(str(uri))
    except ValueError:
        return mask_string(str(uri), [])
    if u.password is None:  # none, or one urlsplit cannot find (an unencoded # or ? in it)
        return mask_string(str(uri), [])
    host = u.netloc.rpartition("@")[2]
    return urlunsplit(u._replace(netloc=f"{u.username}:{MASK}@{host}"))


def secret_env_values() -> list[str]:
    # Longest first, so a secret that contains another is masked whole; short values would mask noise.
    # PWD is the shell's working directory, not a password: masked, every path under it would read ***.
    vals = {v for k, v in os.environ.items() if looks_secret(k) and k not in ("PWD", "OLDPWD") and len(v) >= 4}
    return sorted(vals, key=len, reverse=True)


def mask_string(s: str, secrets: list[str]) -> str:
    for v in secrets:
        s = s.replace(v, MASK)
    return URL_PASSWORD.sub(rf"\g<1>{MASK}\g<3>", s)


def mask_override(override: str) -> str:
    """A `key=value` override as MLflow and our files may show it: a secret key's value, a URL's
    password and a secret environment variable's value as ***."""
    key, eq, value = override.partition("=")
    if not eq:  # a plain word: a URL's password or a secret variable's value in it
        return mask_string(override, secret_env_values())
    return f"{key}{eq}{MASK if looks_secret(key) else mask_string(value, secret_env_values())}"
