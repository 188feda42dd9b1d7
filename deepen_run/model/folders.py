"""What a local folder named as a backbone (backbone.path) or its tokenizer (backbone.tokenizer) must
hold, checked by the pre-flight before any run starts (docs/reliability.md, "A folder you point at"):
weights as safetensors whose tensors fit the folder's config, and tokenizer files. Without this a
folder of weights alone trained on [UNK] (transformers 5 builds a 5-token tokenizer), and a broken
weight or tokenizer surfaced as a traceback and a FAILED run. Each refusal is one line naming the key
and the file. Reads file headers only: no weights load here."""
from __future__ import annotations

import json
import os
from pathlib import Path

from deepen_run.errors import UserError

WEIGHTS = ("model.safetensors", "model.safetensors.index.json")  # one file, or transformers' shards
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")
# A tokenizer folder holds its vocabulary in one of these (fast: tokenizer.json; WordPiece: vocab.txt;
# BPE: vocab.json + merges.txt; SentencePiece: *.model).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")


def check_weights(key: str, folder: Path) -> None:
    """`folder` holds safetensors weights whose headers read and whose tensors fit its config.json."""
    names = [n for n in WEIGHTS if (folder / n).is_file()]
    if not names:
        pickled = [n for n in PICKLES if (folder / n).is_file()]
        why = (f"it has {pickled[0]}, a format that can run code when read; convert it to safetensors first"
               if pickled else "a backbone folder needs its weights (or set backbone.pretrained=false)")
        raise UserError(f"{key}={folder}: no model.safetensors; {why}")
    files = [folder / WEIGHTS[0]] if names[0] == WEIGHTS[0] else _shards(key, folder / WEIGHTS[1])
    shapes = {}
    from safetensors import SafetensorError, safe_open

    for f in files:
        try:
            with safe_open(str(f), "pt") as st:
                shapes |= {k: tuple(st.get_slice(k).get_shape()) for k in st.keys()}
        except (SafetensorError, OSError, ValueError) as e:
            raise UserError(f"{key}={folder}: {f.name} is not a readable safetensors file (damaged, truncated or "
                            f"another format): {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    _fits(key, folder, shapes)


def _shards(key: str, index: Path) -> list[Path]:
    try:
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise UserError(f"{key}={index.parent}: {index.name} is not a shard index (JSON with a weight_map)") from None
    missing = [n for n in names if not (index.parent / n).is_file()]
    if missing:
        raise UserError(f"{key}={index.parent}: the weight shard {missing[0]} named by {index.name} is missing")
    return [index.parent / n for n in names]


def _fits(key: str, folder: Path, shapes: dict) -> None:
    """Every tensor the model has by the folder's config has that shape in the file (a checkpoint of a
    task model keeps the encoder under its prefix, e.g. bert.)."""
    import torch
    from transformers import AutoConfig, AutoModel

    try:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
        with torch.device("meta"):
            model = AutoModel.from_config(config)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{key}={folder}: its config.json does not describe a model: "
                        f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    prefix = f"{model.base_model_prefix}."
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for name, shape in shapes.items():
        own = name.removeprefix(prefix)
        if own in want and want[own] != shape:
            raise UserError(f"{key}={folder}: weight {name} has shape {list(shape)} but the folder's config.json "
                            f"makes it {list(want[own])}; the weights and config.json are not one model's")


def check_tokenizer(key: str, source: str) -> None:
    """A local tokenizer folder holds a vocabulary file; a path that is not there is refused (a Hub id
    is left to the loader)."""
    folder = Path(source)
    if not folder.is_dir():
        if source.startswith((".", "/", "~")):
            raise UserError(f"{key}={source} does not exist (a folder with tokenizer files, or a Hub id)")
        return
    if not any((folder / n).is_file() for n in TOKENIZER_FILES):
        fix = ("set backbone.tokenizer=<a folder or Hub id with the tokenizer the weights were trained with>"
               if key == "backbone.path" else "name a folder with the tokenizer the weights were trained with")
        raise UserError(f"{key}={source} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); {fix}")
    if not os.access(folder, os.R_OK | os.X_OK):
        raise UserError(f"{key}={source}: you cannot read this folder")
