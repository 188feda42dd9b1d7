"""What the scalar mix learned: its weights per task, read side by side with HIRE's importances.

  scalar_mix/weights.csv     softmax(s_t) per task (rows), one column per hidden state, and gamma_t
  scalar_mix/weights.png     the same as HIRE's importance heatmap draws it (deepen_run/methods/hire/report.py,
                             heatmap): tasks x every hidden state of the backbone (the x axis of HIRE's
                             figure too), "0" = embeddings, 3' = a copy of layer 3, grey = not weighed,
                             the colour scale fixed by the number of weights (white = uniform)
  metrics scalar_mix/<task>/layer_<j>, scalar_mix/<task>/gamma
"""
from __future__ import annotations

from deepen_run.figures import plt
from deepen_run.methods.hire.report import heatmap


def weights(model) -> dict[str, list[float]]:
    return {t: [float(w) for w in mix.weights().detach().cpu()] for t, mix in model.mix.items()}


def record(model, ctx) -> None:
    if not ctx.accelerator.is_main_process:
        return
    w = weights(model)
    gamma = {t: float(mix.gamma.detach()) for t, mix in model.mix.items()}
    cols = [f"layer_{c}" for c in model.layer_labels]
    ctx.tracker.log_csv([{"task": t, **{c: round(x, 6) for c, x in zip(cols, row)}, "gamma": round(gamma[t], 6)}
                         for t, row in w.items()], "scalar_mix/weights.csv")
    fig = heatmap(list(w.values()), list(w), model.layer_labels, "scalar mix weights softmax(s) per task", "task",
                  model.labels)
    ctx.tracker.log_figure(fig, "scalar_mix/weights.png")
    plt.close(fig)
    ctx.tracker.log_metrics({f"scalar_mix/{t}/{nm}": x for t, row in w.items() for nm, x in zip(model.layer_names, row)}
                            | {f"scalar_mix/{t}/gamma": g for t, g in gamma.items()}, 0)
