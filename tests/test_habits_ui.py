"""What the UI shows reads true: HIRE's importance colours on a fixed scale anchored at uniform."""
import numpy as np

from deepen_run.methods.hire.report import heatmap


def colours(values):
    fig = heatmap(values, [f"r{i}" for i in range(len(values))], [str(j) for j in range(len(values[0]))], "t", "task")
    im = fig.axes[0].images[0]
    return im.norm(np.asarray(values, dtype=float)), fig


def test_near_uniform_importances_look_near_uniform(tmp_path):
    near = [[0.208, 0.196, 0.196, 0.2, 0.2], [0.195, 0.205, 0.2, 0.2, 0.2]]
    c, fig = colours(near)
    assert np.all(np.abs(c - 0.5) < 0.05)  # 0.5 = white (uniform); 0 / 1 = full blue / red
    fig.savefig(tmp_path / "near.png")
    strong, _ = colours([[0.6, 0.1, 0.1, 0.1, 0.1]])
    assert strong[0, 0] >= 1.0 and abs(strong[0, 1] - 0.25) < 1e-6  # 2/J saturates, 0 is full blue
    one, _ = colours([[1.0]])  # a single layer offered: uniform by construction
    assert abs(one[0, 0] - 0.5) < 1e-9



def test_the_title_fits_with_a_single_layer_read():
    """With one or two layers read the figure was narrower than its title, cut off at both ends."""
    title = "HIRE mean layer importance on dev (softmax)"
    for cols in (["5"], ["5", "6"], [str(j) for j in range(7)]):
        fig = heatmap([[1 / len(cols)] * len(cols)] * 2, ["sst2", "rte"], cols, title, "task")
        fig.canvas.draw()
        box = fig.axes[0].title.get_window_extent(fig.canvas.get_renderer())
        assert box.x0 >= 0 and box.x1 <= fig.bbox.x1, (cols, box, fig.bbox)

TABLE = """| # | backbone | method | setup | settings | RTE | Avg | Δ Avg vs baseline [95% CI] | n | step (s) |
|---|---|---|---|---|---|---|---|---|---|
| 1 | tiny | baseline | single-task | - | 51.8 ± 0.3 | 51.8 ± 0.3 | (baseline) | 2 | 0.1 |
| 2 | tiny | hire | single-task | gru_layers=1 | 42.2 ± 2.2 | 42.2 ± 2.2 | -9.6 [-20.1, 0.9] (n=2) | 2 | 0.2 |
| 3 | tiny | hire | single-task | gru_layers=2 | 50.0 ± 8.8 | 50.0 ± 8.8 | -1.8 (n=1) | 1 | 0.2 |

Cells: dev score x100.
"""


def test_the_parent_note_starts_with_every_row_in_one_short_paragraph():
    from deepen_run.sweep import summary

    from deepen_run.run.summary import DEFAULT_STORE

    info = {"sweep_id": "S", "n_jobs": 6, "params": {}, "uri": DEFAULT_STORE, "experiment": "deepen-run"}
    note = summary.note(info, [], TABLE, "FINISHED")
    first = note.split("\n\n")[0]
    assert "\n" not in first and first.startswith("**Sweep S** (FINISHED): 0 of 6 jobs finished")
    assert first.endswith("Avg (dev x100, mean ± std over seeds): **#1** baseline: **51.8 ± 0.3** (baseline) (n 2) · "
                          "**#2** hire gru_layers=1: **42.2 ± 2.2**, Δ -9.6 [-20.1, 0.9] (n 2) · "
                          "**#3** hire gru_layers=2: **50.0 ± 8.8**, Δ -1.8 (n 1)")
    assert TABLE.strip() in note  # the whole table and its footnotes after "Show more"


def test_a_note_too_long_for_a_tag_points_to_the_whole_table_instead_of_losing_rows(tmp_path):
    """MLflow stores a tag of 8,000 characters at most: a sweep of many rows keeps its note whole by
    naming where the table is, rather than a table cut mid-row (was: 5,000 characters, the last rows
    and the command lost unsaid)."""
    from deepen_run.run.summary import DEFAULT_STORE
    from deepen_run.sweep import summary
    from deepen_run.tracking.store import TAG_LIMIT, Tracker

    head, row = TABLE.splitlines()[:2], TABLE.splitlines()[3]
    big = "\n".join(head + [row.replace("| 2 |", f"| {i} |", 1) for i in range(2, 120)]) + "\n"
    info = {"sweep_id": "S", "n_jobs": 120, "params": {"sweep.overrides": "seed=1,2"}, "uri": DEFAULT_STORE,
            "experiment": "deepen-run"}
    assert TAG_LIMIT == 8000
    note = summary.note(info, [], big, "FINISHED")
    assert len(note) <= TAG_LIMIT and "report/results.md" in note and "deepen-report --sweep-id S" in note
    assert note.endswith("Command: `deepen-run -m seed=1,2`"), note[-200:]
    assert summary.note(info, [], TABLE, "FINISHED").count("| 3 | tiny |") == 1  # a short table stays whole
    tracker = Tracker(f"sqlite:///{tmp_path}/m.db", "notes")
    tracker.start("long", {})
    tracker.set_tags({summary.NOTE: "x" * 7000})
    assert len(tracker.client.get_run(tracker.run_id).data.tags[summary.NOTE]) == 7000
    tracker.end("FINISHED")


def test_the_sampling_schedule_ticks_whole_epochs():
    """Two epochs were ticked 0.75, 1.00, 1.25, ...: an epoch is a whole number."""
    from deepen_run.figures import sampling_plot

    for n in (1, 2, 3):  # one epoch: a short run's schedule
        fig = sampling_plot([{"epoch": e, "rte": 0.5, "mrpc": 0.5} for e in range(1, n + 1)], ["rte", "mrpc"])
        fig.canvas.draw()
        ticks = [t for t in fig.axes[0].get_xticks() if 0.5 <= t <= n + 0.5]
        assert ticks == [float(e) for e in range(1, n + 1)], (n, ticks)


def test_the_layer_axis_explains_the_copy_this_model_has():
    """The axis said "3' = a copy of 3" whichever layer was copied."""
    fig = heatmap([[0.25] * 4], ["rte"], ["1", "5", "5'", "6"], "t", "task")
    assert fig.axes[0].get_xlabel() == "backbone layer (0 = embeddings; 5' = a copy of 5)"
