"""The depth-weighted average's learned weights as a figure and a table (deepen_run/model/dwa.py).

  dwa/weights.png   layer (rows: the input of layer i+1 after layer i) x earlier layer (columns: 0 =
                    embeddings, j = layer j's output), an annotated heatmap; the identity is the
                    diagonal of ones, so what moved off it is what the model learned to read
  dwa/weights.csv   the same numbers, one row per layer
"""
from __future__ import annotations

from deepen_run.figures import plt


def matrix(dwa) -> list[list[float]]:
    """Row i: a_{i,0..i+1}, padded with NaN where layer i cannot read (later layers)."""
    n = len(dwa.weights)
    return [[float(x) for x in w.detach().cpu()] + [float("nan")] * (n - i - 1) for i, w in enumerate(dwa.weights)]


def figure(rows: list[list[float]], labels: list[str]):
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    v = np.asarray(rows, dtype=float)
    n = v.shape[0]
    fig, ax = plt.subplots(figsize=(2.5 + 0.6 * (n + 1), 1.5 + 0.45 * n))
    im = ax.imshow(np.ma.masked_invalid(v), cmap="RdBu_r", norm=TwoSlopeNorm(0.0, min(-1e-3, np.nanmin(v)),
                                                                             max(1.0, np.nanmax(v))), aspect="auto")
    ax.set_xticks(range(n + 1), labels)
    ax.set_yticks(range(n), [f"after {lab}" for lab in labels[1:]])
    ax.set(xlabel="earlier layer read (0 = embeddings)", ylabel="layer", title="DWA weights a[i, j]")
    for i in range(n):
        for j in range(i + 2):
            ax.text(j, i, f"{v[i, j]:.3f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label="weight (identity: 1 on the diagonal)", fraction=0.046, pad=0.04)
    fig.tight_layout()
    return fig


def record_weights(dwa, backbone, ctx) -> None:
    from deepen_run.model import layers as surgery

    # In the original numbering, a copy of layer 3 as 3' (ALBERT: its depths).
    labels = surgery.hidden_state_labels(surgery.sources(backbone))
    rows = matrix(dwa)
    # Every row has every column (a CSV's header is one): empty where layer i cannot read layer j.
    ctx.tracker.log_csv([{"layer": labels[i + 1], **{f"from_{labels[j]}": round(x, 6) if j < i + 2 else ""
                                                     for j, x in enumerate(r)}} for i, r in enumerate(rows)],
                        "dwa/weights.csv")
    fig = figure(rows, labels)
    ctx.tracker.log_figure(fig, "dwa/weights.png")
    plt.close(fig)
