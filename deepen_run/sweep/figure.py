"""A sweep's figure on its parent run (sweep/eval_score.png, summary.py logs it): eval/score of the
finished children against the swept keys. matplotlib's object API, not pyplot: the job watcher's thread may
draw while a job in the same process (the basic launcher) draws its own figures with pyplot."""
from __future__ import annotations

import statistics


def distinct(values: list[str]) -> list[str]:
    """The distinct values, numbers in numeric order (seeds 1,2,10), others in the order they came."""
    try:
        return sorted(set(values), key=float)
    except ValueError:
        return list(dict.fromkeys(values))


def score_points(children: list[dict], keys: list[str]) -> dict[tuple, list[float]]:
    """(value of each key) -> eval/score of the finished children (one per seed)."""
    out: dict[tuple, list[float]] = {}
    for r in children:
        score = r["metrics"].get("eval/score")
        if r["status"] == "FINISHED" and score is not None and score == score:
            out.setdefault(tuple(r["tags"].get(k, "?") for k in keys), []).append(score)
    return out


def figure(children: list[dict], swept_keys: list[str]):
    """eval/score against the swept keys (seed aside): a line with the seeds' spread for one key, a
    heatmap of the mean for two; several keys beyond that share the x axis as combined labels."""
    from matplotlib.figure import Figure

    keys = [k for k in swept_keys if k != "seed"]
    pts = score_points(children, keys)
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    title = "eval/score (dev) of the sweep's finished runs"
    if len(keys) == 2:
        xs, ys = (distinct([p[i] for p in pts]) for i in (0, 1))
        grid = [[statistics.fmean(pts[(x, y)]) if (x, y) in pts else float("nan") for x in xs] for y in ys]
        im = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
        for j, row in enumerate(grid):
            for i, v in enumerate(row):
                if v == v:
                    n = len(pts[(xs[i], ys[j])])
                    ax.text(i, j, f"{v:.3f}\n(n={n})", ha="center", va="center", fontsize=8, color="w")
        ax.set_xticks(range(len(xs)), xs)
        ax.set_yticks(range(len(ys)), ys)
        ax.set(xlabel=keys[0], ylabel=keys[1], title=title + ", mean over seeds")
        fig.colorbar(im, ax=ax, label="eval/score")
    else:
        labels = distinct([" ".join(p) for p in pts]) if len(keys) == 1 else [" ".join(p) for p in pts]
        by_label = {" ".join(p): v for p, v in pts.items()}
        xs = list(range(len(labels)))
        vals = [by_label[lab] for lab in labels]
        means = [statistics.fmean(v) for v in vals]
        ax.fill_between(xs, [min(v) for v in vals], [max(v) for v in vals], alpha=0.25, label="min-max over seeds")
        ax.plot(xs, means, marker="o", label="mean over seeds")
        for x, v in zip(xs, vals):
            ax.scatter([x] * len(v), v, s=12, color="k", zorder=3)
        ax.set_xticks(xs, labels or [])
        ax.set(xlabel=" ".join(keys) or "(seeds only)", ylabel="eval/score", title=title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
