"""An undefined metric (NaN: a constant STS-B prediction) never drops its task from eval/score: it
counts as 0, the run says so once on the console and in an `undefined_metrics` tag."""
import math

from mlflow.tracking import MlflowClient

from deepen_run.data import metrics
from deepen_run.run.evaluation import eval_metrics, warn_undefined
from deepen_run.tracking.store import Tracker

REFS = [0.0, 1.5, 3.0, 4.5, 5.0, 2.0]
TASK_OF = {"stsb": "stsb", "mrpc": "mrpc"}


def real_results(stsb_preds):
    """The shipped GLUE metric on a constant STS-B prediction and an imperfect MRPC one."""
    return {"stsb": metrics.compute("stsb", stsb_preds, REFS),
            "mrpc": metrics.compute("mrpc", [1, 0, 1, 1, 0, 0], [1, 0, 0, 1, 1, 0])}


def test_constant_stsb_prediction_counts_as_zero_not_dropped():
    res = real_results([2.5] * len(REFS))
    assert math.isnan(res["stsb"]["pearson"]) and math.isnan(res["stsb"]["spearmanr"])
    mrpc = (res["mrpc"]["accuracy"] + res["mrpc"]["f1"]) / 2
    score = metrics.glue_score(res, TASK_OF)
    assert score == mrpc / 2  # STS-B weighs in with 0, MRPC's score alone would be `mrpc`
    assert metrics.undefined(res) == ["stsb/pearson", "stsb/spearmanr"]


def test_a_dev_set_of_one_stsb_pair_is_undefined_not_a_crash():
    # data.max_eval_samples=1: scipy raises on a correlation of one pair, after the whole training
    res = metrics.compute("stsb", [2.5], [3.0])
    assert math.isnan(res["pearson"]) and math.isnan(res["spearmanr"])


def test_one_undefined_metric_of_two_halves_its_task():
    res = {"stsb": {"pearson": float("nan"), "spearmanr": 0.8}}
    assert metrics.glue_score(res, {"stsb": "stsb"}) == 0.4
    assert metrics.undefined(res) == ["stsb/pearson"]


def test_defined_metrics_unchanged_and_mnli_halves_form_one_task():
    res = real_results([0.1, 1.4, 3.3, 4.4, 4.9, 2.2])
    assert metrics.undefined(res) == []
    stsb = (res["stsb"]["pearson"] + res["stsb"]["spearmanr"]) / 2
    mrpc = (res["mrpc"]["accuracy"] + res["mrpc"]["f1"]) / 2
    assert math.isclose(metrics.glue_score(res, TASK_OF), (stsb + mrpc) / 2)
    mnli = {"mnli-m": {"accuracy": 0.6}, "mnli-mm": {"accuracy": float("nan")}, "rte": {"accuracy": 0.5}}
    assert math.isclose(metrics.glue_score(mnli, {"mnli-m": "mnli", "mnli-mm": "mnli", "rte": "rte"}), (0.3 + 0.5) / 2)


def test_eval_metrics_keeps_the_nan_metric_and_a_finite_score():
    flat = eval_metrics(real_results([2.5] * len(REFS)), TASK_OF)
    assert math.isnan(flat["eval/stsb/pearson"])  # the metric itself is logged as what it is
    assert math.isfinite(flat["eval/score"]) and flat["eval/score"] > 0


class Console:
    def __init__(self):
        self.lines = []

    def print(self, line):
        self.lines.append(line)


def test_warning_once_and_tag_in_the_mlflow_store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri, "undefined")
    tracker.check()
    tracker.start("run", {})
    seen, console = [], Console()
    for _ in range(2):  # two evaluations, the same metric undefined in both
        warn_undefined(real_results([2.5] * len(REFS)), seen, tracker, console)
    tracker.end("FINISHED")
    assert len(console.lines) == 1 and console.lines[0].startswith("deepen-run: warning: stsb/pearson")
    tags = MlflowClient(uri).get_run(tracker.run_id).data.tags
    assert tags["undefined_metrics"] == "stsb/pearson,stsb/spearmanr"
