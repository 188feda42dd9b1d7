"""Dotted keys of the schema by kind: those marked neutral() (cannot change a run's result) and the
bool ones. Read by the report's grouping, the run's name and the command line's checks."""
from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from types import MappingProxyType

from deepen_run.config.schema import Config


def neutral_keys(schema: type = None, prefix: str = "", methods: Mapping[str, type] = MappingProxyType({})
                 ) -> frozenset[str]:
    """Dotted keys marked neutral() in `schema` (default: Config) and its nested dataclasses; for
    Config, method.* from each method schema in `methods` too (name -> dataclass, methods.schemas():
    e.g. method.report_examples)."""
    schema = schema or Config
    hints = typing.get_type_hints(schema)
    out = {prefix + f.name for f in dataclasses.fields(schema) if f.metadata.get("neutral")}
    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(hints.get(f.name)):
            out |= neutral_keys(hints[f.name], f"{prefix}{f.name}.")
    if schema is Config:
        for method in methods.values():
            out |= neutral_keys(method, "method.")
    return frozenset(out)


def bool_keys(methods: Mapping[str, type] = MappingProxyType({}), schema: type = None, prefix: str = ""
              ) -> frozenset[str]:
    """Dotted keys of the bool fields of `schema` (default: Config) and its nested dataclasses, and
    method.* of each method schema in `methods`: OmegaConf reads any integer there as true or false."""
    schema = schema or Config
    hints = typing.get_type_hints(schema)
    out = {prefix + name for name, kind in hints.items()  # bool, or Optional[bool] (train.save_best)
           if kind is bool or set(typing.get_args(kind)) == {bool, type(None)}}
    for name, kind in hints.items():
        if dataclasses.is_dataclass(kind):
            out |= bool_keys(schema=kind, prefix=f"{prefix}{name}.")
    for method in methods.values():
        out |= bool_keys(schema=method, prefix="method.")
    return frozenset(out)
