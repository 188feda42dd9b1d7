"""GLUE test-server files (predict=true): the rows the server expects, and a missing test file
rejected before anything loads. The end-to-end submission through a tracking server is in
tests/test_tracking_server.py."""
import os
from pathlib import Path

import pytest

from conftest import make_cfg
from deepen_run.run import submission
from deepen_run.errors import UserError
from deepen_run.data.glue import TASKS
from deepen_run.run.preflight import check


def test_submission_rows_use_glue_label_strings():
    assert submission.to_tsv(TASKS["rte"], [5, 7], [0, 1]) == "index\tprediction\n5\tentailment\n7\tnot_entailment\n"
    assert submission.to_tsv(TASKS["mnli"], [0], [2]).endswith("0\tcontradiction\n")
    assert submission.to_tsv(TASKS["qnli"], [0], [1]).endswith("0\tnot_entailment\n")
    assert submission.to_tsv(TASKS["wnli"], [0], [1]).endswith("0\t1\n")
    assert submission.to_tsv(TASKS["stsb"], [0, 1, 2], [-0.4, 2.34567, 5.2]).splitlines()[1:] == \
        ["0\t0.000", "1\t2.346", "2\t5.000"]


def test_predict_without_a_test_file_fails_before_loading(tmp_path, glue_dir):
    (tmp_path / "RTE").mkdir()
    for f in ("train.tsv", "dev.tsv"):
        os.symlink(Path(glue_dir) / "RTE" / f, tmp_path / "RTE" / f)
    cfg = make_cfg("task=rte", "backbone=tiny", "predict=true", f"data.glue_dir={tmp_path}")
    with pytest.raises(UserError, match=r"predict=true: .*RTE/test.tsv is missing"):
        check(cfg)
    check(make_cfg("task=rte", "backbone=tiny", f"data.glue_dir={tmp_path}"))  # fine without predict
