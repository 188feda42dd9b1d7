"""The report's figures: methods side by side per GLUE task, and the contrasts with their intervals
(matplotlib, headless via figures)."""
from __future__ import annotations

import re
import textwrap

from deepen_run.figures import plt
from deepen_run.data.glue import TASKS


def methods_plot(table: dict):
    """Grouped bars: one group per task (and the average), one bar per row, error bars = std."""
    cols = table["tasks"] + ["avg"]
    rows = table["rows"]
    width = 0.8 / max(1, len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(cols) + 2), 4.2))
    # tab10 repeats after ten bars; an ablation table has more rows than that.
    colors = plt.get_cmap("tab10" if len(rows) <= 10 else "tab20").colors
    for i, r in enumerate(rows):
        xs = [j + (i - (len(rows) - 1) / 2) * width for j, c in enumerate(cols) if r[c]]
        means = [r[c]["mean"] for c in cols if r[c]]
        errs = [r[c]["std"] or 0.0 for c in cols if r[c]]
        label = " / ".join(v for v in (r["backbone"], r["method"], r["setup"], r["settings"]) if v and v != "-")
        ax.bar(xs, means, width, yerr=errs, capsize=2, color=colors[i % len(colors)],
               label=f"{i + 1}: {label} (n={r['n']})")
    ax.set_xticks(range(len(cols)), [TASKS[c].folder if c in TASKS else "Avg" for c in cols])
    ax.set(ylabel="dev score x100 (mean ± std over seeds)", title="methods per GLUE task")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig  # save with bbox_inches="tight": the legend stands outside the axes


def _tokens(settings: str) -> list[str]:
    """'duplicate_layers=[1, 2] pooling=mean' -> ['duplicate_layers=[1, 2]', 'pooling=mean']."""
    return [t for t in re.split(r"\s+(?=[\w.]+=)", settings.strip()) if t and t != "-"]


def contrast_label(a: dict, b: dict) -> str:
    """What tells row a from row b: its method if they differ, then the settings they do not share."""
    ta, tb = _tokens(a["settings"]), _tokens(b["settings"])

    def other(r):
        return b if r is a else a

    def side(r, mine, theirs):
        own = [t for t in mine if t not in theirs and not t.endswith("=None")]
        # the words of the setups that differ ("annealed" against "proportional"), not their common start
        setup = [w for w in re.split(r"[ ,]+", r["setup"]) if w not in re.split(r"[ ,]+", other(r)["setup"])]
        return " ".join(([r["method"]] if a["method"] != b["method"] else []) + setup + own) or r["setup"]
    return f"{a['id']}: {side(a, ta, tb)}  -  {b['id']}: {side(b, tb, ta)}"


def contrasts_plot(table: dict):
    """The contrasts as a forest plot: per contrast, a - b on each task and the average with its 95%
    interval, against the zero line, so which differences the data can tell is seen at a glance."""
    rows, cs = table["rows"], table["contrasts"]
    pairs = list(dict.fromkeys((c["a"], c["b"]) for c in cs))
    tasks = list(dict.fromkeys(c["task"] for c in cs))
    fig, ax = plt.subplots(figsize=(8.0, 1.0 + 0.3 * len(pairs) * len(tasks) ** 0.5))
    colors = plt.get_cmap("tab10").colors
    step = 0.7 / max(1, len(tasks))
    for k, task in enumerate(tasks):
        pts = [(pairs.index((c["a"], c["b"])), c) for c in cs if c["task"] == task]
        ys = [i + (k - (len(tasks) - 1) / 2) * step for i, _ in pts]
        means = [c["mean"] for _, c in pts]
        # No interval (one seed, or the same difference for every seed): the point alone.
        err = [[c["mean"] - c["lo"] if c["lo"] is not None else 0.0 for _, c in pts],
               [c["hi"] - c["mean"] if c["hi"] is not None else 0.0 for _, c in pts]]
        name = "Avg" if task == "avg" else TASKS[task].folder if task in TASKS else task
        ax.errorbar(means, ys, xerr=err, fmt="o" if task == "avg" else ".", capsize=2, color=colors[k % 10],
                    label=name, markersize=6 if task == "avg" else 4)
    ax.axvline(0, color="grey", lw=0.8)
    _clip_outliers(ax, cs, pairs, step, tasks, colors)
    member = {(c["a"], c["b"]): f"{c['member']}  " for c in cs if c.get("member")}  # a plan's family: F1, ...
    # long settings wrap, so the labels leave the intervals their room
    ax.set_yticks(range(len(pairs)), [textwrap.fill(member.get((a, b), "") + contrast_label(rows[a - 1], rows[b - 1]),
                                                    60) for a, b in pairs], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="a - b, dev score x100 (paired by seed, 95% t interval)", title="contrasts")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: it hid the last contrast
    fig.tight_layout()
    return fig


def _clip_outliers(ax, cs: list[dict], pairs: list, step: float, tasks: list, colors) -> None:
    """One contrast tens of points wide (a method that fails a task) would flatten every other to a dot:
    past 4x the median contrast's reach, the axis stops at the others' and each point beyond it is
    written at the edge with its value."""
    def reach(c):
        return max(abs(v) for v in (c["mean"], c["lo"], c["hi"]) if v is not None)
    width = {p: max(reach(c) for c in cs if (c["a"], c["b"]) == p) for p in pairs}
    median = sorted(width.values())[len(width) // 2]
    inside = [w for w in width.values() if w <= 4 * median]
    if len(inside) == len(width) or not inside or median == 0:
        return
    edge = 1.3 * max(inside)
    ax.set_xlim(-edge, edge)
    for c in cs:
        if abs(c["mean"]) > edge:
            y = pairs.index((c["a"], c["b"])) + (tasks.index(c["task"]) - (len(tasks) - 1) / 2) * step
            side = 1 if c["mean"] > 0 else -1
            text = f"{c['mean']:+.1f} >" if side > 0 else f"< {c['mean']:+.1f}"
            ax.annotate(text, (side * edge, y), ha="right" if side > 0 else "left", va="center", fontsize=6,
                        color=colors[tasks.index(c["task"]) % 10])
