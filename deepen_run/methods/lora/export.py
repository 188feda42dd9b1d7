"""method=lora's adapters in PEFT's own format, in the run's artifacts and in every model folder (the
run's LoggedModel, a deepen-export), under lora/ (deepen_run/methods/lora/model.py says what they are):

  lora/adapters/<task>/adapter_config.json, adapter_model.safetensors   PEFT's own format:
      PeftModel.from_pretrained(<the base backbone>, <that folder>) loads the task's adapter
  lora/adapters/<task>/head.safetensors, head.json   the task's head (nn.Linear weight, bias) and the
      pooling that feeds it: base + adapter + head give the run's predictions
  lora/merged/   model folders of single-task runs: the backbone with the adapter merged in (PEFT's
      merge_and_unload), saved with save_pretrained: AutoModel.from_pretrained loads it without peft.
      Not in the run's artifacts: a model folder holds it, and a second copy of the backbone (90 MB
      for MiniLM) in every short run would be stored twice for nothing.
"""
from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Optional

from safetensors.torch import save_file

ROOT = "lora"  # the subfolder of the artifacts and of a model folder


def write(model, out: Path, merged: bool = True) -> Optional[str]:
    """Every adapter with its head under `out`, and (one task, merged=True) the merged backbone.
    -> why no merged backbone was written, or None (written, or not asked for)."""
    adapters = out / "adapters"
    model.peft.save_pretrained(str(adapters))  # no adapter is named "default": one folder per task
    for task, head in model.heads.items():
        linear = head[-1]
        save_file({"weight": linear.weight.detach().cpu().contiguous(), "bias": linear.bias.detach().cpu().contiguous()},
                  str(adapters / task / "head.safetensors"))
        (adapters / task / "head.json").write_text(json.dumps({"pooling": model.pooling,
                                                              "num_labels": linear.out_features}) + "\n")
    if not merged:
        return None
    if len(model.heads) != 1:
        return f"{len(model.heads)} tasks, one adapter each: merging one would lose the others"
    task = next(iter(model.heads))
    peft = copy.deepcopy(model.peft)  # merging changes the weights it merges into: a copy's
    peft.set_adapter(task)
    backbone = peft.merge_and_unload()
    why = not_plain(backbone)
    if why is None:
        backbone.save_pretrained(str(out / "merged"))
    return why


def not_plain(backbone) -> Optional[str]:
    """None when transformers alone rebuilds `backbone` from its config (the same weight names); else
    why not: a backbone step's own parts (a gated copy's gate, DWA's weights) would be dropped by
    AutoModel.from_pretrained with a warning, and the model it gave would not be the run's."""
    import torch
    from transformers import AutoModel

    with torch.device("meta"):  # the names only: no memory, no init
        plain = AutoModel.from_config(backbone.config)
    extra = sorted(set(backbone.state_dict()) - set(plain.state_dict()))
    return f"the backbone holds {extra[0]}, which transformers' {type(plain).__name__} has no place for" if extra else None


def card(tasks: list[str], why_not_merged: Optional[str]) -> str:
    """The model card's paragraph on the adapters (serve/card.py puts it under "How to load it")."""
    lines = ["### LoRA adapters (PEFT)", "",
             f"`{ROOT}/adapters/<task>/` holds each task's adapter ({', '.join(tasks)}) in PEFT's own format, "
             "with the task's head beside it (`head.safetensors`: the linear layer's weight and bias; `head.json`: "
             "the pooling that feeds it). On the backbone named above (the run's backbone.path):", "",
             "```python", "from peft import PeftModel", "from transformers import AutoModel",
             "base = AutoModel.from_pretrained(BACKBONE_PATH)",
             f"model = PeftModel.from_pretrained(base, FOLDER + \"/{ROOT}/adapters/{tasks[0]}\")", "```", "",
             "A run that changed the backbone (backbone.duplicate_layers, backbone.dwa) trained the adapters on "
             "that deeper backbone: there, deepen_run.load gives the run's model.", ""]
    if why_not_merged is None:
        lines += [f"`{ROOT}/merged/` is the backbone with the adapter merged in: "
                  f"`AutoModel.from_pretrained(FOLDER + \"/{ROOT}/merged\")` loads it without peft.", ""]
    else:
        lines += [f"No merged backbone: {why_not_merged}.", ""]
    return "\n".join(lines)


def save(model, ctx) -> None:
    """The adapters and heads as the run's artifacts (lora/adapters/...)."""
    with tempfile.TemporaryDirectory(prefix="deepen-lora-") as tmp:
        root = Path(tmp)
        write(model, root, merged=False)
        for f in sorted(p for p in root.rglob("*") if p.is_file()):
            ctx.tracker.log_file(str(f), str(Path(ROOT) / f.parent.relative_to(root)))
