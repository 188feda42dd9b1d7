"""GLUE's official metrics as an `evaluate` module that ships in the package.

The Hub's `glue` metric needs the network; this one computes the same numbers with
scikit-learn and scipy. Load it with deepen_run.metrics.load(task).
"""
import datasets
import evaluate
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

METRICS = {
    "cola": ("matthews_correlation",), "stsb": ("pearson", "spearmanr"),
    "mrpc": ("accuracy", "f1"), "qqp": ("accuracy", "f1"),
}
CONFIGS = ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "mnli-m", "mnli-mm", "qnli", "rte", "wnli"]


class GlueMetric(evaluate.Metric):
    def _info(self):
        if self.config_name not in CONFIGS:
            raise KeyError(f"unknown GLUE task {self.config_name!r}; one of {CONFIGS}")
        kind = "float32" if self.config_name == "stsb" else "int64"
        return evaluate.MetricInfo(
            description="GLUE official metrics (offline)", citation="Wang et al., 2019, GLUE", inputs_description="predictions, references",
            features=datasets.Features({"predictions": datasets.Value(kind), "references": datasets.Value(kind)}))

    def _compute(self, predictions, references):
        names = METRICS.get(self.config_name, ("accuracy",))
        out = {}
        for name in names:
            if name == "accuracy":
                out[name] = float(accuracy_score(references, predictions))
            elif name == "f1":
                out[name] = float(f1_score(references, predictions))
            elif name == "matthews_correlation":
                out[name] = float(matthews_corrcoef(references, predictions))
            elif name == "pearson":
                out[name] = float(pearsonr(predictions, references)[0])
            elif name == "spearmanr":
                out[name] = float(spearmanr(predictions, references)[0])
        return out
