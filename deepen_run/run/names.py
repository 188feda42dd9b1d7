"""A run's default name and its standard tags: light (omegaconf and the method registry only).

The name carries what tells a run apart from its neighbours in MLflow's runs table, shortest first:

  <backbone>[-<family>][+dup<layers>[:<option>]...][+dwa]-<method>[(<non-default options>)]-<tasks>[-<schedule>]-s<seed>

  minilm+dup2.3-baseline-sst2-s42          backbone.duplicate_layers=[2,3]
  minilm+dup2.3:gated-baseline-sst2-s42    ... backbone.duplicate_init=gated (any duplicate_* off its default)
  tiny-deberta-v2-hire-rte-s42             backbone=tiny backbone.model_type=deberta-v2
  tiny-hire(gru_layers=1)-rte-s42          method.gru_layers=1 (the schema's default is 2)

The family is named only for a randomly initialised backbone (pretrained=false: `tiny` names a
size, not an architecture) whose model_type is not the schema's default (bert). A method option is
named when it differs from the method's dataclass default, except neutral keys (they cannot change
the result) and those a backbone key is linked to (method=duplicate's `layers`, already said by
+dup). A sweep's child omits its swept keys here: deepen_run/sweep/summary.py puts them first.
"""
from __future__ import annotations

import dataclasses
import enum
import re

from omegaconf import OmegaConf

from deepen_run.masking import mask_string, secret_env_values

SCORE_TAG = "score"  # the final eval/score rounded to 4 decimals, set when the run finishes
_LINK = re.compile(r"^\$\{(method\.[\w.]+)\}$")


def _value(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, enum.Enum):
        return str(v.value)
    if isinstance(v, (list, tuple)):
        return ".".join(_value(x) for x in v)
    return "null" if v is None else str(v)


def _linked(cfg) -> set[str]:
    """Method keys a backbone key interpolates (`duplicate_layers: ${method.layers}`)."""
    raw = OmegaConf.to_container(cfg.backbone)  # unresolved: an interpolation is its ${...} text
    return {m.group(1) for value in raw.values() if (m := _LINK.match(str(value)))}


def method_options(cfg, omit=()) -> dict[str, str]:
    """The method's options that differ from its dataclass's defaults: short key -> value."""
    from deepen_run.config.keys import neutral_keys
    from deepen_run.methods import schema_of, schemas

    try:
        schema = schema_of(str(cfg.method.name))
    except KeyError:
        return {}
    skip = set(omit) | neutral_keys(methods=schemas()) | _linked(cfg) | {"method.name"}
    out = {}
    for f in dataclasses.fields(schema):
        key = f"method.{f.name}"
        if key in skip or f.name not in cfg.method:
            continue
        value = OmegaConf.to_object(cfg.method[f.name]) if OmegaConf.is_config(cfg.method[f.name]) \
            else cfg.method[f.name]
        if _value(value) != _value(_default(f)):
            out[f.name] = _value(value)
    return out


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def _dup_options(b) -> str:
    """`:<value>` for each duplicate_* choice (how a copy enters, what of it trains) that is not its
    schema's default: `:gated`, `:copies`. Any such key the schema gains is named without a change here."""
    from deepen_run.config.schema import BackboneConfig

    defaults = {f.name: _default(f) for f in dataclasses.fields(BackboneConfig)}
    out = ""
    for key in b:
        if str(key).startswith("duplicate_") and key != "duplicate_layers" and key in defaults \
                and _value(b[key]) != _value(defaults[key]):
            out += f":{_value(b[key])}"
    return out


def backbone_part(cfg, omit=()) -> str:
    """The backbone and the steps on it: `minilm+dup2.3:gated`; a step that changes every layer's
    weights (backbone.dwa, where the schema has it) follows as `+dwa`."""
    b = cfg.backbone
    out = str(b.name)
    if not b.pretrained and "backbone.model_type" not in omit and b.model_type != "bert" \
            and str(b.model_type) not in out:
        out += f"-{b.model_type}"
    layers = list(b.duplicate_layers or [])
    if layers and not {"backbone.duplicate_layers", "method.layers"} & set(omit):
        out += "+dup" + _value(layers) + _dup_options(b)
    if b.get("dwa") and "backbone.dwa" not in omit:
        out += "+dwa"
    return out


def schedule_name(s) -> str:
    """schedule.name, with what an override changed from its preset (conf/schedule/<option>.yaml) said:
    `proportional(alpha=0.8)` draws otherwise than `proportional`, and the name and tag must say so."""
    from deepen_run.config.schema import ROOT

    f = ROOT / "conf" / "schedule" / f"{s.name}.yaml"
    if not f.is_file():
        return str(s.name)  # a schedule of the user's own, named by them
    preset = OmegaConf.load(f)
    used = {"power": ("kind", "alpha"), "annealed": ("kind", "alpha", "alpha_end")}.get(_value(s.kind), ("kind",))
    changed = [f"{k}={_value(s[k])}" for k in used if _value(s[k]) != _value(preset.get(k, s[k]))]
    return f"{s.name}({','.join(changed)})" if changed else str(s.name)


def run_name(cfg, omit=()) -> str:
    """tracking.run_name, else the default name above; `omit`: dotted keys not to say (a sweep's
    swept keys, said before the name)."""
    if cfg.tracking.run_name:  # a sweep child's name holds its overrides: a secret in one stays out
        return mask_string(cfg.tracking.run_name, secret_env_values())
    return default_name(cfg, omit)


def default_name(cfg, omit=()) -> str:
    tasks = "+".join(cfg.task.names)
    sched = f"-{schedule_name(cfg.schedule)}" if len(cfg.task.names) > 1 else ""
    seed = "" if "seed" in omit else f"-s{cfg.seed}"
    opts = method_options(cfg, omit)
    method = str(cfg.method.name) + (f"({','.join(f'{k}={v}' for k, v in opts.items())})" if opts else "")
    return f"{backbone_part(cfg, omit)}-{method}-{tasks}{sched}{seed}"


def model_name(cfg) -> str:
    """The run's LoggedModel name: its default run name without the seed (the seeds of one setting
    are versions of one model), never tracking.run_name: `minilm+dup2.3-baseline-sst2`, not the plain
    6-layer `minilm-baseline-sst2`."""
    return default_name(cfg, omit=("seed",))


def variant_tags(cfg) -> dict[str, str]:
    """What sets the run apart from its method's and backbone's defaults, one tag each (runs table
    columns, the LoggedModel's and the registered version's tags): duplicated layers and how they
    enter, DWA, the method's non-default options."""
    b, tags = cfg.backbone, {}
    if list(b.duplicate_layers or []):  # a column that tells a duplicated backbone apart
        tags["duplicate_layers"] = _value(list(b.duplicate_layers)) + _dup_options(b)
    if b.get("dwa"):
        tags["dwa"] = _value(b.dwa)
    opts = method_options(cfg)
    if opts:
        tags["variant"] = ",".join(f"{k}={v}" for k, v in opts.items())
    return tags


def model_tags(cfg) -> dict[str, str]:
    """A LoggedModel's (and its registered versions') tags: what it is, and what sets it apart."""
    return {"method": cfg.method.name, "backbone": cfg.backbone.name, "task": "+".join(cfg.task.names)} | \
        ({"schedule": schedule_name(cfg.schedule)} if len(cfg.task.names) > 1 else {}) | variant_tags(cfg)


def tags_for(cfg) -> dict[str, str]:
    return {"backbone": cfg.backbone.name, "method": cfg.method.name, "task": "+".join(cfg.task.names),
            "schedule": schedule_name(cfg.schedule), "seed": str(cfg.seed),
            "dry_run": str(bool(cfg.dry_run)).lower()} | variant_tags(cfg)
