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
