"""`--help` pages: every key of the structured schema is listed with its default and a meaning.

A field added to a config dataclass without a `key: meaning` line in its class docstring fails
here (test_every_schema_field_has_a_meaning), so the help cannot fall behind the schema."""
import dataclasses
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from conftest import HANG

from deepen_run.config.schema import Config
from deepen_run.methods import METHODS
from deepen_run.cli.probe import ProbeConfig
from deepen_run.cli.usage import key_help


def leaf_keys(cls, prefix: str = "") -> list[str]:
    """Every scalar key of a schema, walked from the dataclasses themselves (not from cli/usage.py)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            out += leaf_keys(t, f"{prefix}{f.name}.")
        elif f.name == "method" and t is typing.Any:
            continue  # filled by the method group: its keys come from each method's Config
        else:
            out.append(prefix + f.name)
    return out


def schema_classes(cls) -> list[type]:
    hints = typing.get_type_hints(cls)
    return [cls] + [c for f in dataclasses.fields(cls) if dataclasses.is_dataclass(t := hints[f.name])
                    for c in schema_classes(t)]


ALL = sorted({c for root in (Config, ProbeConfig) for c in schema_classes(root)} |
             {m.Config for m in METHODS.values()}, key=lambda c: c.__module__ + c.__qualname__)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_schema_field_has_a_meaning(cls):
    meanings = key_help(cls)  # raises naming the field without a `key: meaning` docstring line
    assert all(len(m) > 5 for m in meanings.values())


def test_an_undocumented_field_fails():
    @dataclasses.dataclass
    class Demo:
        """demo.*

        documented: a key with a meaning
        """
        documented: int = 1
        added_later: float = 0.5

    with pytest.raises(AssertionError, match="added_later"):
        key_help(Demo)


def help_of(prog: str) -> str:
    exe = Path(sys.executable).with_name(prog)
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def listed(text: str) -> dict[str, str]:
    """key -> (default, meaning) text as printed: `    key=default   meaning` (long ones wrap)."""
    lines = text.splitlines()
    out = {}
    for i, ln in enumerate(lines):
        m = re.match(r"^    ([\w.]+)=(\S*)\s*(.*)$", ln)
        if m:
            out.setdefault(m[1], []).append(m[3] or lines[i + 1].strip())
    return out


def test_deepen_run_help_lists_every_key_groups_and_examples():
    text = help_of("deepen-run")
    keys = listed(text)
    for key in leaf_keys(Config):
        assert key in keys and all(keys[key]), key
    for name, module in METHODS.items():
        assert f"[method={name}]" in text
        for f in dataclasses.fields(module.Config):
            assert f"method.{f.name}" in keys, (name, f.name)
    assert "train.save_best=null" in text and "dry_run=false" in text
    groups = text.split("Config groups")[1].split("Keys")[0]
    for folder in ("backbone", "method", "task", "schedule", "hparams_search", "+experiment"):
        assert re.search(rf"^  {re.escape(folder)}\s", groups, re.M), folder
    assert "schema" not in groups and "baseline*" in groups and "minilm*" in groups
    assert "powered by Hydra" not in text and "Examples:" in text and "deepen-run -m" in text


def test_deepen_probe_help_lists_its_keys():
    text = help_of("deepen-probe")
    keys = listed(text)
    for key in leaf_keys(ProbeConfig):
        assert key in keys and all(keys[key]), key
    assert "[method=" not in text and "[train]" not in text


def test_deepen_report_help_has_examples():
    text = help_of("deepen-report")
    assert "--sweep-id" in text and "Examples:" in text
