"""deepen-report's table from run records (no store): rows, means and spreads, option labels.
The report of a real sweep read back from MLflow is in tests/test_sweeps.py."""
import pytest

from deepen_run import report


def _run(task, seed, metrics, **tags):
    return {"run_id": f"{task}{seed}", "status": "FINISHED", "params": {"method.pooling": "cls"}, "metrics": metrics,
            "tags": {"backbone": "minilm", "method": "baseline", "schedule": "sqrt", "task": task, "seed": str(seed)} | tags}


def test_report_rows_with_only_some_tasks():
    runs = [_run("rte", 1, {"eval/rte/accuracy": 0.60}), _run("rte", 2, {"eval/rte/accuracy": 0.70}),
            _run("mrpc", 1, {"eval/mrpc/accuracy": 0.80, "eval/mrpc/f1": 0.90}),
            _run("mrpc+stsb", 1, {"eval/mrpc/accuracy": 0.7, "eval/mrpc/f1": 0.8, "eval/stsb/pearson": 0.5,
                                  "eval/stsb/spearmanr": 0.7}),
            _run("rte", 3, {"eval/rte/accuracy": 0.1}) | {"status": "FAILED"},
            _run("rte", 4, {}, sweep_role="parent")]
    table = report.build(runs)
    assert table["tasks"] == ["mrpc", "stsb", "rte"]
    single, multi = table["rows"]  # sorted: schedule "-" first
    assert (single["schedule"], single["options"], single["n"]) == ("-", "-", 2)  # no option varies
    assert single["rte"]["mean"] == pytest.approx(65.0) and single["rte"]["std"] == pytest.approx(7.0711, abs=1e-3)
    assert single["mrpc"] == {"mean": pytest.approx(85.0), "std": None, "n": 1} and single["stsb"] is None
    # Average over the row's tasks; its spread only over seeds that have them all (seed 1 only here).
    assert single["avg"] == {"mean": pytest.approx(75.0), "std": None, "n": 1}
    assert multi["schedule"] == "sqrt" and multi["stsb"]["mean"] == pytest.approx(60.0) and multi["rte"] is None
    md = report.to_markdown(table)
    assert "| minilm | baseline | - | - | 85.0 (n=1) | - | 65.0 ± 7.1 | 75.0 | 2 |" in md


def test_report_names_only_the_options_that_vary():
    def hire(k, seed, acc):
        r = _run("rte", seed, {"eval/rte/accuracy": acc}, method="hire")
        return r | {"params": {"method.gru_layers": str(k), "method.pool": "cls"}}

    runs = [hire(1, 1, 0.6), hire(1, 2, 0.62), hire(3, 1, 0.7), _run("rte", 1, {"eval/rte/accuracy": 0.5})]
    rows = {(r["method"], r["options"]): r for r in report.build(runs)["rows"]}
    assert set(rows) == {("baseline", "-"), ("hire", "gru_layers=1"), ("hire", "gru_layers=3")}
    assert rows["hire", "gru_layers=1"]["n"] == 2 and rows["hire", "gru_layers=3"]["rte"]["mean"] == pytest.approx(70.0)
