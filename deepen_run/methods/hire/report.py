"""What HIRE learned about the layers: importances on the dev set, as tables and figures for MLflow.

  hire/importance.csv        mean alpha per task (rows) over its whole dev set, one column per layer
  hire/importance.png        the same as an annotated heatmap: which layers each task leans on
  hire/examples.csv          alpha of the first `method.report_examples` dev examples of each task
  hire/examples/<task>.png   those examples x layers, each row labelled with its text
  metrics hire/<task>/layer_<j>   the mean importances, for comparing runs in the MLflow UI

Layer j is the backbone's hidden_states[j]: layer_0 is the embedding output, layer_L the last layer.
On a duplicated backbone (backbone.duplicate_layers) layers keep their original numbers and a copy
is marked: 3' (CSV column layer_3', metric layer_3_copy1), a second copy 3'' (layer_3_copy2).
"""
from __future__ import annotations

import sys

import torch
from tqdm.auto import tqdm

from deepen_run.figures import plt


def collect(ev, ctx, task: str, sample: int):
    """-> mean alpha (J,) over all of the task's dev sets, and (texts, labels, alpha (n, J)) of the first
    `sample`, from the importances the final evaluation kept (evaluation.Evaluation.extras): no second
    pass over the dev sets, and in dev order (run/evaluation.py restores it)."""
    total, n = None, 0
    texts, labels, first = [], [], []
    for name, ds in ctx.data[task].dev.items():
        chunks = [a.float() for a in ev.extras[name]["alpha"]]
        for alpha in chunks:
            total = alpha.sum(0) if total is None else total + alpha.sum(0)
            n += alpha.shape[0]
        k = max(0, min(sample - len(texts), len(ds)))
        if k:
            first.append(torch.cat(chunks)[:k])
            texts += ctx.tokenizer.batch_decode(ds[:k]["input_ids"], skip_special_tokens=True)
            labels += ev.refs[name][:k]
    mean = total / n
    return mean, texts, labels, torch.cat(first) if first else torch.zeros(0, mean.numel())


def snippet(text: str, width: int = 48) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def scale(num_layers: int):
    """The colour scale of every importance figure, fixed by J alone so figures compare and a
    near-uniform alpha looks uniform: white = 1/J (uniform), full blue = 0 (a layer ignored), full
    red = 2/J or more (twice its share). Not stretched to the data: 0.196 vs 0.208 stay near white."""
    from matplotlib.colors import TwoSlopeNorm

    uniform = 1.0 / num_layers
    return TwoSlopeNorm(uniform, 0.0, 2 * uniform)


def heatmap(values, rows: list[str], cols: list[str], title: str, ylabel: str, span: list[str] | None = None):
    """An annotated rows x layers heatmap of alpha, on the fixed scale() (red = leaned on, blue =
    neglected, white = uniform). With `span` (every hidden state's label, 0 = embeddings .. L) the x axis
    is the whole backbone and the layers a method does not weigh are grey, so HIRE's importances (the
    intermediate layers) and the scalar mix's weights (every layer) are drawn on the same axes."""
    import numpy as np
    from matplotlib import colormaps

    v = np.asarray(values, dtype=float)
    norm = scale(v.shape[1])  # white = uniform over the layers this method weighs
    if span:
        whole = np.full((v.shape[0], len(span)), np.nan)
        whole[:, [span.index(c) for c in cols]] = v
        v, cols = whole, list(span)
    cmap = colormaps["RdBu_r"].with_extremes(bad="0.85")
    width = 2.4 + 0.8 * len(cols) + 0.065 * max(map(len, rows), default=0)
    # wide enough for the title too: with one or two layers read it was cut off at both ends
    fig, ax = plt.subplots(figsize=(max(width, 1.5 + 0.09 * len(title)), 1.5 + 0.42 * len(rows)))
    im = ax.imshow(np.ma.masked_invalid(v), cmap=cmap, norm=norm, aspect="auto")
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows, fontsize=8 if len(rows) > 8 else 10)
    copy = next((c for c in cols if "'" in c), None)  # the notation, said with this model's own first copy
    copies = f"; {copy} = a copy of {copy[:-1]}" if copy else ""
    grey = "; grey = not weighed" if np.isnan(v).any() else ""
    ax.set(xlabel=f"backbone layer (0 = embeddings{copies}{grey})", ylabel=ylabel, title=title)
    for i in range(v.shape[0]):
        for j in range(v.shape[1]):
            if not np.isnan(v[i, j]):
                ax.text(j, i, f"{v[i, j]:.3f}", ha="center", va="center", fontsize=7,
                        color="white" if abs(norm(v[i, j]) - 0.5) > 0.3 else "black")
    weighed = int((~np.isnan(v[0])).sum()) if len(v) else len(cols)
    fig.colorbar(im, ax=ax, label=f"α  (white = uniform, 1/{weighed})", fraction=0.046, pad=0.04, extend="max")
    fig.tight_layout()
    return fig


def record(model, ctx) -> None:
    if not ctx.accelerator.is_main_process:
        return  # the tracker only writes on the main process; the others would compute for nothing
    sample = model.cfg.report_examples
    cols = model.layer_labels
    names = [f"layer_{c}" for c in cols]  # CSV columns; metrics use the quote-free model.layer_names
    means, example_rows = {}, []
    # A bar only at a terminal: in a log file its redraws are noise (deepen_run/run/progress.py).
    for spec in tqdm(ctx.tasks, desc="HIRE report", leave=False, dynamic_ncols=True, disable=not sys.stderr.isatty()):
        mean, texts, labels, alphas = collect(ctx.evaluation, ctx, spec.name, sample)
        means[spec.name] = mean
        for k, (text, label, a) in enumerate(zip(texts, labels, alphas)):
            example_rows.append({"task": spec.name, "example": k, "label": label, "text": snippet(text, 120),
                                 **{nm: round(float(x), 6) for nm, x in zip(names, a)}})
        if len(alphas):
            rows = [f"{snippet(t)} [{lab if spec.is_regression else spec.label_names[lab]}]"
                    for t, lab in zip(texts, labels)]
            fig = heatmap(alphas.numpy(), rows, cols, f"{spec.name}: importance per dev example", "dev example",
                          model.labels)
            ctx.tracker.log_figure(fig, f"hire/examples/{spec.name}.png")
            plt.close(fig)

    table = [{"task": t, **{nm: round(float(x), 6) for nm, x in zip(names, m)}} for t, m in means.items()]
    ctx.tracker.log_csv(table, "hire/importance.csv")
    ctx.tracker.log_csv(example_rows, "hire/examples.csv")
    fig = heatmap([m.numpy() for m in means.values()], list(means), cols,
                  f"HIRE mean layer importance on dev ({model.cfg.importance})", "task", model.labels)
    ctx.tracker.log_figure(fig, "hire/importance.png")
    plt.close(fig)
    ctx.tracker.log_metrics({f"hire/{t}/{nm}": float(x) for t, m in means.items()
                             for nm, x in zip(model.layer_names, m)}, 0)
