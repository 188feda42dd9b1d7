"""Figures for MLflow: matplotlib, headless."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def sampling_plot(table: list[dict], tasks: list[str]):
    """Task probabilities per epoch: what the schedule fed the model, and when."""
    fig, ax = plt.subplots(figsize=(7, 4))
    epochs = [r["epoch"] for r in table]
    bottom = [0.0] * len(table)
    for t in tasks:
        vals = [r[t] for r in table]
        ax.bar(epochs, vals, bottom=bottom, label=t)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set(xlabel="epoch", ylabel="probability of a batch", title="task sampling schedule", ylim=(0, 1))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # epochs are whole: no 1.25
    ax.legend(bbox_to_anchor=(1.01, 1), loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig
