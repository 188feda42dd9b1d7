"""Power of a paired contrast (deepen-report --power; docs/study.md, section "Power by design").

For a paired t test of n seed differences with standard deviation s, two-sided level alpha and power
1 - beta, the minimum detectable effect is

    MDE(n) = (t_{1 - alpha/2, n-1} + t_{1 - beta, n-1}) * s / sqrt(n)

(the smallest true mean difference the test finds with probability 1 - beta). A study that tests a
family of m contrasts with Holm's step-down method controls the family's error at alpha if each is
planned at alpha / m (Holm's first step, the strictest): so n for a member is the smallest n with
MDE(n) <= the target at alpha / m. A null result is read with its 90% interval: the effects outside
it are ruled out at the 5% level one-sided (the two one-sided tests of equivalence).
"""
from __future__ import annotations

import math
import statistics

from deepen_run.report import contrasts as rc
from deepen_run.errors import UserError

POWER = 0.8
ALPHA = 0.05


def mde(s: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    from scipy import stats

    return (stats.t.ppf(1 - alpha / 2, n - 1) + stats.t.ppf(power, n - 1)) * s / math.sqrt(n)


def n_for(s: float, target: float, alpha: float = ALPHA, power: float = POWER, most: int = 1000) -> int | None:
    """The smallest n (at least 3) whose MDE is at most target; None beyond `most`."""
    return next((n for n in range(3, most + 1) if mde(s, n, alpha, power) <= target), None)


def diffs(a: dict, b: dict, task: str) -> list[float]:
    """Per-seed a - b on a task, or on the average over the tasks both rows ran ("avg")."""
    tasks = [t for t in a if t in b]
    x, y = (rc.seed_avgs(r, tasks) if task == "avg" else r[task] for r in (a, b))
    return [x[s] - y[s] for s in sorted(set(x) & set(y), key=rc.seed_order)]


def table(rows: list[dict], specs: list[str], family: int, target: float) -> list[dict]:
    """Per A:B spec (report/contrasts.py, parse) and task: n, mean, 90% interval, paired sd, the MDE
    at this n (alpha 0.05, and alpha / family: what a member of the family was planned at) and the n
    for MDE <= target at alpha / family."""
    from scipy import stats

    out = []
    for spec in specs:
        a, b = rc.parse(spec, rows)
        if a == b:
            raise UserError(f"--power {spec}: compares row {a} with itself")
        pa, pb = rows[a - 1]["per_seed"], rows[b - 1]["per_seed"]
        common = [t for t in pa if t in pb]
        before = len(out)
        for task in common + (["avg"] if len(common) > 1 else []):  # one task: avg is that task again
            d = diffs(pa, pb, task)
            if len(d) < 2:
                continue
            s, n = statistics.stdev(d), len(d)
            ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.90)
            out.append({"a": a, "b": b, "task": task, "n": n, "mean": statistics.fmean(d), "lo90": float(ci.low),
                        "hi90": float(ci.high), "sd": s, "mde": mde(s, n), "mde_family": mde(s, n, ALPHA / family),
                        "n_needed": n_for(s, target, ALPHA / family)})
        if len(out) == before:
            raise UserError(f"--power {spec}: rows {a} and {b} share fewer than 2 seeds on a common task (the "
                            "paired sd needs 2)")
    return out


def markdown(power: list[dict], family: int, target: float) -> str:
    at = f"alpha 0.05/{family}"  # a family's member was planned at its Holm's strictest level
    lines = ["", f"Power (paired sd of a - b over seeds; MDE: minimum detectable effect at 80% power, two-sided "
                 f"alpha 0.05, at this n{f', and at {at}' if family > 1 else ''}; n for MDE <= {target}: at "
                 f"{at}, a family of {family} under Holm; 90% CI: the effects outside it are ruled out):", "",
             f"| a | b | task | n | a - b [90% CI] | paired sd | MDE at n |{f' MDE at n, {at} |' if family > 1 else ''}"
             f" n for MDE <= {target} |", "|---|---|---|---|---|---|---|---|" + ("---|" if family > 1 else "")]
    for p in power:
        need = p["n_needed"] if p["n_needed"] is not None else "> 1000"
        strict = f" {p['mde_family']:.1f} |" if family > 1 else ""
        lines.append(f"| {p['a']} | {p['b']} | {p['task']} | {p['n']} | {p['mean']:+.1f} [{p['lo90']:+.1f}, "
                     f"{p['hi90']:+.1f}] | {p['sd']:.2f} | {p['mde']:.1f} |{strict} {need} |")
    return "\n".join(lines) + "\n"
