"""data.group_by_length: transformers' LengthGroupedSampler behind make_loader, and an exact resume."""
from __future__ import annotations

import itertools
import random

import datasets

from conftest import make_cfg
from deepen_run.model import backbone as bb
from deepen_run.run.checkpoint import TaskStream
from deepen_run.data.loaders import make_loader


def toy_set(n: int = 400, seed: int = 0) -> datasets.Dataset:
    rng = random.Random(seed)
    ids = [[101] + [rng.randrange(1000, 2000) for _ in range(rng.randrange(1, 60))] + [102] for _ in range(n)]
    return datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids],
                                       "label": [i % 2 for i in range(n)]})


def padding(loader) -> int:
    return sum(int((b["attention_mask"] == 0).sum()) for b in loader)


def test_grouped_batches_waste_less_padding_and_cover_every_example():
    tok, ds = bb.load_tokenizer(make_cfg("backbone=tiny").backbone), toy_set()
    grouped = make_loader(ds, tok, 8, True, seed=1, group_by_length=True)
    plain = make_loader(ds, tok, 8, True, seed=1)
    assert padding(grouped) < padding(plain) / 3
    seen = sorted(int(x) for b in grouped for x in b["input_ids"][:, 1])
    assert seen == sorted(row[1] for row in ds["input_ids"])


def test_resume_continues_the_same_grouped_order_across_epochs():
    tok, ds = bb.load_tokenizer(make_cfg("backbone=tiny").backbone), toy_set(100)

    def stream(consumed: int):
        return iter(TaskStream(make_loader(ds, tok, 8, True, seed=3, group_by_length=True), 3, consumed))

    whole = [b["input_ids"].tolist() for b in itertools.islice(stream(0), 30)]  # 13 batches an epoch
    resumed = [b["input_ids"].tolist() for b in itertools.islice(stream(17), 13)]
    assert resumed == whole[17:30]
    assert whole[:13] != whole[13:26]  # the next epoch is reshuffled
