"""The package's import graph: no cycles (function-level imports included), every module imports,
and bad input is rejected before torch loads.

A cycle that closes only through an import inside a function still works by luck of call order
and makes the modules impossible to read (or test) one at a time, so every `import` / `from`
statement anywhere in a file counts.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import HANG

import deepen_run

PKG = Path(deepen_run.__file__).resolve().parent
NAME = "deepen_run"


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def resolve(target: str, known: dict[str, Path]) -> str | None:
    """The package module an import names (a `from pkg import name` may name a module or an attribute)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def imports_of(mod: str, path: Path, known: dict[str, Path]) -> set[str]:
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):  # every statement, at any depth
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for n in names:
            if n == NAME or n.startswith(NAME + "."):
                target = resolve(n, known)
                # `from deepen_run.x import y` also runs deepen_run/__init__.py; it imports nothing.
                if target and target != mod and target != NAME:
                    out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports_of(m, p, known) for m, p in known.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """A cycle as a path [a, b, ..., a], or None (iterative DFS, three colours)."""
    state: dict[str, int] = {}
    for root in sorted(g):
        if state.get(root):
            continue
        stack = [(root, iter(sorted(g[root])))]
        path = [root]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(sorted(g.get(nxt, ())))))
                path.append(nxt)
    return None


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_graph_sees_function_level_imports():
    g = graph()
    assert f"{NAME}.run.runner" in g[f"{NAME}.cli.run"]  # cli imports runner only inside checked_run


def test_no_import_cycles():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(m.removeprefix(NAME + ".") for m in cycle)


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(PKG.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.mark.subprocess
def test_every_module_imports_in_a_fresh_interpreter():
    names = sorted(modules())
    code = "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
    r = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, env=env(), timeout=HANG)
    assert r.returncode == 0, r.stderr[-3000:]


# Runs the console script's entry point and reports whether torch got imported on the way out.
WRAPPER = textwrap.dedent("""
    import sys
    from deepen_run.cli.run import main
    try:
        main()
    finally:
        print("TORCH_LOADED=" + str("torch" in sys.modules), file=sys.stderr)
""")


@pytest.mark.subprocess
def test_rejected_override_exits_before_torch(tmp_path):
    r = subprocess.run([sys.executable, "-c", WRAPPER, "task=nosuch", f"hydra.run.dir={tmp_path}/run"],
                       capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=HANG)
    assert r.returncode == 2, r.stderr
    assert "deepen-run: error:" in r.stderr and "nosuch" in r.stderr
    assert "TORCH_LOADED=False" in r.stderr, r.stderr
