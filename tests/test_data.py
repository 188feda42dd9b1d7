"""GLUE TSV reading: row counts, label ids as on the Hub, and errors that name file and line."""
import pytest

from deepen_run.data.loaders import check_glue_dir, read_tsv
from deepen_run.errors import UserError
from deepen_run.data.glue import TASKS
from pathlib import Path

# Rows and label counts from shared/glue/PROVENANCE.md (the published GLUE splits).
EXPECTED = {
    ("cola", "train"): (8551, {1: 6023, 0: 2528}), ("cola", "dev"): (1043, {1: 721, 0: 322}),
    ("sst2", "train"): (67349, {1: 37569, 0: 29780}), ("sst2", "dev"): (872, {1: 444, 0: 428}),
    ("mrpc", "train"): (3668, {1: 2474, 0: 1194}), ("mrpc", "dev"): (408, {1: 279, 0: 129}),
    ("rte", "train"): (2490, {0: 1249, 1: 1241}), ("rte", "dev"): (277, {0: 146, 1: 131}),
    ("wnli", "train"): (635, {1: 312, 0: 323}), ("wnli", "dev"): (71, {1: 31, 0: 40}),
    ("qnli", "dev"): (5463, {0: 2702, 1: 2761}),
}


@pytest.mark.parametrize("task,stem", list(EXPECTED))
def test_rows_and_label_ids(glue_dir, task, stem):
    spec = TASKS[task]
    cols = read_tsv(Path(glue_dir, spec.folder, f"{stem}.tsv"), spec, labelled=True)
    n, dist = EXPECTED[task, stem]
    assert len(cols["label"]) == n
    assert {k: cols["label"].count(k) for k in dist} == dist
    assert all(isinstance(t, str) and t for t in cols["text_a"])


def test_stsb_scores_and_pairs(glue_dir):
    cols = read_tsv(Path(glue_dir, "STS-B", "dev.tsv"), TASKS["stsb"], labelled=True)
    assert len(cols["label"]) == 1500 and all(0.0 <= s <= 5.0 for s in cols["label"])
    assert cols["text_a"][0] == "A man with a hard hat is dancing."
    assert cols["text_b"][0] == "A man wearing a hard hat is dancing."


def test_mrpc_bom_header_and_quotes(glue_dir):
    cols = read_tsv(Path(glue_dir, "MRPC", "dev.tsv"), TASKS["mrpc"], labelled=True)
    # Quoting is off: a sentence that starts with a bare quote keeps it.
    assert cols["text_b"][0].startswith('" The foodservice pie business')


def test_test_split_is_unlabelled(glue_dir):
    cols = read_tsv(Path(glue_dir, "SST-2", "test.tsv"), TASKS["sst2"], labelled=False)
    assert len(cols["idx"]) == 1821 and set(cols["label"]) == {-1}
    assert cols["idx"][:3] == [0, 1, 2]


def test_wrong_column_count_names_file_and_line(tmp_path):
    f = tmp_path / "RTE" / "train.tsv"
    f.parent.mkdir()
    f.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tonly two\n")
    with pytest.raises(UserError, match=r"train\.tsv:3: expected 4 tab-separated columns, got 2"):
        read_tsv(f, TASKS["rte"], labelled=True)


def test_unknown_label_names_file_and_line(tmp_path):
    f = tmp_path / "train.tsv"
    f.write_text("sentence\tlabel\ngood\t1\nbad\t7\n")
    with pytest.raises(UserError, match=r"train\.tsv:3: label '7'"):
        read_tsv(f, TASKS["sst2"], labelled=True)


def test_empty_split(tmp_path):
    f = tmp_path / "dev.tsv"
    f.write_text("sentence\tlabel\n")
    with pytest.raises(UserError, match="empty split"):
        read_tsv(f, TASKS["sst2"], labelled=True)


def test_missing_folder_and_files(tmp_path, glue_dir):
    with pytest.raises(UserError, match="does not exist"):
        check_glue_dir(str(tmp_path / "nope"), [TASKS["sst2"]])
    with pytest.raises(UserError, match=r"task qnli: .*QNLI/train\.tsv is missing"):
        check_glue_dir(glue_dir, [TASKS["qnli"]])


def test_a_cached_split_is_read_back_whole_and_an_edited_file_is_tokenized_again(tmp_path, glue_dir):
    """A cache hit gives back the rows tokenized the first time (make bench times the parse it saves);
    an edited file misses the cache, even one edited in place with its size and mtime kept."""
    import os
    import shutil

    from omegaconf import OmegaConf

    from conftest import make_cfg
    from deepen_run.data.loaders import load_task
    from deepen_run.model import backbone as bb

    shutil.copytree(Path(glue_dir, "RTE"), tmp_path / "glue" / "RTE")
    cfg = make_cfg("backbone=tiny", f"data.glue_dir={tmp_path / 'glue'}", f"data.cache_dir={tmp_path / 'cache'}")
    tok = bb.load_tokenizer(cfg.backbone)

    def load(**data):
        return load_task(TASKS["rte"], OmegaConf.merge(cfg.data, data), tok, seed=1)

    first, again = load(), load()
    assert again.train.to_dict() == first.train.to_dict() and len(first.train) == 2490
    assert again.train.cache_files == first.train.cache_files  # the very file tokenized the first time
    cut, other_seed = load(max_train_samples=100), load_task(TASKS["rte"], OmegaConf.merge(cfg.data, {
        "max_train_samples": 100}), tok, seed=2)
    assert len(cut.train) == 100 and cut.train["idx"] != other_seed.train["idx"]  # a subset's seed is in the key

    dev = tmp_path / "glue" / "RTE" / "dev.tsv"
    lines, st = dev.read_text().splitlines(keepends=True), dev.stat()
    dev.write_text("".join([lines[0], lines[2], lines[1], *lines[3:]]))  # two examples swapped: same size
    os.utime(dev, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime, as `cp -p` or rsync leave it
    assert load().dev["rte"]["idx"][:3] == [1, 0, 2]
    dev.write_text("".join(lines[:11]))  # the header and 10 examples
    assert len(load().dev["rte"]) == 10


def test_max_eval_samples_scores_a_seeded_random_subset_the_same_for_every_method(tmp_path, glue_dir):
    """docs/reliability.md, Known limits: data.max_eval_samples=N scores a seeded random N of each dev
    set, not its first N: every method of one seed sees the same rows, another seed other rows."""
    from conftest import make_cfg
    from deepen_run.data.loaders import load_task
    from deepen_run.model import backbone as bb

    def dev_rows(method: str, seed: int, n: int | None = 20) -> list[int]:
        cfg = make_cfg("backbone=tiny", f"method={method}", "task=rte", f"seed={seed}", f"data.glue_dir={glue_dir}",
                       f"data.cache_dir={tmp_path / 'cache'}", f"data.max_eval_samples={'null' if n is None else n}")
        tok = bb.load_tokenizer(cfg.backbone)
        return load_task(TASKS["rte"], cfg.data, tok, cfg.seed, with_train=False).dev["rte"]["idx"]

    baseline, hire, other_seed = dev_rows("baseline", 1), dev_rows("hire", 1), dev_rows("baseline", 2)
    assert len(baseline) == 20 and baseline == hire
    assert set(other_seed) != set(baseline)
    assert set(baseline) != set(dev_rows("baseline", 1, None)[:20])  # not the file's first 20 rows
