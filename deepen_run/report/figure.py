"""The report's figure: methods side by side per GLUE task (matplotlib, headless via figures)."""
from __future__ import annotations

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
