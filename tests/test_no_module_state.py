"""No hidden state: nothing in deepen_run/ keeps mutable objects at module level or rebinds a module
global, so what a function reads is what it was given (state lives in objects passed along).
Constant tables are immutable (tuple, frozenset, MappingProxyType, a frozen dataclass)."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "deepen_run"
# Calls that build a mutable container (a module-level one is state the next caller sees).
MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque", "bytearray"}
MUTABLE_NODES = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)


def _stateful_classes(tree) -> set[str]:
    """The module's own classes whose instances can hold state: all but frozen dataclasses and
    classes with `__slots__ = ()`."""
    out = set()
    for c in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        frozen = any(isinstance(d, ast.Call) and any(k.arg == "frozen" and getattr(k.value, "value", False)
                                                     for k in d.keywords) for d in c.decorator_list)
        slotless = any(isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["__slots__"]
                       and isinstance(n.value, ast.Tuple) and not n.value.elts for n in c.body)
        if not (frozen or slotless):
            out.add(c.name)
    return out


def _mutable(value, classes: set[str]) -> bool:
    if isinstance(value, MUTABLE_NODES):
        return True
    if isinstance(value, ast.Call):
        f = value.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        return name in MUTABLE_CALLS or (isinstance(f, ast.Name) and name in classes)
    return False


def findings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(PACKAGE.parent)
    classes = _stateful_classes(tree)
    out = [f"{where}:{n.lineno} global {', '.join(n.names)}" for n in ast.walk(tree) if isinstance(n, ast.Global)]
    for node in tree.body:  # module level only; `if`/`try` blocks at module level too
        stack = [node]
        while stack:
            n = stack.pop()
            if isinstance(n, (ast.If, ast.Try)):
                stack += [*n.body, *getattr(n, "orelse", []), *getattr(n, "finalbody", []),
                          *[s for h in getattr(n, "handlers", []) for s in h.body]]
            elif isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None and _mutable(n.value, classes):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                if names and names != ["__all__"]:
                    out.append(f"{where}:{n.lineno} {', '.join(names)} = a mutable {type(n.value).__name__}")
    return out


def test_no_mutable_module_level_state():
    found = [f for path in sorted(PACKAGE.rglob("*.py")) for f in findings(path)]
    assert not found, "module-level mutable state (pass it in an object instead):\n" + "\n".join(found)
