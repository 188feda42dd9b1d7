"""Pre-flight: every check that needs no model, before any heavy import, MLflow run or download.

Bad input must cost seconds: numbers, task names, the GLUE files (every row parsed once, so a bad
row is reported as file:line), the backbone's whereabouts and the method's own config checks run
here, cheapest first; torch/transformers are imported only by the later checks that need them.
"""
from __future__ import annotations

import dataclasses
import difflib
import math

from deepen_run.data import tsv
from deepen_run.errors import UserError
from deepen_run.data.glue import TaskSpec, get_tasks
from deepen_run.run.places import tracking_store, writable_dirs

POSITIVE = ("learning_rate", "new_params_lr_scale", "batch_size", "eval_batch_size", "gradient_accumulation_steps",
            "log_every")
NON_NEGATIVE = ("save_every", "eval_every", "max_grad_norm", "weight_decay")
# transformers' SchedulerType values that get_scheduler builds from warmup and total steps alone and
# that step without a metric (the others need extra kwargs or a loss). A literal, because the cheap
# checks import no transformers (SchedulerType brings torch: 4 s); tests/test_bad_input.py derives
# the same set from transformers.SchedulerType and fails when the two differ.
SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
              "inverse_sqrt")
MIN_SEQ_LENGTH = 8  # [CLS] a [SEP] b [SEP] plus a few tokens; shorter leaves no text to classify
# Models that number positions from pad_token_id + 1, so they hold pad_token_id + 1 fewer tokens.
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "longformer")


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
    random_backbone(cfg.backbone)
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
    import re

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
    t = cfg.train
    for key in POSITIVE:
        if not 0 < getattr(t, key) < math.inf:  # `not > 0` also catches NaN
            raise UserError(f"train.{key}={getattr(t, key)} must be a positive finite number")
    for key in NON_NEGATIVE:
        if not 0 <= getattr(t, key) < math.inf:
            raise UserError(f"train.{key}={getattr(t, key)} must be a finite number >= 0")
    if t.save_total_limit < 1:
        raise UserError(f"train.save_total_limit={t.save_total_limit} must be >= 1 (checkpoints to keep); "
                        "use train.save_every=0 to save none")
    if not 0 < t.layer_decay <= 1:  # `not` also catches NaN; > 1 would train the embeddings fastest
        raise UserError(f"train.layer_decay={t.layer_decay} must be in (0, 1] (1.0 = no layer-wise decay; "
                        "ELECTRA and DeBERTa use 0.75-0.9)")
    if not 0 <= t.warmup_ratio <= 1:
        raise UserError(f"train.warmup_ratio={t.warmup_ratio} must be in [0, 1]")
    if t.lr_scheduler not in SCHEDULERS:
        raise UserError(f"train.lr_scheduler={t.lr_scheduler!r}; choose from {', '.join(SCHEDULERS)}")
    if t.model_selection == "best" and not (t.eval_every > 0 or t.eval_per_epoch):
        raise UserError("train.model_selection=best picks among the evaluations during training: set "
                        "train.eval_every=N or train.eval_per_epoch=true (with neither, best = final)")
    if t.model_selection == "best" and t.save_best is False:
        raise UserError("train.model_selection=best keeps the best weights to evaluate them at the end: drop "
                        "train.save_best=false")
    if t.early_stopping_patience is not None and (t.early_stopping_patience < 1 or
                                                  not (t.eval_every > 0 or t.eval_per_epoch)):
        raise UserError(f"train.early_stopping_patience={t.early_stopping_patience} counts evaluations during "
                        "training: give a number >= 1 and set train.eval_every=N or train.eval_per_epoch=true")
    if not 0 <= t.early_stopping_threshold < math.inf:
        raise UserError(f"train.early_stopping_threshold={t.early_stopping_threshold} must be a finite number >= 0")
    if not math.isfinite(t.num_epochs):
        raise UserError(f"train.num_epochs={t.num_epochs} must be a finite number (or set train.max_steps)")
    if t.max_steps < -1 or t.max_steps == 0:  # HF would train num_epochs epochs: a typo'd count, hours long
        raise UserError(f"train.max_steps={t.max_steps}: give a number of steps > 0, or -1 (the default) to "
                        "train train.num_epochs epochs")
    if t.max_steps <= 0 and not t.num_epochs > 0:
        raise UserError("set train.max_steps or train.num_epochs to a positive number")
    for key in ("steps_per_epoch", "steps_per_task"):
        if getattr(t, key) is not None and getattr(t, key) <= 0:
            raise UserError(f"train.{key}={getattr(t, key)} must be positive (or null)")
    for key in ("alpha", "alpha_end"):
        if not math.isfinite(cfg.schedule.get(key, 0.0)):
            raise UserError(f"schedule.{key}={cfg.schedule[key]} must be a finite number (the exponent on the "
                            "training-set sizes)")
    if not 0 <= cfg.seed < 2**32:  # numpy's seed range (accelerate's set_seed seeds numpy too)
        raise UserError(f"seed={cfg.seed} must be in [0, 2**32 - 1]")
    min_length(cfg.data)
    if cfg.data.num_workers < 0:
        raise UserError(f"data.num_workers={cfg.data.num_workers} must be >= 0 (0 = load in the main process)")
    f = cfg.data.train_fraction
    if f is not None and not 0 < f <= 1:  # `not` also catches NaN
        raise UserError(f"data.train_fraction={f} must be in (0, 1] (or null for the whole training set)")
    for key in ("max_train_samples", "max_eval_samples"):
        if getattr(cfg.data, key) is not None and getattr(cfg.data, key) <= 0:
            raise UserError(f"data.{key}={getattr(cfg.data, key)} must be positive (or null for all)")


def random_backbone(b) -> None:
    """A randomly initialised backbone's shape (pretrained=false), which transformers would refuse
    only when it builds the model, with a traceback and a FAILED run."""
    if b.pretrained:
        return
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings"):
        if getattr(b, key) < 1:
            raise UserError(f"backbone.{key}={getattr(b, key)} must be a positive integer")
    if b.type_vocab_size < 0:  # 0: no segment embeddings (DeBERTa-v3's)
        raise UserError(f"backbone.type_vocab_size={b.type_vocab_size} must be >= 0")
    if b.hidden_size % b.num_attention_heads:
        raise UserError(f"backbone.hidden_size={b.hidden_size} must be a multiple of backbone.num_attention_heads="
                        f"{b.num_attention_heads} (each head takes hidden_size / heads of it)")
    if not 0 <= b.pad_token_id < b.vocab_size:
        raise UserError(f"backbone.pad_token_id={b.pad_token_id} must be a token id, in [0, backbone.vocab_size)")


def min_length(data) -> None:
    if data.max_seq_length < MIN_SEQ_LENGTH:
        raise UserError(f"data.max_seq_length={data.max_seq_length} must be at least {MIN_SEQ_LENGTH} "
                        "(tokens per example, special tokens included)")


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
