"""The report's figures: methods side by side per GLUE task, and the contrasts with their intervals
(matplotlib, headless via figures)."""
from __future__ import annotations

import re

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

    def side(r, mine, theirs):
        own = [t for t in mine if t not in theirs and not t.endswith("=None")]
        setup = [r["setup"].split(" ")[0].split(",")[0]] if a["setup"] != b["setup"] else []
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
    ax.set_yticks(range(len(pairs)), [contrast_label(rows[a - 1], rows[b - 1]) for a, b in pairs], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="a - b, dev score x100 (paired by seed, 95% t interval)", title="contrasts")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig
