"""Pre-flight: every check that needs no model, before any heavy import, MLflow run or download.

Bad input must cost seconds: numbers, task names, the GLUE files (every row parsed once, so a bad
row is reported as file:line), the backbone's whereabouts and the method's own config checks run
here, cheapest first; torch/transformers are imported only by the later checks that need them. The
places a run writes are checked too: MLflow would find an unusable or read-only store only at its
first write, and a run an unwritable folder only at its first checkpoint.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
import tempfile
from pathlib import Path

from deepen_run.data import tsv
from deepen_run.errors import UserError
from deepen_run.data.glue import TaskSpec, get_tasks
from deepen_run.util import sqlite_path

# Models that number positions from pad_token_id + 1, so they hold pad_token_id + 1 fewer tokens.
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "longformer")
# MLflow's tracking stores: a database (SQLAlchemy's dialects, with or without +driver) or a server.
# Not a plain path or file: URI: MLflow 3 keeps its folder store in maintenance mode and refuses it.
STORE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")


def check(cfg) -> list[TaskSpec]:
    """Raises UserError naming the culprit; returns the TaskSpecs of cfg.task.names."""
    tasks = cheap(cfg)
    from deepen_run.model import backbone as bb  # transformers: only once the cheap checks passed

    bb.preflight(cfg.backbone)
    seq_length(cfg)
    method_checks(cfg, tasks)  # first: a method's own spelling of a step's key names itself
    from deepen_run.model import steps as backbone_steps

    backbone_steps.check(cfg)  # e.g. backbone.duplicate_layers against the depth in the config file
    return tasks


def cheap(cfg) -> list[TaskSpec]:
    """The checks that need neither transformers nor mlflow (nor a model): keys, names, numbers,
    the tracking store's permissions, every GLUE row."""
    schema_keys(cfg)
    tasks = get_tasks(list(cfg.task.names))
    numbers(cfg)
    tracking_store(cfg.tracking)
    writable_dirs(cfg)
    if not cfg.dry_run:
        tsv.check_glue_dir(cfg.data.glue_dir, tasks, need_test=cfg.predict)
        tsv.validate(cfg.data.glue_dir, tasks, test=cfg.predict)
    return tasks


def schema_keys(cfg) -> None:
    """Hydra's `+key=value` opens the struct flag and adds the key even to a structured node, so
    `+train.lr=1e-4` would be accepted and ignored: every key must be a field of its node's dataclass."""
    from omegaconf import DictConfig, OmegaConf

    def walk(node, prefix: str) -> None:
        kind = OmegaConf.get_type(node)
        known = [f.name for f in dataclasses.fields(kind)] if dataclasses.is_dataclass(kind) else None
        for key in node.keys():
            if known is not None and key not in known:
                raise unknown_key(prefix, str(key), known)
            if OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key):
                continue  # not a node of its own here (reading it would resolve or raise)
            child = node[key]  # a None node reads as None
            if isinstance(child, DictConfig):
                walk(child, f"{prefix}{key}.")

    walk(cfg, "")


def unknown_key(prefix: str, key: str, known: list[str]) -> UserError:
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    hint = f" (did you mean {prefix}{near[0]}?)" if near else ""
    return UserError(f"unknown config key {prefix}{key}{hint}: {prefix.rstrip('.') or 'the config'} "
                     f"has only {', '.join(known)}; a leading + does not add keys to the schema")


def typo(message: str, overrides: list[str], methods_swept: bool = False, app: str = "config") -> UserError | None:
    """Hydra's error for a key given without + that the schema lacks ("Could not override
    'method.gru_layer'. To append to your config use +method.gru_layer=1", which points the wrong
    way) as the same unknown-key error, with its nearest key, that the + spelling gets. The key's
    node comes from the config composed with the command's group choices alone (first value of a
    swept one) of `app` (conf/<app>.yaml: config, or probe for deepen-probe); None when the message
    is another error or the node is not found."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from deepen_run.config.schema import ROOT

    m = re.search(r"Could not override '([^']+)'", message)
    if not m:
        return None
    path, _, key = m[1].rpartition(".")
    groups = [f"{k}={v.split(',')[0]}" for k, _, v in (o.partition("=") for o in overrides)
              if (ROOT / "conf" / k.lstrip("+~")).is_dir()]
    try:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
            cfg = compose(config_name=app, overrides=groups)
        parts, absent = path.split(".") if path else [], object()
        for i in range(len(parts)):  # `trian.max_steps`: the first missing node is the typo
            if OmegaConf.select(cfg, ".".join(parts[:i + 1]), default=absent) is absent:
                path, key = ".".join(parts[:i]), parts[i]
                break
        kind = OmegaConf.get_type(OmegaConf.select(cfg, path) if path else cfg)
    except Exception:  # noqa: BLE001 (no better message than Hydra's, then)
        return None
    if not dataclasses.is_dataclass(kind):
        return None
    err = unknown_key(f"{path}." if path else "", key, [f.name for f in dataclasses.fields(kind)])
    methods_swept = methods_swept or any(o.lstrip("+~").startswith("method=") and "," in o for o in overrides)
    if path == "method" and methods_swept:
        # `method=baseline,hire method.gru_layers=1,2`: the baseline has no gru_layers
        err = UserError(f"{err}; to sweep methods with their own options, sweep presets: "
                        "+arm=baseline,hire_g1,hire_g2 (conf/arm/)")
    return err


def numbers(cfg) -> None:
    """Each section's own checks (config/checks.py: its dataclass's __post_init__ runs them as it is
    built from the composed values), and the seed."""
    from omegaconf import OmegaConf

    for section in ("train", "schedule"):
        OmegaConf.to_object(cfg[section])
    if not 0 <= cfg.seed < 2**32:  # numpy's seed range (accelerate's set_seed seeds numpy too)
        raise UserError(f"seed={cfg.seed} must be in [0, 2**32 - 1]")
    for section in ("data", "backbone"):
        OmegaConf.to_object(cfg[section])


def seq_length(cfg) -> None:
    """data.max_seq_length within the backbone's position table, read from its config (no weights)."""
    b = cfg.backbone
    if b.pretrained:
        from transformers import AutoConfig

        from deepen_run.model.backbone import resolve

        kw = dict(revision=b.revision, trust_remote_code=b.trust_remote_code)
        try:  # the backbone preflight found it: local folder or cache, no network needed
            conf = AutoConfig.from_pretrained(resolve(b.path), local_files_only=True, **kw)
        except (OSError, ValueError):
            conf = AutoConfig.from_pretrained(resolve(b.path), **kw)
    else:
        from deepen_run.model.backbone import architecture

        conf = architecture(b)  # the family's random model (model/families.py), not yet built
    positions, kind, pad = (getattr(conf, "max_position_embeddings", None), conf.model_type,
                            getattr(conf, "pad_token_id", None) or 0)
    if positions is None:
        return  # relative positions: no table to overflow
    limit = positions - (pad + 1 if kind in OFFSET_POSITIONS else 0)
    if cfg.data.max_seq_length > limit:
        raise UserError(f"data.max_seq_length={cfg.data.max_seq_length} exceeds backbone {b.name}'s "
                        f"{limit} positions; use at most {limit}")


def method_checks(cfg, tasks) -> None:
    """A method may define check(cfg) for its own options; it gets the whole config because they
    may depend on the backbone (layer indices against its depth, read from its config file)."""
    from deepen_run.methods import NAMES, config_of, hook

    if cfg.method.name not in NAMES:
        raise UserError(f"unknown method {cfg.method.name!r}; choose from {', '.join(NAMES)}")
    hook(config_of(cfg.method.name), "check")(cfg)


def tracking_store(t) -> None:
    """A local store's permissions, before the run: MLflow would find a read-only database only at
    its first write, after the model loaded, with tracebacks. os.access is what the process may do
    (for root, write access to anything not on a read-only mount)."""
    if not str(t.experiment or "").strip():
        raise UserError("tracking.experiment is empty; name the MLflow experiment (default: deepen-run)")
    scheme, sep, _ = str(t.uri).partition("://")
    if not sep or scheme.split("+")[0] not in STORE_SCHEMES:
        raise UserError(f"tracking.uri={t.uri} is not an MLflow tracking store deepen-run can use: give "
                        "sqlite:///<absolute path of a .db file>, a database URI or http(s)://<server>")
    db = sqlite_path(t.uri)
    if db is None:
        return  # a server: Tracker.check reaches it before the run
    if db.is_dir():
        raise UserError(f"tracking.uri={t.uri}: {db} is a folder, not a database file")
    if db.exists() and not os.access(db, os.R_OK | os.W_OK):
        raise UserError(f"tracking.uri={t.uri}: the database {db} is read-only; chmod u+rw it or use another store")
    why = writable(db.parent)  # SQLite writes its journal next to the database, MLflow its lock file and mlartifacts/
    if why:
        raise UserError(f"tracking.uri={t.uri}: {why}; use another store")
    for extra in (Path(f"{db}.lock"), db.parent / "mlartifacts"):
        if extra.exists() and not os.access(extra, os.W_OK):
            raise UserError(f"tracking.uri={t.uri}: {extra} is read-only; chmod u+rw it or use another store")


def writable(folder: Path) -> str | None:
    """Why `folder` (made on first use, so its nearest existing ancestor is what counts) cannot take
    our files, or None. os.access says what the permission bits allow; root passes it everywhere,
    so a real probe file is written too (a read-only mount, a full or flaky disk refuse it)."""
    here = folder
    while not here.exists() and not here.is_symlink() and here != here.parent:
        here = here.parent
    if here.is_symlink() and not here.exists():
        return f"{here} is a broken link"
    if not here.is_dir():
        return f"{here} is a file, not a folder"
    if not os.access(here, os.W_OK | os.X_OK):
        return f"the folder {here} is not writable (chmod u+rwx it)"
    try:
        fd, probe = tempfile.mkstemp(prefix=".deepen-probe-", dir=here)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f"cannot write in {here} ({e.strerror or e})"
    return None


def writable_dirs(cfg) -> None:
    """data.cache_dir and the run dir, before any weights load: a run would find them unwritable only
    after tokenizing or at its first checkpoint, with a PermissionError traceback and a FAILED run."""
    from hydra.core.hydra_config import HydraConfig

    where = [("data.cache_dir", cfg.data.cache_dir)] if cfg.data.cache_dir else []
    if HydraConfig.initialized():  # the run dir Hydra made (a sweep's launcher: its own, checked alike)
        where.append(("hydra.run.dir", HydraConfig.get().runtime.output_dir))
    for key, folder in where:
        why = writable(Path(str(folder)).expanduser())
        if why:
            raise UserError(f"{key}={folder}: {why}; pass another {key}")
