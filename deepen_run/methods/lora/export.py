"""method=lora's saved adapters, as artifacts of the run (deepen_run/methods/lora/model.py says what).

  lora/adapters/<task>/adapter_config.json, adapter_model.safetensors   PEFT's own format:
      PeftModel.from_pretrained(<the base backbone>, <that folder>) loads the task's adapter
  lora/adapters/<task>/head.safetensors, head.json   the task's head (nn.Linear weight, bias) and the
      pooling that feeds it: base + adapter + head give the run's predictions
  lora/merged/   single-task runs: the backbone with the adapter merged in (PEFT's merge_and_unload),
      saved with save_pretrained: AutoModel.from_pretrained loads it without peft
"""
from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

from safetensors.torch import save_file


def write(model, out: Path) -> None:
    """Every adapter, its head, and (one task) the merged backbone, under `out`."""
    adapters = out / "adapters"
    model.peft.save_pretrained(str(adapters))  # no adapter is named "default": one folder per task
    for task, head in model.heads.items():
        linear = head[-1]
        save_file({"weight": linear.weight.detach().cpu().contiguous(), "bias": linear.bias.detach().cpu().contiguous()},
                  str(adapters / task / "head.safetensors"))
        (adapters / task / "head.json").write_text(json.dumps({"pooling": model.pooling,
                                                              "num_labels": linear.out_features}) + "\n")
    if len(model.heads) == 1:
        task = next(iter(model.heads))
        peft = copy.deepcopy(model.peft)  # merging changes the weights it merges into: a copy's
        peft.set_adapter(task)
        peft.merge_and_unload().save_pretrained(str(out / "merged"))


def save(model, ctx) -> None:
    with tempfile.TemporaryDirectory(prefix="deepen-lora-") as tmp:
        root = Path(tmp)
        write(model, root)
        for f in sorted(p for p in root.rglob("*") if p.is_file()):
            ctx.tracker.log_file(str(f), str(Path("lora") / f.parent.relative_to(root)))
