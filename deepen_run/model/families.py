"""The encoder families deepen-run supports: one entry per Hugging Face `config.model_type`, read only
by the backbone adapter (deepen_run/model/adapter.py); docs/families.md has the table of families x
methods and the tests behind each cell. Light (no torch, no transformers): the pre-flight reads it to
refuse an unknown family before any weights load.

Adding a family is one entry here (tests/test_families.py then runs every method on a tiny random
model of it). Paths are dotted attribute paths from the base model (AutoModel's class) or a layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Optional

# The config kwargs every family's tiny random model gets from backbone.* (conf/backbone/tiny.yaml).
GENERIC = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
           "max_position_embeddings", "type_vocab_size", "pad_token_id")


@dataclass(frozen=True)
class PalEntry:
    """Post-LN: the submodule of a layer whose input gets + TS(h), inside the layer's output LayerNorm
    (the PALs paper): its forward's argument `index` (positional) or `name` (keyword)."""
    module: str
    index: int
    name: str


@dataclass(frozen=True)
class Family:
    """What the adapter knows of one encoder family.

    layers: the layer ModuleList
    pre_ln: pre-LN blocks (x + attn(norm(x)), then + mlp(norm(.))) instead of post-LN ones
    pal: post-LN: where TS(h) enters; None for pre-LN: a parallel residual term, layer(x) + TS(x) (ours)
    zero_for_identity: pre-LN: the output projections whose zeroing makes a copy the identity (LLaMA Pro)
    token_types: the model's forward takes token_type_ids
    pooling: the family's sentence vector for method.pooling=auto: pooler (its pretrained tanh pooler),
        cls (first token), mean, or config:<attr> (the config says, e.g. ModernBERT's classifier_pooling)
    above: parameter-name prefixes of what sits above the layer stack (pooler, final norm)
    final_norm: a norm the model applies after the last layer only; the adapter applies it to every
        hidden state, so that HIRE fuses like with like
    shared_layers: one set of layer weights serves every depth (ALBERT): copying a layer means nothing
    layer_attrs: attributes the encoder's loop reads from each layer (a probe's stand-in copies them)
    mlm_prefixes: checkpoint key prefixes of the family's pretrained MLM head (the probe)
    fresh_norm_on_copy: a norm that layer 0 alone lacks (nn.Identity); a copy of layer 0 placed higher
        gets the LayerNorm that position has when the model is built, so a saved model reloads as itself
    token_linears: every Linear in a layer maps the tokens alone, position by position, so training may
        skip the padding (deepen_run/model/unpad.py); DeBERTa's also map its relative-position table
    lora: the Linear modules of a layer that method=lora adapts (names as PEFT's target_modules match them):
        the attention's query and value projections, as the LoRA paper (ModernBERT's are one fused Wqkv)
    tiny: extra / renamed config kwargs of a tiny random model of the family, from backbone.*
    drop: generic kwargs the family's config does not take
    """
    layers: str
    pre_ln: bool = False
    pal: Optional[PalEntry] = PalEntry("output", 1, "input_tensor")
    zero_for_identity: tuple = ()
    token_types: bool = True
    pooling: str = "cls"
    above: tuple = ("pooler.",)
    final_norm: Optional[str] = None
    shared_layers: bool = False
    layer_attrs: tuple = ()
    mlm_prefixes: tuple = ()
    fresh_norm_on_copy: Optional[str] = None
    token_linears: bool = True
    lora: tuple = ("query", "value")
    tiny: Callable[[object], dict] = field(default=lambda b: {})
    drop: tuple = ()


def _deberta_v3(b) -> dict:
    # DeBERTa-v3's relative-position settings (microsoft/deberta-v3-base's config.json); no segment ids.
    return dict(type_vocab_size=0, relative_attention=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
                norm_rel_ebd="layer_norm", share_att_key=True, position_buckets=32, max_relative_positions=-1)


def _modernbert(b) -> dict:
    # Alternating global / local attention from layer 0 (ModernBERT-base alternates every 3 layers), a
    # window small enough that short test inputs feel it; the special tokens of the tokenizer in use
    # are the tokenizer's business, not the encoder's.
    return dict(global_attn_every_n_layers=2, local_attention=16, bos_token_id=None, eos_token_id=None,
                cls_token_id=None, sep_token_id=None)


def _offset_positions(b) -> dict:
    # RoBERTa numbers positions from pad_token_id + 1 (roberta-base: 514 rows for 512 tokens), so the
    # tiny model gets as many usable positions as backbone.max_position_embeddings says.
    return dict(max_position_embeddings=b.max_position_embeddings + b.pad_token_id + 1)


_BERT = Family(layers="encoder.layer", pooling="pooler", mlm_prefixes=("cls.predictions.",))
_ROBERTA = Family(layers="encoder.layer", mlm_prefixes=("lm_head.",), tiny=_offset_positions)  # its checkpoints hold no pooler

FAMILIES = MappingProxyType({
    "bert": _BERT,
    "roberta": _ROBERTA,
    "xlm-roberta": _ROBERTA,
    "electra": Family(layers="encoder.layer", mlm_prefixes=("generator_lm_head.",),
                      tiny=lambda b: dict(embedding_size=b.hidden_size)),
    "deberta-v2": Family(layers="encoder.layer", mlm_prefixes=("lm_predictions.", "cls.predictions."),
                         token_linears=False, lora=("query_proj", "value_proj"), tiny=_deberta_v3),
    "distilbert": Family(layers="transformer.layer", pal=PalEntry("output_layer_norm", 0, "input"),
                         token_types=False, mlm_prefixes=("vocab_projector.", "vocab_transform."), lora=("q_lin", "v_lin"),
                         tiny=lambda b: dict(hidden_dim=b.intermediate_size), drop=("type_vocab_size",)),
    "modernbert": Family(layers="layers", pre_ln=True, pal=None, zero_for_identity=("attn.Wo", "mlp.Wo"),
                         token_types=False, pooling="config:classifier_pooling", above=("final_norm.",),
                         final_norm="final_norm", layer_attrs=("attention_type",), mlm_prefixes=("head.", "decoder."),
                         fresh_norm_on_copy="attn_norm", lora=("Wqkv",), tiny=_modernbert, drop=("type_vocab_size",)),
    "albert": Family(layers="encoder.albert_layer_groups.0.albert_layers", pal=PalEntry("full_layer_layer_norm", 0, "input"),
                     pooling="pooler", shared_layers=True, mlm_prefixes=("predictions.",),
                     tiny=lambda b: dict(embedding_size=b.hidden_size)),
})
