"""deepen-predict's inputs and the model card (deepen_run/serve/table.py, card.py): every GLUE file
layout a user hands it (CoLA's headerless dev.tsv and its test.tsv with a header, a file of plain
sentences, a header behind a byte-order mark), bad bytes and bad indexes as one-line errors, and the
card's command for a pair task. Real GLUE files; no model needed."""
import io
from pathlib import Path

import pytest

from conftest import make_cfg
from deepen_run.data.glue import TASKS
from deepen_run.errors import UserError
from deepen_run.serve import card, table


def test_every_cola_layout_reads_its_sentences(glue_dir, tmp_path):
    cola = Path(glue_dir) / "CoLA"
    idx, texts = table.read_tsv(cola / "dev.tsv", TASKS["cola"])  # no header, sentence in column 4
    assert texts[0] == "The sailors rode the breeze clear of the rocks." and idx[:2] == [0, 1]
    idx, texts = table.read_tsv(cola / "test.tsv", TASKS["cola"])  # header `index sentence`
    assert texts[0] == "Bill whistled past the house." and idx[:2] == [0, 1] and len(texts) == 1063
    plain = tmp_path / "mine.txt"
    plain.write_text("The sailors rode the breeze.\nHim saw she.\n")
    assert table.read_tsv(plain, TASKS["cola"]) == ([0, 1], ["The sailors rode the breeze.", "Him saw she."])


def test_a_byte_order_mark_is_not_part_of_the_header(tmp_path):
    f = tmp_path / "bom.tsv"
    f.write_bytes("\ufeffsentence\tlabel\na gorgeous, witty film\t1\ndull and long\t0\n".encode())
    assert table.read_tsv(f, TASKS["sst2"]) == ([0, 1], ["a gorgeous, witty film", "dull and long"])
    assert table.read_stdin(io.BytesIO("\ufeffone\ntwo\tthree\n".encode())) == ["one", ("two", "three")]
    # Lines end at \n, \r\n or \r only: a form feed or U+2028 inside a sentence keeps it one input.
    assert table.read_stdin(io.BytesIO("a\u2028b\nform\x0cfeed\r\nx\n".encode())) == ["a\u2028b", "form\x0cfeed", "x"]


def test_bad_bytes_indexes_and_out_paths_are_one_line(tmp_path):
    latin = tmp_path / "latin1.txt"
    latin.write_bytes(b"caf\xe9\n")
    with pytest.raises(UserError, match="byte 3 is not UTF-8"):
        table.read_tsv(latin, TASKS["sst2"])
    with pytest.raises(UserError, match="stdin: byte 3 is not UTF-8"):
        table.read_stdin(io.BytesIO(b"caf\xe9\n"))
    idx = tmp_path / "idx.tsv"
    idx.write_text("index\tsentence\nx\tfine\n")
    with pytest.raises(UserError, match="line 2: index 'x' is not a whole number"):
        table.read_tsv(idx, TASKS["sst2"])
    with pytest.raises(UserError, match="is a folder; name a file"):
        table.check_out(tmp_path)
    with pytest.raises(UserError, match="is a file, not a folder"):
        table.check_out(latin / "out.tsv")
    table.check_out(tmp_path / "new" / "out.tsv")  # a folder to be made: fine


def test_the_cards_command_fits_the_task():
    info = {"backbone": "tiny", "method": "baseline", "run_id": "r"}
    mrpc = card.text(make_cfg("backbone=tiny", "task=mrpc", "data.max_eval_samples=64"), info | {"tasks": ["mrpc"]},
                     None, "x")
    assert '`deepen-predict --run FOLDER --pair "a sentence" "another"`' in mrpc
    assert "On a seeded 64 examples of each dev set" in mrpc and "| data.max_eval_samples | 64 |" in mrpc
    multi = card.text(make_cfg("backbone=tiny", "task=sst2"), info | {"tasks": ["sst2", "mrpc"]}, None, "x")
    assert '`deepen-predict --run FOLDER --task sst2 "a sentence"`' in multi and "On a seeded" not in multi


def test_register_refuses_a_row_whose_models_are_of_several_tasks():
    from deepen_run.report.register import best_run

    runs = [{"run_id": "a", "tags": {"model_id": "m-a", "task": "cola"}, "metrics": {"eval/score": 0.0}},
            {"run_id": "b", "tags": {"model_id": "m-b", "task": "stsb"}, "metrics": {"eval/score": -0.12}}]
    with pytest.raises(UserError, match=r"row 2 holds models of 2 tasks \(cola, stsb\).*--tag task="):
        best_run(runs, {"id": 2, "run_ids": ["a", "b"]})
    assert best_run(runs, {"id": 1, "run_ids": ["b"]})["run_id"] == "b"
