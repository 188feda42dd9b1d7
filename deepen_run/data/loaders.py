"""GLUE splits -> tokenized `datasets` -> single-task loaders with dynamic padding.

Two sources give the same columns (text_a, text_b, label, idx) and the Hub's label ids:
a local folder of the original GLUE TSV files (validated row by row, so a bad file is reported
with its line number) or the Hugging Face Hub's nyu-mll/glue.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import datasets
import torch
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding

from deepen_run.errors import UserError
from deepen_run.data.glue import AX, DIAGNOSED_BY, TaskSpec
from deepen_run.data.tsv import check_glue_dir, read_tsv  # noqa: F401 (re-exported)


@dataclass
class TaskData:
    spec: TaskSpec
    train: Optional[datasets.Dataset]
    dev: dict[str, datasets.Dataset]  # eval name (sst2, mnli-m, ...) -> dataset
    test: dict[str, datasets.Dataset]  # submission stem (SST-2, MNLI-m, ...) -> dataset


def _from_tsv(glue_dir: str, spec: TaskSpec, stem: str, labelled: bool) -> datasets.Dataset:
    path = Path(glue_dir) / spec.folder / f"{stem}.tsv"
    feats = {"text_a": datasets.Value("string"), "label": datasets.Value(
        "float32" if spec.is_regression else "int64"), "idx": datasets.Value("int64")}
    if spec.text_b:
        feats["text_b"] = datasets.Value("string")
    return datasets.Dataset.from_dict(read_tsv(path, spec, labelled), features=datasets.Features(feats))


def _from_hub(spec: TaskSpec, split: str) -> datasets.Dataset:
    try:
        ds = datasets.load_dataset("nyu-mll/glue", spec.name, split=split)
    except (ConnectionError, FileNotFoundError, OSError) as e:
        raise UserError(f"GLUE {spec.name} ({split}) is not in the datasets cache and the Hub cannot be "
                        "reached; set DEEPEN_GLUE_DIR or data.glue_dir=<folder of GLUE TSVs>") from e
    ren = {spec.text_a: "text_a"} | ({spec.text_b: "text_b"} if spec.text_b else {})
    return ds.rename_columns(ren)


def load_raw(spec: TaskSpec, glue_dir: Optional[str], stem: str, hub_split: str, labelled=True):
    if glue_dir is None:
        return _from_hub(spec, hub_split)
    return _from_tsv(glue_dir, spec, stem, labelled)


def _subsample(ds: datasets.Dataset, n: Optional[int], seed: int) -> datasets.Dataset:
    # A seeded shuffle before cutting, so a subset of SST-2 is not just its first reviews.
    if n is None or n >= len(ds):
        return ds
    return ds.shuffle(seed=seed).select(range(n))


def train_size(n: int, fraction: Optional[float], cap: Optional[int]) -> int:
    """Examples kept out of n: the fraction first (at least one example), then the cap. The same
    fraction of every task keeps their size ratios, so the sampler's N_i stay meaningful."""
    if fraction is not None:
        n = max(1, round(fraction * n))
    return n if cap is None else min(n, cap)


def tokenizer_key(tokenizer) -> str:
    """What decides the tokens, not where the tokenizer came from: a folder overwritten with another
    tokenizer, another Hub revision or a changed option (lower-casing) tokenizes differently. A fast
    tokenizer's own serialization (vocabulary, normalizer, pre-tokenizer, post-processor, added
    tokens) without its truncation and padding state, which each call sets; else the vocabulary and
    the plain loading options."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = {k: v for k, v in json.loads(backend.to_str()).items() if k not in ("truncation", "padding")}
    else:
        options = {k: v for k, v in tokenizer.init_kwargs.items() if isinstance(v, (bool, int, float, str))
                   and k not in ("name_or_path", "is_local", "local_files_only")}
        state = {"vocab": sorted(tokenizer.get_vocab().items()), "options": options}
    return hashlib.sha1(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()


def split_key(tag: str, source: str, cut: str, tok_key: str, max_len: int) -> str:
    """What one split's tokenized rows are: the file (path and content) or Hub split, the cut
    (fraction, cap and seed of a subset), the tokenizer (tokenizer_key) and the length."""
    return hashlib.sha1(f"{source}|{cut}|{tok_key}|{max_len}|{tag}".encode()).hexdigest()[:16]


def cache_file(cache_dir: str, tag: str, key: str) -> str:
    """Where one split's tokenized rows are cached (key: split_key)."""
    os.makedirs(cache_dir, exist_ok=True)
    return os.path.join(cache_dir, f"{tag}-{key}.arrow")


def tokenize(ds: datasets.Dataset, tokenizer, max_len: int, path: Optional[str], tag: str,
             fingerprint: Optional[str] = None) -> datasets.Dataset:
    """Tokenize once, into the cache file `path` (datasets writes a temporary file and renames it,
    so a reader sees the whole file or none); None: no cache. `fingerprint` names the result for
    datasets (split_key says what it holds; none: a random name, as datasets gives an in-memory
    dataset): left to itself, datasets would hash the function, pickling the whole tokenizer."""
    pair = "text_b" in ds.column_names

    def fn(batch):
        args = (batch["text_a"], batch["text_b"]) if pair else (batch["text_a"],)
        return tokenizer(*args, truncation=True, max_length=max_len)

    drop = [c for c in ds.column_names if c not in ("label", "idx")]
    return ds.map(fn, batched=True, remove_columns=drop, desc=f"tokenize {tag}", cache_file_name=path,
                  new_fingerprint=fingerprint or uuid.uuid4().hex)


CACHED_COLUMNS = ("label", "idx", "input_ids", "attention_mask")


def from_cache(path: str) -> Optional[datasets.Dataset]:
    """A cache file, memory-mapped; a damaged one (a cut or overwritten file: Arrow's IPC header or
    schema unreadable, columns missing) is removed with one warning, and None says: tokenize again.
    Arrow keeps no checksum, so damage inside a data buffer that leaves the structure valid is not
    seen (docs/reliability.md, "Tokenization cache")."""
    try:
        ds = datasets.Dataset.from_file(path)
        ds.data.validate()
        missing = [c for c in CACHED_COLUMNS if c not in ds.column_names]
        if missing:
            raise ValueError(f"no {', '.join(missing)} column")
        return ds
    except Exception as e:  # noqa: BLE001 (pyarrow's ArrowInvalid, OSError, ...: the file is not usable)
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        print(f"deepen-run: warning: the tokenization cache file {path} is damaged ({why}); it is removed and "
              "the split tokenized again", file=sys.stderr)
        try:
            os.remove(path)
        except OSError:
            pass  # another process removed it first (an unwritable cache dir is refused by the pre-flight)
        return None


def _source_key(glue_dir, spec, stem) -> Optional[str]:
    """What the rows come from: the Hub split, or the TSV's path and content (size and SHA-256,
    20 ms for SST-2's training file; an edit that keeps size and mtime still changes it). None for
    a file that cannot be read: load_raw then reports it."""
    if glue_dir is None:
        return f"hub|{spec.name}|{stem}"
    from deepen_run.data.fingerprint import digest

    p = Path(glue_dir) / spec.folder / f"{stem}.tsv"
    try:
        return f"{p.resolve()}|{digest(p)}"
    except OSError:
        return None


def load_task(spec: TaskSpec, dcfg, tokenizer, seed: int, with_train=True, with_test=False) -> TaskData:
    tok_key = f"{tokenizer_key(tokenizer)}|{len(tokenizer)}"  # once, not per split: ~60 ms for MiniLM's

    def get(stem, hub_split, labelled, limit, fraction=None):
        source, tag = _source_key(dcfg.glue_dir, spec, stem), f"{spec.name}-{stem}"
        if source is None:  # a file that cannot be read: read_tsv says why, in one line
            load_raw(spec, dcfg.glue_dir, stem, hub_split, labelled)
        cut = "all" if fraction is None and limit is None else f"{fraction}|{limit}|{seed}"
        key = split_key(tag, source, cut, tok_key, dcfg.max_seq_length)
        path = cache_file(dcfg.cache_dir, tag, key) if source else None
        if path and os.path.isfile(path):
            # Tokenized before from this very content, read and validated then: memory-mapped at
            # once, instead of parsing the TSV again (0.6 s for SST-2's training set).
            cached = from_cache(path)
            if cached is not None:
                return cached
        raw = load_raw(spec, dcfg.glue_dir, stem, hub_split, labelled)
        raw = _subsample(raw, train_size(len(raw), fraction, limit), seed)
        return tokenize(raw, tokenizer, dcfg.max_seq_length, path, tag, fingerprint=key)

    train = get("train", "train", True, dcfg.max_train_samples, dcfg.train_fraction) if with_train else None
    dev = {name: get(stem, hub, True, dcfg.max_eval_samples)
           for name, (stem, hub) in zip(spec.eval_names, spec.dev_splits)}
    test = {}
    if with_test:
        for sub, (stem, hub) in zip(spec.submission, spec.test_splits):
            if dcfg.glue_dir is None or (Path(dcfg.glue_dir) / spec.folder / f"{stem}.tsv").is_file():
                test[sub] = get(stem, hub, False, None)
        if spec.name == DIAGNOSED_BY:
            test |= _diagnostic(dcfg, tokenizer, seed)
    return TaskData(spec, train, dev, test)


def _diagnostic(dcfg, tokenizer, seed: int) -> dict[str, datasets.Dataset]:
    """AX, GLUE's diagnostic test set, where its file is present (or the Hub can give it)."""
    if dcfg.glue_dir is not None and not (Path(dcfg.glue_dir) / AX.folder / "diagnostic.tsv").is_file():
        return {}
    if dcfg.glue_dir is not None:  # the file, checked before the run (tsv.validate): its errors are the user's
        return load_task(AX, dcfg, tokenizer, seed, with_train=False, with_test=True).test
    try:
        return load_task(AX, dcfg, tokenizer, seed, with_train=False, with_test=True).test
    except UserError:  # the Hub unreachable: AX is optional, the leaderboard zip names it missing
        return {}


def length_grouped(ds: datasets.Dataset, batch_size: int, gen: torch.Generator):
    """transformers' (the Trainer's) sampler: shuffle, sort megabatches of 50 batches by length.
    Lengths read from the column at once (the sampler's own default reads the rows one by one);
    it keeps `generator`, which data.stream.TaskStream re-seeds each epoch for an exact resume."""
    from transformers.trainer_pt_utils import LengthGroupedSampler

    return LengthGroupedSampler(batch_size, lengths=[len(x) for x in ds["input_ids"]], generator=gen)


def make_loader(ds: datasets.Dataset, tokenizer, batch_size: int, shuffle: bool, seed: int,
                group_by_length: bool = False, num_workers: int = 0) -> DataLoader:
    collate = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=None)
    cols = [c for c in ds.column_names if c in ("input_ids", "attention_mask", "token_type_ids", "label")]
    # Plain Python rows, not with_format("torch"): the collator pads lists and builds each batch's
    # tensors once, ~2.5x faster per batch than padding per-example tensors.
    ds = ds.select_columns(cols).with_format(None)
    gen = torch.Generator().manual_seed(seed)
    if group_by_length and shuffle:
        sampler = length_grouped(ds, batch_size, gen)
        return DataLoader(ds, batch_size=batch_size, sampler=sampler, collate_fn=collate,
                          num_workers=num_workers)
    return DataLoader(ds, batch_size=batch_size, shuffle=shuffle, generator=gen, collate_fn=collate,
                      num_workers=num_workers)


class LongestFirst(torch.utils.data.Dataset):
    """A dataset's rows, longest example first; `order[i]` is the dataset row at position i.
    run/evaluation.py finds it as a loader's dataset (kept by Accelerate's prepare, on every process)
    and puts the outputs back in dataset order."""

    def __init__(self, ds: datasets.Dataset):
        self.ds = ds
        lengths = [len(x) for x in ds["input_ids"]]
        self.order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep file order

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i: int) -> dict:
        return self.ds[self.order[i]]

    def __getitems__(self, positions: list[int]) -> list[dict]:  # a batch in one read, as datasets does
        return self.ds.__getitems__([self.order[i] for i in positions])


def eval_loader(ds: datasets.Dataset, tokenizer, batch_size: int) -> DataLoader:
    """Batches for evaluation and prediction, longest examples first. Each batch pads to its own
    longest example, so sorted batches carry far less padding than batches in file order: SST-2's
    dev set at 128 a batch is 25,416 tokens instead of 46,064 (1.3x to 1.8x fewer on the GLUE dev
    sets). No weight changes between batches, so the order changes no prediction; only float
    rounding can differ in the last digits with the padded length."""
    collate = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=None)
    cols = [c for c in ds.column_names if c in ("input_ids", "attention_mask", "token_type_ids", "label")]
    # Its own generator: a DataLoader without one draws its workers' base seed from torch's global
    # RNG each pass, so an evaluation would shift the training's dropout masks (and a run resumed
    # from a checkpoint taken at an evaluation step would not repeat the uninterrupted run).
    return DataLoader(LongestFirst(ds.select_columns(cols).with_format(None)), batch_size=batch_size,
                      shuffle=False, collate_fn=collate, generator=torch.Generator().manual_seed(0))
