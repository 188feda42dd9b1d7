"""The contenders of `make bench`, each a real training loop fed the same batches.

- deepen-run: train.fit itself, the loop every run uses, on the runner's own pieces
  (fast.make_accelerator, data.make_loader, methods build, train.optimizer_for / scheduler_for, a
  real MLflow Tracker); checkpoints left out (a stand-in saver that times each step).
- trainer: transformers.Trainer on AutoModelForSequenceClassification (what run_glue.py trains),
  DataCollatorWithPadding, examples in the given order (train_sampling_strategy=sequential).
- trainer-pad128: the same, padded to max_length like run_glue.py's default (pad_to_max_length).
- bare: forward, backward, AdamW on pre-collated batches already on the device; no loader, no
  schedule, no clipping, no logging: the ceiling for this model on this machine.
All start from the same weights; the deepen-run baseline and BERT's sequence classifier are the
same network (pooler, dropout, linear), so their dev accuracies are directly comparable.
"""
from __future__ import annotations

import copy
import math
import tempfile

import torch
from transformers import (AutoModelForSequenceClassification, DataCollatorWithPadding, PrinterCallback, Trainer,
                          TrainerCallback, TrainingArguments, default_data_collator)

from deepen_run.model import backbone as bb
from deepen_run.data import loaders as gd
from deepen_run.model import steps as backbone_steps
from deepen_run.data import metrics as glue_metrics
from deepen_run.precision import resolve, resolve_precision
from deepen_run.run.fast import enable_tf32, make_accelerator
from deepen_run.run.optim import optimizer_impl
from deepen_run.run.checkpoint import Checkpointer
from deepen_run.run.context import RunState
from deepen_run.methods import METHODS
from deepen_run.model.heads import new_parameters, task_loss
from deepen_run.run.evaluation import batch_inputs
from deepen_run.data.sampling import TaskSampler
from deepen_run.tracking.store import Tracker
from deepen_run.run.train import fit, optimizer_for, scheduler_for

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def baseline_model(cfg, tasks, init_state=None):
    """-> (model, its new parameters as the runner derives them)."""
    backbone, loaded, added = backbone_steps.load(cfg)
    model = METHODS["baseline"].build(backbone, cfg.method, tasks)
    if init_state is not None:
        model.load_state_dict(init_state)
    return model, new_parameters(model, loaded, added)


class _LapSaver(Checkpointer):
    """train.fit's own Checkpointer with no run dir, so it writes nothing, and each step timed on the
    lap: the real loop and its bookkeeping run unchanged."""

    def __init__(self, lap, tcfg, accelerator, total: int):
        super().__init__(None, tcfg, accelerator, total)
        self.lap = lap

    def on_step(self, done: int) -> None:
        self.lap.step(done)
        super().on_step(done)


def deepen_run(cfg, spec, tok, ordered, dev, init_state, lap, tracking_uri) -> dict:
    """train.fit itself (the loop every run uses: steps, loss logging, evaluation cadence, final
    record), on the runner's pieces; only the checkpoints are left out (a _LapSaver instead)."""
    tcfg = cfg.train
    model, new = baseline_model(cfg, [spec], init_state)
    compute = resolve(tcfg)
    accelerator = make_accelerator(tcfg, compute.precision)
    tracker = Tracker(tracking_uri, "bench")
    tracker.start("bench-deepen-run", {"bench": "1"})
    loader = gd.make_loader(ordered, tok, tcfg.batch_size, False, cfg.seed)
    dev_loader = gd.make_loader(dev, tok, tcfg.eval_batch_size, False, cfg.seed)
    sampler = TaskSampler(cfg.schedule, {spec.name: len(ordered)}, len(loader), tcfg.max_steps, cfg.seed)
    optimizer = optimizer_for(model, tcfg, accelerator.device.type, new)
    scheduler = scheduler_for(optimizer, tcfg, tcfg.max_steps)
    model, optimizer, scheduler, loader, dev_loader = accelerator.prepare(model, optimizer, scheduler, loader,
                                                                          dev_loader)
    data = {spec.name: gd.TaskData(spec, ordered, {spec.name: dev}, {})}
    r = RunState(cfg, [spec], model, METHODS["baseline"], new, accelerator, tracker, compute, tokenizer=tok,
                 data=data, optimizer=optimizer, scheduler=scheduler, sampler=sampler,
                 streams={spec.name: loader}, dev={spec.name: dev_loader}, eval_specs={spec.name: spec},
                 saver=_LapSaver(lap, tcfg, accelerator, tcfg.max_steps), total=tcfg.max_steps, start=0)
    torch.manual_seed(cfg.seed)
    lap.begin()
    status = "FAILED"
    try:
        final = fit(r)
        status = "FINISHED"
    finally:
        tracker.end(status)  # never left RUNNING in the bench's store
    return {"dev_accuracy": final[f"eval/{spec.name}/accuracy"]}


class _Lapper(TrainerCallback):
    def __init__(self, lap):
        self.lap = lap

    def on_train_begin(self, args, state, control, **kw):
        self.lap.begin()

    def on_step_end(self, args, state, control, **kw):
        self.lap.step(state.global_step)


def hf_model(cfg, spec, init_state):
    """run_glue.py's model, with the backbone and head weights the other contenders start from."""
    path = bb.resolve(cfg.backbone.path)
    if cfg.backbone.pretrained:
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=spec.num_labels)
    else:
        conf = bb.architecture(cfg.backbone)
        conf.num_labels = spec.num_labels
        model = AutoModelForSequenceClassification.from_config(conf)
    body = {k[len("backbone."):]: v for k, v in init_state.items() if k.startswith("backbone.")}
    # strict=False: a base model may lack the pooler (RoBERTa's classifier has its own head);
    # but every weight we hand over must land, or the contenders would not start equal.
    loaded = model.base_model.load_state_dict(body, strict=False)
    foreign = [k for k in loaded.unexpected_keys if not k.startswith("pooler.")]
    if foreign:
        raise RuntimeError(f"Trainer model does not take {foreign[:3]}...: not the same backbone")
    head = getattr(model, "classifier", None)
    if isinstance(head, torch.nn.Linear):
        head.load_state_dict({"weight": init_state[f"heads.{spec.name}.1.weight"],
                              "bias": init_state[f"heads.{spec.name}.1.bias"]})
    return model


def trainer(cfg, spec, tok, ordered, dev, init_state, lap, pad_to: int | None = None) -> dict:
    tcfg = cfg.train
    if pad_to:  # run_glue.py pads while tokenizing, then stacks with default_data_collator
        def pad(b):
            return tok.pad({k: b[k] for k in INPUTS if k in b}, padding="max_length", max_length=pad_to)
        ordered, dev = ordered.map(pad, batched=True), dev.map(pad, batched=True)
        collator = default_data_collator
    else:
        collator = DataCollatorWithPadding(tok)
    bf16 = resolve_precision(tcfg.mixed_precision) == "bf16"
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="bench-trainer-"), per_device_train_batch_size=tcfg.batch_size,
        per_device_eval_batch_size=tcfg.eval_batch_size, learning_rate=tcfg.learning_rate,
        weight_decay=tcfg.weight_decay, warmup_steps=int(round(tcfg.warmup_ratio * tcfg.max_steps)),
        lr_scheduler_type=tcfg.lr_scheduler, max_steps=tcfg.max_steps, max_grad_norm=tcfg.max_grad_norm,
        logging_steps=tcfg.log_every, save_strategy="no", eval_strategy="no", report_to="none",
        train_sampling_strategy="sequential", seed=cfg.seed, disable_tqdm=True, bf16=bf16,
        # without a GPU the Trainer takes bf16=True only when told it runs on the CPU
        use_cpu=bf16 and not torch.cuda.is_available(),
        tf32=True if torch.cuda.is_available() else None, dataloader_num_workers=cfg.data.num_workers,
        dataloader_pin_memory=torch.cuda.is_available())
    t = Trainer(model=hf_model(cfg, spec, init_state), args=args, train_dataset=ordered, data_collator=collator,
                processing_class=tok, callbacks=[_Lapper(lap)])
    t.remove_callback(PrinterCallback)  # its console dicts would interleave with the tables
    t.train()
    out = t.predict(dev)
    preds = out.predictions.argmax(-1).tolist()
    return {"dev_accuracy": glue_metrics.compute(spec.name, preds, list(dev["label"]))["accuracy"]}


def device_batches(tok, ordered, batch_size, seed, device) -> list[dict]:
    return [{k: v.to(device) for k, v in b.items()}
            for b in gd.make_loader(ordered, tok, batch_size, False, seed)]


def bare(cfg, spec, batches, init_state, lap, device) -> dict:
    enable_tf32()
    model = baseline_model(cfg, [spec], init_state)[0].to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.learning_rate, weight_decay=cfg.train.weight_decay,
                            fused=optimizer_impl("auto", device.type) == "fused")
    dtype = torch.bfloat16 if resolve_precision(cfg.train.mixed_precision) == "bf16" else None
    torch.manual_seed(cfg.seed)
    lap.begin()
    for i, b in enumerate(batches[:cfg.train.max_steps]):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(spec.name, **batch_inputs(b)).logits
        task_loss(logits, b["labels"], spec.is_regression).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        lap.step(i + 1)
    return {}


class Stepper:
    """One model + optimizer for the overhead tables: a plain training step, as `bare` does."""

    def __init__(self, model, tcfg, device, precision: str):
        self.model = model.to(device).train()
        self.opt = optimizer_for(self.model, tcfg, device.type, model.new_parameters())
        self.dtype = torch.bfloat16 if precision == "bf16" else None
        self.device = device

    def step(self, task: str, b: dict, regression: bool = False) -> None:
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
            logits = self.model(task, **batch_inputs(b)).logits
        task_loss(logits, b["labels"], regression).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def fixed_length_batches(tok, ds, batch_size, length, n, device) -> list[dict]:
    """n batches of real examples truncated / padded to exactly `length` tokens."""
    out = []
    for i in range(n):
        rows = ds.select(range(i * batch_size, (i + 1) * batch_size))
        enc = tok.pad({k: [x[:length] for x in rows[k]] for k in INPUTS if k in rows.column_names},
                      padding="max_length", max_length=length, return_tensors="pt")
        enc["labels"] = torch.tensor(rows["label"])
        out.append({k: v.to(device) for k, v in enc.items()})
    return out


def full_batches(batch_size, length, n, device, seed: int = 0) -> list[dict]:
    """n batches of random token ids with every token real (no padding): HIRE's worst case, as its
    GRUs run over real tokens only while a padded batch lets them stop early."""
    g = torch.Generator().manual_seed(seed)
    out = [{"input_ids": torch.randint(1000, 20000, (batch_size, length), generator=g),
            "attention_mask": torch.ones(batch_size, length, dtype=torch.long),
            "labels": torch.randint(0, 2, (batch_size,), generator=g)} for _ in range(n)]
    return [{k: v.to(device) for k, v in b.items()} for b in out]


def fresh_copy(state: dict) -> dict:
    return copy.deepcopy(state)


def finite(x: float) -> bool:
    return isinstance(x, float) and math.isfinite(x)
