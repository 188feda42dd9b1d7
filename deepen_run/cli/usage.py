"""`--help` for deepen-run and deepen-probe, generated from the structured schema so it cannot drift.

Keys and defaults come from the dataclasses (deepen_run/config/schema.py, each method's Config); the
one-line meaning of a key comes from its class docstring, one `key: meaning` line per field.
`key_help` raises for a field without such a line (tests/test_usage.py runs it on every class), so
a new key cannot be added without saying what it means. Config groups are the folders of conf/.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path
from typing import Any, Iterator, Sequence

from omegaconf import MISSING, OmegaConf

LINE = re.compile(r"^(\w+): (.+)$")


def key_help(cls) -> dict[str, str]:
    """{field: meaning} from the class docstring; every field must have one, and only fields."""
    doc = {m[1]: m[2].strip() for ln in (inspect.getdoc(cls) or "").splitlines() if (m := LINE.match(ln.strip()))}
    names = [f.name for f in dataclasses.fields(cls) if not is_section(cls, f)]
    missing = [n for n in names if n not in doc]
    stale = [n for n in doc if n not in {f.name for f in dataclasses.fields(cls)}]
    if missing or stale:
        raise AssertionError(f"{cls.__module__}.{cls.__qualname__} docstring: add a 'key: meaning' line for "
                             f"{missing} / remove {stale}")
    return {n: doc[n] for n in names}


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return f.default


def show(value: Any) -> str:
    if value is MISSING or value == MISSING:
        return "(group)"
    if isinstance(value, str):
        return value.replace("${root:}", "<checkout>")
    return OmegaConf.to_yaml({"v": value}).strip()[3:].replace("\n", " ")


def sections(cls, prefix: str = "") -> Iterator[tuple[str, str, list[tuple[str, str, str]]]]:
    """(section name, its docstring's first line, [(key, default, meaning)]) for cls and each
    dataclass-typed field of it, depth first; top-level scalar keys come first."""
    meanings = key_help(cls)
    rows = [(prefix + n, show(_default(f)), meanings[n]) for f in dataclasses.fields(cls)
            if (n := f.name) in meanings]
    yield prefix.rstrip(".") or "top level", (inspect.getdoc(cls) or "").splitlines()[0], rows
    for f in dataclasses.fields(cls):
        sub = _sub(cls, f)
        if sub is not None:
            yield from sections(sub, prefix + f.name + ".")


def is_section(cls, f: dataclasses.Field) -> bool:
    """A nested config (backbone, train, ...) or a node a group fills whole (method: Any = MISSING)."""
    any_node = typing.get_type_hints(cls).get(f.name) is Any and f.default is MISSING
    return any_node or _sub(cls, f) is not None


def _sub(cls, f: dataclasses.Field):
    d = _default(f)
    if dataclasses.is_dataclass(d):
        return type(d)
    t = typing.get_type_hints(cls).get(f.name)  # inherited fields too (deepen-probe's Inputs)
    return t if isinstance(t, type) and dataclasses.is_dataclass(t) else None


def groups(conf: Path, primary: str) -> list[tuple[str, list[str], str | None]]:
    """(group, options, default option) for each folder of conf/; the defaults list of the primary
    config says which are chosen by default. Folders the primary config does not name (experiment)
    are added with +group=option."""
    chosen: dict[str, Any] = {}
    for item in OmegaConf.to_container(OmegaConf.load(conf / f"{primary}.yaml")).get("defaults", []):
        if isinstance(item, dict):
            chosen.update(item)
    out = []
    for d in sorted(p for p in conf.iterdir() if p.is_dir()):
        if primary != "config" and d.name not in chosen:
            continue  # another app's groups (deepen-probe only composes the groups it names)
        name = d.name if d.name in chosen else "+" + d.name
        out.append((name, sorted(p.stem for p in d.glob("*.yaml")), chosen.get(d.name)))
    return out


def render(prog: str, what: str, schema, conf: Path, primary: str, examples: Sequence[str],
           extra_sections: list[tuple[str, str, list]] = ()) -> str:
    lines = [f"{prog}: {what}", "", f"Usage: {prog} [group=option ...] [key=value ...]",
             f"       {prog} -m key=a,b ...   (a sweep: one run per value, in parallel with hydra/launcher=joblib)",
             "", "Config groups (default marked *):"]
    for name, options, default in groups(conf, primary):
        opts = ", ".join(o + ("*" if o == default else "") for o in options)
        lines.append(f"  {name:<16}{opts}")
    lines += ["", "Keys (key=default: meaning; a group option may set its own default):"]
    # The primary config's own values win over the schema's (deepen-probe: tracking.experiment=deepen-probe).
    own = OmegaConf.load(conf / f"{primary}.yaml")
    own = {k: v for k, v in OmegaConf.to_container(own).items() if k not in ("defaults", "hydra")}
    for title, doc, rows in [*sections(schema), *extra_sections]:
        if not rows:
            continue
        lines.append(f"  [{title}] {doc}")
        for key, default, meaning in rows:
            value = OmegaConf.select(OmegaConf.create(own), key, default=None)
            default = show(value) if value is not None and not isinstance(value, (dict, list)) else default
            left = f"{key}={default}"
            lines.append(f"    {left:<40} {meaning}" if len(left) <= 40 else f"    {left}\n    {'':<40} {meaning}")
    lines += ["", "Examples:", *(f"  {e}" for e in examples), "",
              "Hydra's own flags still work: --cfg job (print the composed config), --info, --hydra-help.", ""]
    return "\n".join(lines)


def method_sections() -> list[tuple[str, str, list]]:
    from deepen_run.methods import NAMES, schema_of  # the light config modules: no torch for --help

    out = []
    for name in NAMES:
        title, doc, rows = next(sections(schema_of(name), "method."))
        out.append((f"method={name}", doc.split(": ", 1)[-1], rows))
    return out


RUN_EXAMPLES = (
    "deepen-run task=sst2 backbone=minilm data.max_train_samples=2000 train.max_steps=60   # ~3 min on a laptop CPU",
    "deepen-run method=hire task=rte backbone=minilm train.max_steps=100 method.gru_layers=1",
    "deepen-run method=pals task.names=[mrpc,stsb,rte] schedule=annealed backbone=minilm train.max_steps=200",
    "deepen-run method=hire backbone.duplicate_layers=[2,3] task=sst2 backbone=minilm train.max_steps=100",
    "deepen-run -m hydra/launcher=joblib seed=1,2,3 task=rte backbone=minilm train.max_steps=100",
    "deepen-run -m +arm=baseline,hire_g1,hire_g2 seed=1,2 task=rte backbone=minilm train.max_steps=100  # + baseline",
    "deepen-run dry_run=true method=pals task=glue    # sizes and config only, no training",
    "deepen-run task=sst2 ... (killed) ; deepen-run task=sst2 ... resume=auto   # continue where it stopped",
    "deepen-run task=sst2 --cfg job   # print the composed config and exit",
)


def run_help() -> str:
    from deepen_run.config.schema import ROOT, Config

    return render("deepen-run", "fine-tune a BERT-style encoder on GLUE tasks (baseline, HIRE, PALs or layer "
                  "duplication); every run is recorded in MLflow (make ui).", Config, ROOT / "conf", "config",
                  RUN_EXAMPLES, method_sections())


def probe_help(ProbeConfig) -> str:
    """ProbeConfig: the probe's schema (passed in by cli/probe.py, which imports this module)."""
    from deepen_run.config.schema import ROOT

    return render("deepen-probe", "which layers of a pretrained encoder are redundant (safe to duplicate)? "
                  "Removes and duplicates each layer in turn, measures the change on dev inputs, records an MLflow "
                  "run (experiment deepen-probe) and suggests backbone.duplicate_layers.", ProbeConfig, ROOT / "conf", "probe",
                  ["deepen-probe backbone=minilm task=sst2 probe.samples=64",
                   "deepen-probe backbone=bert_base task.names=[rte,mrpc] probe.suggest=3"])


def wants_help(argv: list[str]) -> bool:
    return any(a in ("--help", "-h") for a in argv[1:])
