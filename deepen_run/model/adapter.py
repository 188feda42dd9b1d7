"""The backbone adapter: the one module that knows how each encoder family is built (DESIGN.md, rule 3).

Methods (PALs, HIRE, the heads) and backbone steps (duplication, the probe) reach the encoder only
through these functions; the facts behind them are one entry per family in deepen_run/model/families.py,
keyed by `config.model_type`. docs/families.md says what each family supports and which test shows it.

`backbone` below is a loaded Hugging Face encoder (AutoModel's class, or a task model around one: its
`base_model` is used). Layer positions are 0-based positions in the layer stack (a deepened stack
counts its copies).
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Optional

import torch
from torch import nn

from deepen_run.errors import UserError
from deepen_run.model.families import FAMILIES, Family

SUPPORTED = tuple(FAMILIES)


def family(model_type: str, what: str = "backbone.model_type") -> Family:
    """The family's entry; an unknown model_type is refused in one line naming the supported ones."""
    if model_type not in FAMILIES:
        raise UserError(f"{what}={model_type!r} is not an encoder family deepen-run supports; "
                        f"supported: {', '.join(SUPPORTED)}")
    return FAMILIES[model_type]


def family_of(backbone: nn.Module) -> Family:
    return family(backbone.config.model_type, f"{type(backbone).__name__}'s model_type")


def refuse_shared(model_type: str, what: str) -> None:
    """Layer copies and the probe's removals need distinct layers; ALBERT shares one layer's weights."""
    if family(model_type).shared_layers:
        raise UserError(f"{what}: {model_type} layers share one set of weights across all depths, so a layer "
                        "cannot be copied or removed on its own; use a family with distinct layers")


def _base(backbone: nn.Module) -> nn.Module:
    return getattr(backbone, "base_model", backbone)


def layers(backbone: nn.Module) -> nn.ModuleList:
    """The layer stack (ALBERT: its one shared layer group's layers)."""
    found = _base(backbone).get_submodule(family_of(backbone).layers)
    if not isinstance(found, nn.ModuleList):
        raise RuntimeError(f"{type(backbone).__name__}.{family_of(backbone).layers} is no ModuleList: "
                           "the wrapped transformers version changed the family's layout")
    return found


def set_layers(backbone: nn.Module, stack: nn.ModuleList) -> None:
    """Replace the layer stack (the caller keeps config.num_hidden_layers in step)."""
    _base(backbone).set_submodule(family_of(backbone).layers, stack)


def depth(backbone: nn.Module) -> int:
    """How many layers an input passes through (ALBERT: its shared layer, num_hidden_layers times)."""
    return backbone.config.num_hidden_layers


def layer_index(backbone: nn.Module) -> dict[str, int]:
    """Every parameter name of `backbone` (as named_parameters() gives it) -> where it sits in depth:
    0 below the layer stack (embeddings, DeBERTa's relative-position table), i + 1 in layer position i,
    L + 1 above the stack (pooler, final norm, a task model's head); L = len(layers(backbone)).
    For depth-dependent rules such as layer-wise learning-rate decay."""
    fam, base = family_of(backbone), _base(backbone)
    lead = "" if base is backbone else backbone.base_model_prefix + "."
    stack, top = fam.layers + ".", len(layers(backbone)) + 1
    out = {}
    for name, _ in backbone.named_parameters():
        inside = name.startswith(lead)
        rest = name[len(lead):] if inside else name
        if inside and rest.startswith(stack):
            out[name] = int(rest[len(stack):].split(".", 1)[0]) + 1
        else:
            out[name] = top if not inside or rest.startswith(fam.above) else 0
    return out


def inputs(backbone: nn.Module, input_ids, attention_mask, token_type_ids=None) -> dict:
    """The keyword arguments the family's forward takes: segment ids only where it has a segment
    table of more than one row (DistilBERT, ModernBERT take none; DeBERTa-v3's table is empty)."""
    kw = {"input_ids": input_ids, "attention_mask": attention_mask}
    if token_type_ids is not None and family_of(backbone).token_types \
            and (getattr(backbone.config, "type_vocab_size", 0) or 0) > 1:
        kw["token_type_ids"] = token_type_ids
    return kw


def hidden_states(backbone: nn.Module, out) -> tuple:
    """H_0..H_L of a forward with output_hidden_states=True, all on one footing: a family whose
    model normalises only the last one (ModernBERT's final_norm) gets that norm on every one."""
    hs = out.hidden_states
    name = family_of(backbone).final_norm
    if name is None:
        return tuple(hs)
    norm = _base(backbone).get_submodule(name)
    return tuple(norm(h) for h in hs[:-1]) + (hs[-1],)


def has_pooler(backbone: nn.Module) -> bool:
    return getattr(_base(backbone), "pooler", None) is not None


def pooling(backbone: nn.Module, asked: str) -> str:
    """method.pooling -> what the heads compute: cls | mean | max | pooler. auto = the family's
    convention: BERT's and ALBERT's pretrained pooler; RoBERTa, XLM-R, ELECTRA, DeBERTa and DistilBERT
    the first token (their checkpoints hold no pooler); ModernBERT its config's classifier_pooling."""
    if asked == "pooler" and not has_pooler(backbone):
        raise UserError(f"method.pooling=pooler: {backbone.config.model_type} models have no pooler; "
                        "use auto, cls, mean or max")
    if asked != "auto":
        return asked
    conv = family_of(backbone).pooling
    if conv.startswith("config:"):
        return getattr(backbone.config, conv[len("config:"):], "cls")
    return conv if conv != "pooler" or has_pooler(backbone) else "cls"


def pooled(out) -> torch.Tensor:
    return out.pooler_output


def pooler_over(backbone: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The backbone's own pooler over a sequence other than its output (PALs' Top Proj. Attn.):
    BERT's pooler takes the first token itself; ALBERT's is a bare Linear, its tanh kept beside it."""
    base = _base(backbone)
    if getattr(base, "pooler_activation", None) is not None:
        return base.pooler_activation(base.pooler(hidden[:, 0]))
    return base.pooler(hidden)


def layer_input(args, kwargs) -> torch.Tensor:
    """A layer's input hidden states, from a forward (pre-)hook's arguments."""
    return args[0] if args else kwargs["hidden_states"]


def _read(read: Callable, layer, args, kwargs):
    read(layer, layer_input(args, kwargs))


def _add_to_input(take: Callable, index: int, name: str, _module, args, kwargs):
    ts = take()
    if ts is None:
        return None
    if len(args) > index:
        return (*args[:index], args[index] + ts, *args[index + 1:]), kwargs
    return args, {**kwargs, name: kwargs[name] + ts}


def _add_to_output(take: Callable, _module, _args, output):
    ts = take()
    if ts is None:
        return None
    return (output[0] + ts, *output[1:]) if isinstance(output, tuple) else output + ts


def hook_residual_term(backbone: nn.Module, read: Callable, take: Callable) -> None:
    """Add a term computed from each layer's input to that layer (PALs' TS(h)), where the family takes it.

    read(layer, h) runs before each layer call with its input h; take() -> the term for the current call,
    or None. Post-LN: added to the residual inside the layer's output LayerNorm (the PALs paper);
    pre-LN: to the layer's output, a parallel residual term x + attn + mlp + TS(x) (ours). A shared
    layer (ALBERT) is hooked once and sees one read/take per depth. read/take may be partials of bound
    methods: copy.deepcopy of a model then routes the copy's hooks through the copy."""
    fam = family_of(backbone)
    for layer in {id(m): m for m in layers(backbone)}.values():
        layer.register_forward_pre_hook(partial(_read, read), with_kwargs=True)
        if fam.pal is None:
            layer.register_forward_hook(partial(_add_to_output, take))
        else:
            layer.get_submodule(fam.pal.module).register_forward_pre_hook(
                partial(_add_to_input, take, fam.pal.index, fam.pal.name), with_kwargs=True)


def identity_copy(backbone: nn.Module, layer: nn.Module) -> Optional[list[nn.Parameter]]:
    """Make a fresh copy compute the identity the family's own way, if it has one: pre-LN blocks with
    zeroed output projections (LLaMA Pro). -> the zeroed parameters (they start from scratch), or None
    for a post-LN family, whose copy needs a gate (deepen_run/model/duplication.py)."""
    fam = family_of(backbone)
    if not fam.pre_ln:
        return None
    zeroed = []
    with torch.no_grad():
        for path in fam.zero_for_identity:
            for p in layer.get_submodule(path).parameters():
                p.zero_()
                zeroed.append(p)
    return zeroed


def fit_copy(backbone: nn.Module, layer: nn.Module, position: int) -> list[nn.Parameter]:
    """Give a copy now at `position` what the model builds at that position and the copy lacks
    (ModernBERT: layer 0 alone has no attention norm), so that a saved model reloads as itself.
    -> the parameters added (new: a LayerNorm at its initial unit weight)."""
    name = family_of(backbone).fresh_norm_on_copy
    if name is None or position == 0 or not isinstance(layer.get_submodule(name), nn.Identity):
        return []
    c = backbone.config
    norm = nn.LayerNorm(c.hidden_size, eps=c.norm_eps, bias=c.norm_bias)
    layer.set_submodule(name, norm.to(next(layer.parameters()).device))
    return list(norm.parameters())


def stand_in(backbone: nn.Module, module: nn.Module, like: nn.Module) -> nn.Module:
    """`module` made to pass for the layer `like` in the encoder's loop (the attributes it reads)."""
    for attr in family_of(backbone).layer_attrs:
        setattr(module, attr, getattr(like, attr))
    return module


def lora_targets(backbone: nn.Module) -> list[str]:
    """Full names (as backbone.named_modules gives them) of the Linears method=lora adapts: the family's
    `lora` modules inside the layer stack only (a pooler or MLM head is never adapted)."""
    fam, stack = family_of(backbone), layers(backbone)
    inside = {id(m) for m in stack.modules()}
    return [n for n, m in backbone.named_modules() if isinstance(m, nn.Linear) and id(m) in inside
            and n.rsplit(".", 1)[-1] in fam.lora]


def mlm_prefixes(model_type: str) -> tuple:
    return family(model_type).mlm_prefixes


def tiny_config(b):
    """A random model's config from backbone.* (pretrained=false): the generic sizes, renamed or
    completed as the family's config wants them (families.Family.tiny)."""
    from transformers import CONFIG_MAPPING

    from deepen_run.model.families import GENERIC

    fam = family(b.model_type)
    kw = {k: getattr(b, k) for k in GENERIC if k not in fam.drop}
    return CONFIG_MAPPING[b.model_type](**{**kw, **fam.tiny(b)})
