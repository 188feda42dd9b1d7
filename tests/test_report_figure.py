"""The contrasts figure on a tiny hand-made table: labels say what tells two rows apart (a plan's
member id first), and one contrast far wider than the rest no longer flattens the others."""
from deepen_run.report.figure import contrast_label, contrasts_plot


def row(i: int, setup: str, method: str = "pals", settings: str = "train.max_steps=1400") -> dict:
    return {"id": i, "setup": setup, "method": method, "settings": settings}


def reading(a: int, b: int, task: str, mean: float, half: float, member: str | None = None) -> dict:
    return {"a": a, "b": b, "task": task, "mean": mean, "lo": mean - half, "hi": mean + half} | (
        {"member": member} if member else {})


def test_rows_that_differ_in_their_schedule_are_labelled_by_it():
    a, b = row(1, "multi-task sst2+stsb, annealed"), row(2, "multi-task sst2+stsb, proportional")
    assert contrast_label(a, b) == "1: annealed  -  2: proportional"
    single = row(3, "single-task", "baseline", "-")
    assert contrast_label(a, single) == "1: pals multi-task sst2+stsb annealed train.max_steps=1400  -  3: baseline single-task"


def test_one_wide_contrast_is_written_at_the_edge_and_the_others_keep_their_scale():
    rows = [row(i, "single-task", settings=f"x={i}") for i in range(1, 7)]
    cs = [reading(1, 2, "stsb", 79.3, 6.0, "F1"), reading(1, 2, "avg", 40.5, 3.0, "F1")]
    cs += [reading(a, a + 1, t, m, 0.5, f"F{a}") for a, m in ((2, 1.6), (3, -2.5), (4, 0.3), (5, 0.8))
           for t in ("stsb", "avg")]
    fig = contrasts_plot({"rows": rows, "contrasts": cs})
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    assert -5 < lo < -3 and 3 < hi < 5  # 1.3 x the widest of the others (3.0), not 85
    assert sorted(t.get_text() for t in ax.texts) == ["+40.5 >", "+79.3 >"]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0].startswith("F1  1: x=1  -  2: x=2") and labels[3].startswith("F4  4: x=4")
    # all within reach: the axis is matplotlib's own, nothing written at an edge
    fig = contrasts_plot({"rows": rows, "contrasts": cs[2:]})
    assert len(fig.axes[0].texts) == 0 and fig.axes[0].get_xlim()[1] < 3.0
