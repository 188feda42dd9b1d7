"""When a trained model *is* a plain Hugging Face classifier, and the key mapping both ways.

A run's model is one transformers <Family>ForSequenceClassification when it is the shared encoder
classifier (model/heads.py's EncoderClassifier: the backbone's pooler, then dropout and a linear
layer) on one task, over a backbone family listed in HEADS, with nothing else in its weights (a
gated layer copy's gate, for one, has no place in the HF model). Duplicated layers are fine: the
HF config just counts more layers.

HEADS is a table, one row per family: adding a family is one row (the backbone adapter that knows
each family can hand its row here). Each row maps key prefixes of the HF classifier's state dict to
ours; `{task}` stands for the task's head.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Optional

from deepen_run.model.heads import EncoderClassifier

# model_type -> (HF class name, [(HF prefix, our prefix)], in the order they are tried)
HEADS = MappingProxyType({
    # BertForSequenceClassification: bert.pooler (tanh over [CLS]) -> dropout -> classifier
    "bert": ("BertForSequenceClassification",
             (("bert.", "backbone."), ("classifier.", "heads.{task}.1."))),
    # RobertaClassificationHead: dense + tanh over <s> -> out_proj: our pooler + linear head, where
    # the pooler's dense layer is the head's dense layer (the encoder itself has no pooler there).
    "roberta": ("RobertaForSequenceClassification",
                (("classifier.dense.", "backbone.pooler.dense."), ("roberta.", "backbone."),
                 ("classifier.out_proj.", "heads.{task}.1."))),
})


def _rename(key: str, pairs, task: str) -> Optional[str]:
    for src, dst in pairs:
        if key.startswith(src):
            return dst.format(task=task) + key[len(src):]
    return None


def why_not(model, state: dict) -> Optional[str]:
    """None when `model` (with its state dict) is a plain HF classifier; else the reason, for the card."""
    if type(model) is not EncoderClassifier:
        return f"the method's model ({type(model).__name__}) adds parts a plain classifier has not"
    if model.pooling != "pooler":
        return f"its sentence vector is {model.pooling}-pooled, not the pretrained pooler's"
    if len(model.heads) != 1:
        return f"it has {len(model.heads)} task heads; a plain classifier has one"
    family = model.backbone.config.model_type
    if family not in HEADS:
        return f"no row for the {family} family in deepen_run/serve/hf.py's HEADS"
    task = next(iter(model.heads))
    back = [(dst.format(task=task), src) for src, dst in HEADS[family][1]]
    left = [k for k in state if _rename(k, back, task) is None]
    if left:
        return f"its weights hold {left[0]}, which the HF classifier has no place for"
    return None


def to_hf(state: dict, family: str, task: str) -> dict:
    """Our state dict -> the HF classifier's."""
    back = [(dst.format(task=task), src) for src, dst in HEADS[family][1]]
    # The pooler of a RoBERTa-style row is the head's dense layer: try the longest prefixes first.
    back.sort(key=lambda p: -len(p[0]))
    return {_rename(k, back, task): v for k, v in state.items()}


def from_hf(state: dict, family: str, task: str) -> dict:
    """The HF classifier's state dict -> ours."""
    out = {}
    for k, v in state.items():
        new = _rename(k, HEADS[family][1], task)
        if new is not None:
            out[new] = v
    return out


def hf_config(model, spec):
    """The HF config of the classifier: the (deepened) backbone's config, the task's labels."""
    import copy

    conf = copy.deepcopy(model.backbone.config)
    conf.architectures = [HEADS[conf.model_type][0]]
    conf.num_labels = spec.num_labels
    if spec.is_regression:
        conf.problem_type = "regression"
    else:
        conf.problem_type = "single_label_classification"
        conf.id2label = dict(enumerate(spec.label_names))
        conf.label2id = {n: i for i, n in enumerate(spec.label_names)}
    # The head's dropout is the backbone's hidden dropout in both (eval: no effect on logits).
    return conf
