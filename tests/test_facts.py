"""One home per fact. A number the README quotes from a docs/ page must be that page's number (the
page is its home, the README links to it), and every path or module a docstring or comment in
deepen_run/ cites must exist (code that moved leaves no stale pointer behind)."""
import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "deepen_run"
README = (ROOT / "README.md").read_text()


def make_times(text: str) -> dict[str, set[str]]:
    """`make <target> ... ~<n> min here` lines (the code blocks that list the targets) -> target -> times."""
    out: dict[str, set[str]] = {}
    for target, time in re.findall(r"^make ([\w-]+)\s.*~([\d.]+ (?:min|s|h)) here\s*$", text, re.M):
        out.setdefault(target, set()).add(time)
    return out


def test_the_readme_quotes_the_development_page_s_times():
    home = make_times((ROOT / "docs" / "development.md").read_text())
    quoted = make_times(README)
    assert {"test", "test-fast", "demo"} <= set(quoted) <= set(home), (quoted, home)
    for target, times in quoted.items():
        assert len(home[target]) == 1, (target, home[target])
        assert times == home[target], f"README says make {target} takes {times}, docs/development.md {home[target]}"


def test_the_study_s_length_is_the_same_everywhere():
    """docs/results.md derives it from the measured parts; the README and docs/study.md's plan quote it."""
    (home,) = re.findall(r"about ([\d.]+) hours for `make study`", (ROOT / "docs" / "results.md").read_text())
    (readme,) = re.findall(r"`make study` \(.*?about ([\d.]+) hours", README, re.S)
    (plan,) = re.findall(r"^\| all primary \|.*~([\d.]+) h \|$", (ROOT / "docs" / "study.md").read_text(), re.M)
    assert readme == plan == home
    makefile = (ROOT / "Makefile").read_text()
    assert not re.search(r"about [\d.]+ (h|hours|min|minutes) in all", makefile)  # it links instead



def speed_claims(text: str) -> list[tuple[str, str, str]]:
    """`<x>x [and <y>x] ... on a <machine with> KIND` clauses -> (x, y or '', kind)."""
    return re.findall(r"([\d.]+)x(?: and ([\d.]+)x)? [^;)]*?on a [^;)]*?(AVX2 only|AVX-512 BF16|AMX)\b", text)


def test_the_readme_s_speed_figures_name_their_cpu_and_their_code():
    """Every ratio in the README's performance row sits in a clause naming its CPU kind, under "today's
    code" (the performance page's row for that kind holds it) or "older code" (the history page's row
    does: the performance page keeps no table of older code); the budget's seconds a step are the page's."""
    page = (ROOT / "docs" / "performance.md").read_text()
    history = (ROOT / "docs" / "history" / "performance.md").read_text()
    (row,) = [ln for ln in README.splitlines() if ln.startswith("| performance:")]
    assert row.count("today's code:") == 1 and row.count("older code:") == 1, row
    today, older = row.split("today's code:")[1].split("older code:")
    claims = {"today": speed_claims(today), "older": speed_claims(older)}
    found = sorted(x for c in claims["today"] + claims["older"] for x in c[:2] if x)
    assert found and found == sorted(re.findall(r"([\d.]+)x", row)), row  # no ratio without its CPU
    for when, home in (("today", page), ("older", history)):
        for default, bf16, kind in claims[when]:
            cells = f"| {default}x | {bf16}x |" if bf16 else f"| {default}x |"
            rows = [ln for ln in home.splitlines() if ln.startswith(f"| {kind}")]
            assert any(cells in r for r in rows), (when, kind, cells, rows)
    per_step = re.findall(r"([\d.]+) s (?:per MiniLM step|\(fp32)", README)
    assert len(per_step) == 2 and all(f"{s} s a step" in page for s in per_step), per_step

# Cited paths: deepen_run/..., docs/..., tests/..., conf/..., scripts/...; and a subpackage's own
# files (methods/<name>/config.py, run/evaluation.py). <name> stands for a method folder.
FULL = re.compile(r"(?<![\w/.\-])((?:deepen_run|docs|tests|conf|scripts)/[\w\-./<>]*[\w>])")
SHORT = re.compile(r"(?<![\w/.\-])((?:methods|model|run|sweep|cli|report|data|tracking|config)/[\w\-./<>]*\.py)\b")
# Dotted names: deepen_run.x.y in full, or <subpackage>.<its module>.<name> (model.heads.pool).
DOTTED = re.compile(r"(?<![\w./\-])((?:deepen_run|model|run|methods|sweep|cli|report|data|tracking|config)"
                    r"(?:\.[A-Za-z_]\w*)+)(?![\w(/\-]|\.\w)")
FILE_SUFFIXES = {"json", "yaml", "md", "py", "tsv", "csv", "txt", "png", "zip", "safetensors"}
FOLDERS = tuple(p.parent.name for p in (PKG / "methods").glob("*/config.py"))


def cited(path: Path):
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            yield tok.start[0], tok.string


def path_exists(p: str, here: Path) -> bool:
    p = p.rstrip("./")
    variants = [p.replace("<name>", n) for n in FOLDERS] if "<name>" in p else [p]
    for v in (re.sub(r"<[^>]+>", "*", v) for v in variants):
        if any(any(base.glob(v)) for base in (ROOT, PKG)):
            return True
    return False


def name_exists(dotted: str) -> bool | None:
    """True/False for a name under deepen_run; None when it is not one (a file name, a variable)."""
    parts = dotted.split(".")
    if len(parts) == 2 and parts[1] in FILE_SUFFIXES:
        return None  # deepen_run.json, config.yaml: a file name
    if parts[0] != "deepen_run":
        if not (PKG / parts[0] / f"{parts[1]}.py").is_file():
            return None  # model.safetensors, run.json, sweep.overrides: not a module reference
        parts = ["deepen_run", *parts]
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("module", sorted(PKG.rglob("*.py")), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_what_a_docstring_or_comment_cites_exists(module):
    bad = []
    for line, text in cited(module):
        for p in set(FULL.findall(text)) | set(SHORT.findall(text)):
            if not path_exists(p, module):
                bad.append(f"line {line}: {p}")
        for d in set(DOTTED.findall(text)):
            if name_exists(d) is False:
                bad.append(f"line {line}: {d}")
    assert not bad, bad


def test_the_citation_check_sees_a_stale_pointer():
    assert not path_exists("deepen_run/methods/hire.py", PKG) and not path_exists("methods/<name>.py", PKG)
    assert path_exists("methods/<name>/config.py", PKG) and path_exists("docs/development.md", PKG)
    assert name_exists("deepen_run.model.pool") is False and name_exists("model.heads.pool") is True
    assert name_exists("model.safetensors") is None
