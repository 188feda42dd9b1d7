"""deepen-report --plan: a study read by the plan it was designed with, not by one chosen after its results.

A plan (YAML, e.g. docs/plans/s3.yaml; docs/study.md "A study plan" has the format) names the
confirmatory family (each member a - b by its rows' settings), the readings of each member (tasks
and/or "avg"), the tests (the paired t test and the exact sign-flip test are both printed; `decide`
says which adjusted p a reading is held to), alpha, the adjustment (Holm) and what it is over, n and
seeds per member, the budget, and the exploratory contrasts, which get their own table.

Every job of a study records the sha256 of the plan it ran under (scripts/study_jobs.py: a `plan`
column in each job file, the plan's text beside the jobs as plan-<sha>.yaml). When the plan given
here is not the one the runs recorded, the report says so first, with the diff, and labels every
reading whose member changed (or every reading, when the tests, alpha or adjustment changed) "post
hoc": a family edited after the results is shown as such, not as the design.
"""
from __future__ import annotations

import csv
import difflib
import hashlib
from pathlib import Path
from typing import Optional

from deepen_run.errors import UserError
from deepen_run.report import contrasts as rc

DECIDE = ("t", "exact", "both")
OVER = ("readings", "avg")  # Holm over every member's every reading, or over their avg readings alone
GLOBAL = ("alpha", "test", "adjustment", "readings")  # a change here changes every reading's test
SHA_LEN = 12


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:SHA_LEN]


def _need(cond: bool, path: Path, what: str) -> None:
    if not cond:
        raise UserError(f"--plan {path}: {what} (docs/study.md, 'A study plan', has the format)")


def parse(text: str, path: Path) -> dict:
    """The plan's content, checked: one line naming the first thing wrong."""
    import yaml

    try:
        p = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UserError(f"--plan {path}: not YAML ({str(e).splitlines()[0]})") from None
    _need(isinstance(p, dict), path, "not a mapping of plan keys")
    for key in ("name", "alpha", "test", "adjustment", "readings", "family"):
        _need(key in p, path, f"no {key!r}")
    _need(isinstance(p["alpha"], (int, float)) and 0 < p["alpha"] < 1, path, f"alpha {p['alpha']!r} is not in (0, 1)")
    test = p["test"]
    _need(isinstance(test, dict) and test.get("decide") in DECIDE, path,
          f"test.decide must be one of {', '.join(DECIDE)} (the adjusted p a reading is held to)")
    adj = p["adjustment"]
    _need(isinstance(adj, dict) and adj.get("method") == "holm", path, "adjustment.method must be holm")
    _need(adj.get("over") in OVER, path, f"adjustment.over must be one of {', '.join(OVER)}")
    _need(isinstance(p["readings"], list) and p["readings"], path, "readings must list tasks and/or avg")
    for group in ("family", "exploratory"):
        members = p.get(group) or {}
        _need(isinstance(members, dict) and (members or group == "exploratory"), path,
              f"{group} must map member ids (C1, ...) to their a and b")
        for mid, m in members.items():
            _need(isinstance(m, dict) and isinstance(m.get("a"), str) and isinstance(m.get("b"), str), path,
                  f"{group} member {mid}: needs a and b (row settings, e.g. 'method=hire importance=mean')")
            _need(group == "exploratory" or isinstance(m.get("n"), int), path, f"family member {mid}: needs n")
    return p


def load(path: Path) -> tuple[dict, str]:
    """(plan, its text)."""
    if not path.is_file():
        raise UserError(f"--plan {path}: no such file")
    text = path.read_text()
    return parse(text, path), text


def recorded(files: list[Path]) -> dict[str, dict]:
    """The plans the job files recorded: sha -> {"text", "files", "where"}. A job file names its plan's
    sha in a `plan` column; the text is plan-<sha>.yaml in the jobs folder (the file's folder or the one
    above). A folder of job files written before the column (Study III) records one plan-<sha>.yaml."""
    out: dict[str, dict] = {}
    for f in files:
        with f.open(newline="") as fh:
            first = next(csv.DictReader(fh), {}) or {}
        folders = [f.parent, f.parent.parent]
        if first.get("plan"):
            s = first["plan"]
            cands = [d / f"plan-{s}.yaml" for d in folders if (d / f"plan-{s}.yaml").is_file()]
        else:
            cands = next((sorted(d.glob("plan-*.yaml")) for d in folders if list(d.glob("plan-*.yaml"))), [])
            if len(cands) != 1:
                continue
            s = cands[0].stem.removeprefix("plan-")
        if not cands:
            raise UserError(f"{f}: records plan {s}, but no plan-{s}.yaml is beside it or its folder")
        text = cands[0].read_text()
        if sha(text) != s:
            raise UserError(f"{cands[0]}: its sha256 starts {sha(text)}, not {s}: the recorded plan was edited")
        out.setdefault(s, {"text": text, "files": 0, "where": cands[0]})["files"] += 1
    return out


def changed_members(now: dict, then: Optional[dict]) -> tuple[set, list[str]]:
    """(the family members whose test differs from the recorded plan's, what changed in words)."""
    if then is None:
        return set(), []
    what = [f"{k} changed" for k in GLOBAL if now.get(k) != then.get(k)]
    fam, old = now["family"], then.get("family") or {}
    if what:
        return set(fam), what
    ab = lambda m: (rc._norm(m["a"]), rc._norm(m["b"]))  # noqa: E731
    post = {i for i, m in fam.items() if i not in old or ab(m) != ab(old[i])}
    what += [f"member {i} {'added' if i not in old else 'changed'}" for i in sorted(post)]
    what += [f"member {i} removed" for i in sorted(set(old) - set(fam))]
    return post, what


def contrast_specs(plan: dict, group: str = "family") -> list[str]:
    return [f"{m['a']}:{m['b']}" for m in (plan.get(group) or {}).values()]


def readings(table: dict, plan: dict, group: str) -> list[dict]:
    """Each member's planned readings, with both tests' p; Holm as the plan says (family) or over the
    group's own readings (exploratory)."""
    rows = table["rows"]
    out = []
    for mid, m in (plan.get(group) or {}).items():
        if group != "family" and not all(len(rc.matches(m[k], rows, mid)) == 1 for k in "ab"):
            continue  # an exploratory contrast whose rows these files do not hold: the family needs none of it
        a, b = rc.select(m["a"], rows, f"--plan {group} {mid} a"), rc.select(m["b"], rows, f"--plan {group} {mid} b")
        pa, pb = rows[a - 1]["per_seed"], rows[b - 1]["per_seed"]
        tasks = [t for t in pa if t in pb]
        for task in plan["readings"]:
            if task != "avg" and task not in tasks or task == "avg" and not tasks:
                continue
            x, y = (rc.seed_avgs(p, tasks) for p in (pa, pb)) if task == "avg" else (pa[task], pb[task])
            d = rc.paired(x, y)
            if d is None:
                continue
            out.append({"member": mid, "a": a, "b": b, "task": task, "planned_n": m.get("n")} | d
                       | {"p_exact": rc.sign_flip(rc.differences(x, y))})
    held = [c for c in out if group != "family" or plan["adjustment"]["over"] == "readings" or c["task"] == "avg"]
    for c in out:
        c["p_holm"] = c["p_holm_exact"] = None
    for key in ("p", "p_exact"):
        for c, q in zip(held, rc.holm([c[key] for c in held])):
            c["p_holm" if key == "p" else "p_holm_exact"] = q
    return out


def holds(c: dict, plan: dict) -> str:
    ps = {"t": [c["p_holm"]], "exact": [c["p_holm_exact"]], "both": [c["p_holm"], c["p_holm_exact"]]}
    ps = ps[plan["test"]["decide"]]
    if any(p is None for p in ps):
        return "-"
    return "holds" if all(p < plan["alpha"] for p in ps) else "does not hold"


def header(path: Path, plan: dict, text: str, rec: dict[str, dict]) -> tuple[str, set]:
    """The report's first lines: the plan and whether the runs recorded this one; the post hoc members."""
    mine = sha(text)
    line = f"Plan: {path} ({plan['name']}), sha256 {mine}"
    if not rec:
        return line + "; the runs recorded no plan: every reading is read as this plan says, unchecked.\n\n", set()
    if mine in rec and len(rec) == 1:
        return line + f"; the runs recorded this plan ({rec[mine]['files']} job files): read as designed.\n\n", set()
    import yaml

    # Held to every plan the runs recorded, not only the most recorded: a plan edited after its first
    # jobs and recorded by more jobs afterwards still marks the member it changed.
    post, what, diff = set(), [], ""
    for s, r in sorted(rec.items(), key=lambda kv: -kv[1]["files"]):
        if s == mine:
            continue
        p, w = changed_members(plan, yaml.safe_load(r["text"]))
        post |= p
        what.append(f"against {s}: " + ("; ".join(w) or "only comments changed"))
        diff += "".join(difflib.unified_diff(r["text"].splitlines(True), text.splitlines(True), str(r["where"]), str(path)))
    recs = ", ".join(f"{s} ({r['files']} job files, {r['where']})" for s, r in rec.items())
    out = (f"**The plan changed after its runs recorded it.** {line}; the runs recorded {recs}. "
           + "; ".join(what) + ": readings of a changed member are labelled post hoc.\n\n```diff\n" + diff + "```\n\n")
    return out, post


def markdown(table: dict, plan: dict, fam: list[dict], explo: list[dict], post: set) -> str:
    from deepen_run.report.contrasts import fmt_p

    adj = plan["adjustment"]["over"]
    m = sum(c["p_holm"] is not None for c in fam)
    over = f"the {m} readings of the family" + (" (each member's avg reading alone; per-task readings descriptive)"
                                                 if adj == "avg" else "")
    decide = {"t": "the t test's", "exact": "the exact sign-flip test's", "both": "both tests'"}[plan["test"]["decide"]]
    lines = ["", f"Planned family ({plan['name']}: a - b, paired by seed; 95% t interval; p t: two-sided t test; "
             f"p exact: two-sided sign-flip test; Holm over {over}; a reading holds where {decide} p Holm is below "
             f"alpha {plan['alpha']}):", "",
             "| member | a | b | task | n (planned) | a - b [95% CI] | p t | p exact | p Holm t | p Holm exact | reading | plan |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in fam:
        ci = f" [{c['lo']:+.1f}, {c['hi']:+.1f}]" if c["lo"] is not None else ""
        lines.append(f"| {c['member']} | {c['a']} | {c['b']} | {c['task']} | {c['n']} ({c['planned_n']}) | "
                     f"{c['mean']:+.1f}{ci} | {fmt_p(c['p'])} | {fmt_p(c['p_exact'])} | {fmt_p(c['p_holm'])} | "
                     f"{fmt_p(c['p_holm_exact'])} | {holds(c, plan)} | "
                     f"{'post hoc' if c['member'] in post else 'as planned'} |")
    held = sorted({c["member"] for c in fam if holds(c, plan) == "holds"})
    lines += ["", f"Members with a reading that holds: {', '.join(held) or 'none'} "
              f"({len(held)} of {len(plan['family'])})."]
    if explo:
        lines += ["", "Exploratory (named in the plan, not in the family; Holm over these readings alone):", "",
                  "| id | a | b | task | n | a - b [95% CI] | p t | p exact | p Holm t | p Holm exact |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for c in explo:
            ci = f" [{c['lo']:+.1f}, {c['hi']:+.1f}]" if c["lo"] is not None else ""
            lines.append(f"| {c['member']} | {c['a']} | {c['b']} | {c['task']} | {c['n']} | {c['mean']:+.1f}{ci} | "
                         f"{fmt_p(c['p'])} | {fmt_p(c['p_exact'])} | {fmt_p(c['p_holm'])} | {fmt_p(c['p_holm_exact'])} |")
    return "\n".join(lines) + "\n"


def take_over(a) -> tuple[dict, str]:
    """Check --plan against the other flags (the plan names the contrasts and the adjustment) and load it."""
    clash = [f for f, v in (("--contrast", a.contrast), ("--only-contrasts", a.only_contrasts),
                            ("--holm-avg", a.holm_avg), ("--secondary", a.secondary)) if v]
    if clash:
        raise UserError(f"--plan names the contrasts and their adjustment: drop {', '.join(clash)}")
    plan, text = load(a.plan)
    a.contrast, a.only_contrasts = contrast_specs(plan), True
    return plan, text


def report(table: dict, plan: dict, text: str, a) -> str:
    """The plan's report: its header first, the rows, the planned family, the exploratory table. Sets
    table["contrasts"] (for --json) to the family's readings with the planned adjustment."""
    from deepen_run.report.output import to_markdown

    fam, explo = readings(table, plan, "family"), readings(table, plan, "exploratory")
    top, post = header(a.plan, plan, text, recorded(a.from_csv or []))
    for c in fam:
        c["post_hoc"] = c["member"] in post
        c["holds"] = holds(c, plan)
    table["contrasts"], table["plan"] = fam, {"name": plan["name"], "sha256": sha(text), "exploratory": explo}
    return top + to_markdown({**table, "contrasts": []}) + markdown(table, plan, fam, explo, post)
