"""Generic code never asks which method runs: no module outside deepen_run/methods/ holds a method's
name (or a preset's) as a string; what the report needs (the reference method) comes from the registry."""
import ast
from pathlib import Path

from deepen_run.methods import NAMES

PACKAGE = Path(__file__).resolve().parent.parent / "deepen_run"
# Data, not a method: QQP's label names are not_duplicate / duplicate.
ALLOWED = {("deepen_run/data/glue.py", "duplicate")}


def test_no_method_name_in_generic_code():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE.parent))
        if where.startswith("deepen_run/methods/"):
            continue
        tree = ast.parse(path.read_text(), where)
        # A record's field read as row["baseline"] (the report's baseline row) is a field name, not a method.
        keys = {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in NAMES and id(node) not in keys \
                    and (where, node.value) not in ALLOWED:
                found.append(f"{where}:{node.lineno} {node.value!r}")
    assert not found, "method names in generic code (ask the registry or the contract instead):\n" + "\n".join(found)
