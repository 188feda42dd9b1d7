"""The README and docs/*.md: every relative link and anchor resolves, and every `deepen-run`,
`deepen-report` and `deepen-probe` command in the README's code blocks parses: its groups, options
and keys exist (composed with Hydra and checked against the schema, as the CLI does; nothing trains)."""
import itertools
import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from deepen_run.config.schema import ROOT

README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(path: Path) -> list[str]:
    """The file's lines outside code blocks (a `#` line in a bash block is no heading)."""
    out, code = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            code = not code
        elif not code:
            out.append(line)
    return out


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, -1, -2 for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m[1].lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    text = "\n".join(re.sub(r"`[^`]*`", "", ln) for ln in prose(path))
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z]+:", t)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(doc):
    bad = []
    for target in links(doc):
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            bad.append(f"{target}: no file {dest}")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, "\n".join(bad)


def test_readme_fits_a_sitting_and_names_the_test_command():
    text = README.read_text()
    assert len(text.splitlines()) <= 320
    assert "make test" in text and "make test-fast" in text


def commands(path: Path) -> list[tuple[str, list[str]]]:
    """(program, arguments) of every deepen-* line in the file's code blocks, with `\\` continuations
    joined, comments dropped and the shell variables the README defines ($SMALL) filled in."""
    blocks, code, cur = [], False, []
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            if code:
                blocks.append(cur)
            code, cur = not code, []
        elif code:
            cur.append(line)
    env, out = {}, []
    for block in blocks:
        text = "\n".join(block).replace("\\\n", " ")
        for line in text.splitlines():
            words = shlex.split(line, comments=True)
            if len(words) == 1 and re.match(r"^[A-Z_]+=", words[0]):
                k, _, v = words[0].partition("=")
                env[k] = v
            elif words and words[0] in ("deepen-run", "deepen-report", "deepen-probe"):
                args = [a for w in words[1:] for a in (shlex.split(env[w[1:]]) if w[1:] in env else [w])]
                out.append((words[0], args))
    return out


def jobs(args: list[str]) -> list[list[str]]:
    """The overrides of every job a command would run (one for a single run)."""
    axes = []
    for o in OverridesParser.create().parse_overrides([a for a in args if not a.startswith("-")]):
        key = o.get_key_element()
        if key.startswith("hydra"):
            continue  # Hydra's own (launcher and its settings): not part of the job's config
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        axes.append([f"{key}={v}" for v in values])
    return [list(j) for j in itertools.product(*axes)]


README_COMMANDS = commands(README)


def test_the_readme_shows_commands_of_every_program():
    progs = {p for p, _ in README_COMMANDS}
    assert {"deepen-run", "deepen-report", "deepen-probe"} <= progs and len(README_COMMANDS) >= 10


@pytest.mark.parametrize("prog,args", README_COMMANDS, ids=lambda x: x if isinstance(x, str) else " ".join(x)[:60])
def test_every_readme_command_parses(prog, args, capsys):
    from deepen_run.report import main as report
    from deepen_run.run.preflight import numbers, schema_keys

    if prog == "deepen-report":
        # argparse first, then the store: a missing store (exit 2 with our one line) means it parsed.
        args = [a if not a.startswith("<") else "x" for a in args]
        with pytest.raises(SystemExit) as e:
            report.main(args + ["--uri", "sqlite:////nonexistent/mlflow.db"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "usage:" not in err and err.startswith("deepen-report: error: "), err
        return
    name = "config" if prog == "deepen-run" else "probe"
    if name == "probe":
        import deepen_run.cli.probe  # noqa: F401 (stores the probe's schema, as deepen-probe does)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        for job in jobs(args):
            cfg = compose(config_name=name, overrides=job)
            schema_keys(cfg)
            if name == "config":
                numbers(cfg)


def test_every_test_the_reliability_map_names_exists():
    """docs/reliability-tests.md maps each reliability promise to its tests: a renamed or deleted test
    must not leave the map pointing at nothing."""
    text = (ROOT / "docs" / "reliability-tests.md").read_text()
    defined = {m for f in (ROOT / "tests").glob("test_*.py") for m in re.findall(r"^def (test_\w+)", f.read_text(), re.M)}
    files = set(re.findall(r"\b(test_\w+\.py)::", text))
    named = set(re.findall(r"::(test_\w+)", text))
    assert files and named
    assert not {f for f in files if not (ROOT / "tests" / f).exists()}, "files the map names that tests/ lacks"
    assert not named - defined, f"tests the map names that tests/ lacks: {sorted(named - defined)}"
