"""The layering: every import statement of every module (function-level ones included) stays within
what its layer's `May import:` line allows. That line, in each subpackage's __init__ docstring
(deepen_run/__init__.py for the base modules), is the one place the rule is written; this test reads
it, so changing the architecture means changing that line, in review, not a list kept here.

Units: `base` (deepen_run's top-level modules), one per subpackage, and `method models` (a
method's modules other than config.py, which sit above model/ while the registry and the method
configs sit in the config layer). A unit may always import itself. Imports by name at run time
(importlib, Hydra's _target_) are not statements and are not checked: the methods registry reaches
the method models that way on purpose.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import deepen_run

PKG = Path(deepen_run.__file__).resolve().parent
NAME = "deepen_run"
MODELS = "method models"
RULE = re.compile(r"^(?:(?P<who>[A-Za-z ]+?) may|May) import: (?P<units>.+)$", re.M)
INSIDE = re.compile(r"^A config module's check\(cfg\) may import inside the function: (?P<units>[a-z, ]+)", re.M)


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def unit(mod: str) -> str:
    parts = mod.split(".")[1:]
    if not parts or (len(parts) == 1 and not (PKG / parts[0]).is_dir()):
        return "base"
    if parts[0] == "methods" and len(parts) >= 3 and parts[2] != "config":
        return MODELS
    return parts[0]


def units(text: str) -> set[str]:
    return {u.strip() for u in text.split(",") if u.strip()}


def rules() -> tuple[dict[str, set[str]], set[str]]:
    """unit -> the units it may import (from the docstrings); the units a method's check(cfg) may
    also import inside the function."""
    out, inside = {}, set()
    inits = [PKG / "__init__.py"] + sorted(p / "__init__.py" for p in PKG.iterdir() if (p / "__init__.py").is_file())
    for init in inits:
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        own = "base" if init.parent == PKG else init.parent.name
        found = RULE.findall(doc)
        assert found, f"{init.relative_to(PKG.parent)}: its docstring has no `May import:` line"
        for who, allowed in found:
            out[MODELS if who.lower() == MODELS else own] = units(allowed)
        if m := INSIDE.search(doc):
            inside = units(m["units"])
    return out, inside


def resolve(target: str, known: dict[str, Path]) -> str | None:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


class Imports(ast.NodeVisitor):
    """(line, module imported, inside a function?) for every import statement of ours."""

    def __init__(self, mod: str, path: Path, known: dict[str, Path]):
        self.package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        self.known, self.depth, self.found = known, 0, []

    def visit_FunctionDef(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node):
        self._add(node, [a.name for a in node.names])

    def visit_ImportFrom(self, node):
        base = node.module or ""
        if node.level:
            anchor = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        # `from pkg import name`: name is a module when there is one, else an attribute of pkg
        self._add(node, [f"{base}.{a.name}" if f"{base}.{a.name}" in self.known else base for a in node.names])

    def _add(self, node, names):
        for n in names:
            if n.split(".")[0] == NAME and (target := resolve(n, self.known)) and target != NAME:
                self.found.append((node.lineno, target, self.depth > 0))


def violations(extra: dict[str, str] | None = None) -> list[str]:
    """extra: module name -> source, checked as if it were in the package (the test of the checker)."""
    known = modules()
    sources = {m: p.read_text() for m, p in known.items()}
    for mod, text in (extra or {}).items():
        known[mod] = PKG.parent.joinpath(*mod.split(".")).with_suffix(".py")
        sources[mod] = text
    allowed, inside = rules()
    out = []
    for mod, path in known.items():
        me = unit(mod)
        visitor = Imports(mod, path, known)
        visitor.visit(ast.parse(sources[mod], str(path)))
        for line, target, in_function in visitor.found:
            them = unit(target)
            ok = them == me or them in allowed[me] or (
                in_function and me == "methods" and path.name == "config.py" and them in inside)
            if not ok:
                out.append(f"{path.relative_to(PKG.parent)}:{line} ({me}) imports {target} ({them})")
    return out


def test_every_import_respects_the_layers():
    assert violations() == []


def test_every_unit_has_a_rule_naming_only_units():
    allowed, inside = rules()
    known = {unit(m) for m in modules()}
    assert set(allowed) == known
    for who, them in allowed.items():
        assert them <= known, f"{who}: May import names {sorted(them - known)}, not a unit"
    assert inside <= known


def test_the_layers_form_an_order():
    """No two units may import each other (config/ imports nothing of methods/: the entry points hand
    it the methods' schemas), and the rules are acyclic (so they are a layering)."""
    allowed, _ = rules()
    mutual = {frozenset((a, b)) for a, them in allowed.items() for b in them if a != b and a in allowed.get(b, ())}
    assert mutual == set()
    graph = {a: {b for b in them if b != a and frozenset((a, b)) not in mutual} for a, them in allowed.items()}
    seen: dict[str, int] = {}

    def visit(n, path):
        if seen.get(n) == 1:
            pytest.fail(f"the layer rules have a cycle: {' -> '.join(path + [n])}")
        if seen.get(n) == 2:
            return
        seen[n] = 1
        for m in graph[n]:
            visit(m, path + [n])
        seen[n] = 2

    for n in graph:
        visit(n, [])


def test_the_checker_sees_a_violation():
    """The rule bites: an upward import, even inside a function, is reported; an allowed one is not."""
    found = violations({"deepen_run.data.upward": "from deepen_run.errors import UserError\n\n"
                                                  "def f():\n    from deepen_run.run import runner\n"})
    assert found == ["deepen_run/data/upward.py:4 (data) imports deepen_run.run.runner (run)"]
