"""Keep secrets out of MLflow: the logged params and config.yaml are the resolved config, and a
resolved ${oc.env:...} may hold a password or token; local folders are recorded resolved. What
counts as a secret, and how one is masked in a string, is deepen_run/masking.py's; this module
applies it to whole configs and to log records.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from omegaconf import OmegaConf

from deepen_run.masking import MASK, looks_secret, mask_override, mask_string, secret_env_values


def mask_logs() -> None:
    """From now on, the log records of Hydra and its launcher plugins in this process have their
    secrets masked (mask_override on each word): the launching process of a sweep, where Hydra logs
    each job's overrides (`#0 : seed=1 tracking.uri=http://alice:***@host`) through handlers it sets
    up anew, so a filter on a handler would not stay. Other loggers' records are left as they are."""
    make = logging.getLogRecordFactory()
    if getattr(make, "masks_secrets", False):
        return

    def masked_record(*args, **kwargs) -> logging.LogRecord:
        record = make(*args, **kwargs)
        if not record.name.startswith(("hydra", "hydra_plugins")):
            return record
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 (a format that does not fit its args: logging reports it, as ever)
            return record
        shown = " ".join(mask_override(w) for w in text.split(" "))
        if shown != text:
            record.msg, record.args = shown, ()
        return record

    masked_record.masks_secrets = True
    logging.setLogRecordFactory(masked_record)


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
    for section, key in LOCAL_PATHS:
        node = resolved.get(section) or {}
        if isinstance(node.get(key), str):
            node[key] = resolved_path(node[key])
    return scrub(resolved, secret_env_values())


# Folders recorded as one absolute spelling: `$PWD/../shared/glue` and the Makefile's resolved path
# are one folder, and were two settings in MLflow and in deepen-report's rows.
LOCAL_PATHS = (("data", "glue_dir"), ("backbone", "path"))


def resolved_path(value: str) -> str:
    """A local file or folder's absolute path, links and `..` resolved; anything else (a Hub id, a
    pkg:// or URL, a path that does not exist) as given."""
    if "://" in value or not value.strip() or not os.path.exists(os.path.expanduser(value)):
        return value
    return os.path.realpath(os.path.expanduser(value))
