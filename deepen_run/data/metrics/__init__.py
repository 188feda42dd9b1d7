"""GLUE metrics through the shipped evaluate module, and the GLUE average."""
from __future__ import annotations

import math
import threading
from functools import lru_cache
from pathlib import Path

MODULE = str(Path(__file__).with_name("glue_metric.py"))


@lru_cache(maxsize=None)
def load(eval_name: str):
    import evaluate  # seconds to import: only when a run evaluates, not for every start

    return evaluate.load(MODULE, config_name=eval_name)


def preload() -> threading.Thread:
    """Import what the metrics need (evaluate, scipy.stats, scikit-learn: about 1 s) in the
    background, once training runs: the steps spend their time in torch kernels that release the
    GIL, so the imports cost the run almost nothing and the first evaluation finds them done.
    The run joins the thread before each evaluation (train.fit): `evaluate.load` calls
    importlib.invalidate_caches, which iterates sys.path_importer_cache, and an import running in
    this thread adds to it ("dictionary changed size during iteration" in a 2-step sweep job in CI).
    So no import is left running into an evaluation or the interpreter's shutdown either."""
    def imports():
        try:
            import evaluate  # noqa: F401
            import scipy.stats  # noqa: F401
            import sklearn.metrics  # noqa: F401
        except BaseException:  # noqa: BLE001 (a head start only: `load` imports again and reports)
            pass

    t = threading.Thread(target=imports, name="metric-imports")
    t.start()
    return t


def compute(eval_name: str, predictions, references) -> dict[str, float]:
    return load(eval_name).compute(predictions=predictions, references=references)


# An undefined metric (NaN: e.g. Pearson/Spearman of a constant prediction) counts as the worst value
# a useless model gets: a correlation of 0 (MCC, Pearson, Spearman), or 0 accuracy/F1. Dropping it
# instead would let a task that collapsed vanish from eval/score and the other tasks speak for it.
UNDEFINED_VALUE = 0.0


def undefined(results: dict[str, dict[str, float]]) -> list[str]:
    """`<eval name>/<metric>` of every undefined (non-finite) metric, e.g. ['stsb/pearson']."""
    return [f"{name}/{m}" for name, metrics in results.items() for m, v in metrics.items() if not math.isfinite(v)]


def glue_score(results: dict[str, dict[str, float]], task_of: dict[str, str]) -> float:
    """Mean over tasks of each task's mean metric (MNLI-m and -mm together form MNLI's); an undefined
    metric counts as UNDEFINED_VALUE, so every task always weighs in."""
    per_task: dict[str, list[float]] = {}
    for name, metrics in results.items():
        vals = [v if math.isfinite(v) else UNDEFINED_VALUE for v in metrics.values()]
        per_task.setdefault(task_of[name], []).extend(vals)
    means = [sum(v) / len(v) for v in per_task.values() if v]
    return sum(means) / len(means) if means else float("nan")
