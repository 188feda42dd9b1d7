"""LoRA through the `peft` library (Hu et al. 2021, arXiv 2106.09685; docs/methods.md, section LoRA).

One adapter per task, named after the task, on the query and value projections of every layer (the
backbone adapter's family table says which Linears those are: deepen_run/model/families.py, `lora`),
W x + alpha / r * B_t A_t x. The low-rank update is PEFT's (get_peft_model, add_adapter); deepen-run only
routes the task: forward activates the task's adapter. The backbone is frozen unless
method.train_backbone=true; the adapters (B starts at 0: the pretrained function at step 0) and the
heads are new parameters.

method.rank=null picks the rank whose per-task size matches PALs' on the backbone at hand:
r = round(P_pals / sum over adapted Linears of (in + out)), P_pals from methods/pals/model.py, at most
the hidden size.
after_train saves the adapters in PEFT's own format as the run's artifacts (lora/adapters/<task>/:
PeftModel.from_pretrained on the base backbone loads one) with the task's head and pooling beside them;
model_files puts the same under lora/ in every model folder (the run's LoggedModel, a deepen-export),
and for a single-task run the backbone with the adapter merged in (lora/merged/: plain transformers
loads it). methods/lora/export.py writes both.
"""
from __future__ import annotations

from peft import LoraConfig, get_peft_model
from torch import nn

from deepen_run.methods.contract import Output
from deepen_run.methods.lora.config import Config, check  # noqa: F401 (the method's contract)
from deepen_run.model import adapter
from deepen_run.model.heads import EncoderClassifier


def per_rank(backbone: nn.Module) -> int:
    """Parameters of one task's adapters per unit of rank: sum of (in + out) over the Linears it adapts
    (read before PEFT wraps them)."""
    mods = dict(backbone.named_modules())
    return sum(mods[n].in_features + mods[n].out_features for n in adapter.lora_targets(backbone))


def closed_form(rank: int, per_rank_size: int, num_tasks: int) -> int:
    """LoRA's size: per task, r (in + out) for each adapted Linear (A: r x in, B: out x r, no biases)."""
    return num_tasks * rank * per_rank_size


def matched_rank(backbone: nn.Module) -> int:
    """The rank whose per-task adapters are as large as PALs' (method=pals's defaults) on this backbone,
    at most the hidden size (a larger rank adds parameters but no expressiveness: a tiny test model)."""
    from deepen_run.methods.pals.config import Config as PalsConfig
    from deepen_run.methods.pals.model import pal_params_per_task

    c = backbone.config
    budget = pal_params_per_task(c.hidden_size, PalsConfig().hidden_size_aug, adapter.depth(backbone))
    return max(1, min(c.hidden_size, round(budget / per_rank(backbone))))


class LoraClassifier(EncoderClassifier):
    """The backbone with one PEFT adapter per task injected into it, the pooled vector, a head per task."""

    def __init__(self, backbone: nn.Module, cfg: Config, tasks):
        super().__init__(backbone, tasks, pooling=cfg.pooling)
        self.cfg = cfg
        self.rank = cfg.rank if cfg.rank is not None else matched_rank(backbone)
        self.per_rank = per_rank(backbone)  # before PEFT wraps the Linears
        lora = LoraConfig(r=self.rank, lora_alpha=cfg.alpha if cfg.alpha is not None else self.rank,
                          lora_dropout=cfg.dropout, target_modules=adapter.lora_targets(backbone), bias="none")
        names = [t.name for t in tasks]
        # PEFT injects its layers into `backbone` in place; the PeftModel wrapper is kept outside the
        # module tree (one registration of each parameter, under backbone.*) for switching and saving.
        peft_model = get_peft_model(backbone, lora, adapter_name=names[0])
        for name in names[1:]:
            peft_model.add_adapter(name, lora)
        self.__dict__["peft"] = peft_model
        self._active = None

    def lora_parameters(self) -> list[nn.Parameter]:
        return [p for n, p in self.backbone.named_parameters() if "lora_" in n]

    def activate(self, task: str) -> None:
        """Route the task's adapter. PEFT's set_adapter also flips requires_grad (the inactive adapters
        off): put back what the method decided, so what trains stays as built; the inactive adapters get
        no gradient anyway, as they take no part in the forward."""
        if task == self._active:
            return
        flags = [(p, p.requires_grad) for p in self.lora_parameters()]
        self.peft.set_adapter(task)
        for p, flag in flags:
            p.requires_grad_(flag)
        self._active = task

    def forward(self, task: str, input_ids, attention_mask, token_type_ids=None) -> Output:
        self.activate(task)
        return super().forward(task, input_ids, attention_mask, token_type_ids)

    def new_parameters(self) -> list[nn.Parameter]:
        """The adapters (inside the backbone, PEFT's) and the heads."""
        return [*self.lora_parameters(), *super().new_parameters()]


def build(backbone, cfg: Config, tasks) -> LoraClassifier:
    model = LoraClassifier(backbone, cfg, tasks)
    for p in model.backbone.parameters():
        p.requires_grad_(cfg.train_backbone)
    for p in model.new_parameters():
        p.requires_grad_(True)
    return model


def after_build(model: LoraClassifier, ctx) -> None:
    ctx.tracker.log_params({"lora.rank": model.rank, "lora.rank_from": "method.rank" if model.cfg.rank else "pals_budget"})


def after_train(model: LoraClassifier, ctx) -> None:
    if ctx.accelerator.is_main_process:
        from deepen_run.methods.lora.export import save

        save(model, ctx)


def model_files(model: LoraClassifier, folder) -> str:
    from deepen_run.methods.lora.export import ROOT, card, write

    return card(list(model.heads), write(model, folder / ROOT))
