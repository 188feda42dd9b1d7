"""GLUE's official metrics as an `evaluate` module that ships in the package.

The Hub's `glue` metric needs the network; this one computes the same numbers with
scikit-learn and scipy. Load it with deepen_run.data.metrics.load(task). Which metrics a task has is
its TaskSpec's (deepen_run/data/glue.py), the one place that says so.
"""
from types import MappingProxyType

import datasets
import evaluate
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from deepen_run.data.glue import TASKS

# config name (a task, or one of its eval names: mnli-m, mnli-mm) -> (its metrics, is it regression)
METRICS = MappingProxyType({name: (spec.metrics, spec.is_regression) for spec in TASKS.values()
                            for name in (spec.name, *spec.eval_names)})


class GlueMetric(evaluate.Metric):
    def _info(self):
        if self.config_name not in METRICS:
            raise KeyError(f"unknown GLUE task {self.config_name!r}; one of {list(METRICS)}")
        kind = "float32" if METRICS[self.config_name][1] else "int64"
        return evaluate.MetricInfo(
            description="GLUE official metrics (offline)", citation="Wang et al., 2019, GLUE", inputs_description="predictions, references",
            features=datasets.Features({"predictions": datasets.Value(kind), "references": datasets.Value(kind)}))

    def _compute(self, predictions, references):
        names = METRICS[self.config_name][0]
        out = {}
        for name in names:
            if name == "accuracy":
                out[name] = float(accuracy_score(references, predictions))
            elif name == "f1":
                out[name] = float(f1_score(references, predictions))
            elif name == "matthews_correlation":
                out[name] = float(matthews_corrcoef(references, predictions))
            elif len(predictions) < 2:  # a correlation of one pair is undefined (scipy raises): NaN, as
                out[name] = float("nan")  # for a constant prediction, counted as 0 in eval/score
            elif name == "pearson":
                out[name] = float(pearsonr(predictions, references)[0])
            elif name == "spearmanr":
                out[name] = float(spearmanr(predictions, references)[0])
        return out
