"""Training-step cost of method=hire relative to the baseline, same backbone, same batches.

    PYTHONPATH=. python scripts/bench_hire.py [--repeats 7] [--backbone minilm] [overrides...]

Both models are built through the normal path (Hydra config -> backbone.load_model -> method.build ->
train.optimizer_for) and timed on identical batches: one step = forward, loss, backward, AdamW step.
Two batch kinds, 32 x 64 tokens: `full` (every token real: the worst case for HIRE, whose GRUs run
over real tokens only) and `sst2` (real SST-2 sentences, dynamically padded, truncated at 64).
Median over repeats, the two models interleaved so machine noise hits both alike. Prints a table
and writes the numbers as JSON to --out if given.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from deepen_run import backbone as bb  # noqa: E402
from deepen_run import duplication  # noqa: E402
from deepen_run.config import ROOT, register  # noqa: E402
from deepen_run.glue import get_tasks  # noqa: E402
from deepen_run.methods import METHODS  # noqa: E402
from deepen_run.model import count, task_loss  # noqa: E402
from deepen_run.train import optimizer_for  # noqa: E402


def compose(*overrides: str):
    from hydra import compose as hcompose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return hcompose(config_name="config", overrides=list(overrides))


def build(method: str, overrides: list[str], device: str):
    cfg = compose(f"method={method}", *overrides)
    torch.manual_seed(0)
    backbone = duplication.load(cfg)
    model = METHODS[method].build(backbone, cfg.method, get_tasks(["sst2"])).to(device).train()
    return model, optimizer_for(model, cfg.train, device), cfg


def batches(kind: str, cfg, n: int, B: int, T: int, device: str) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    if kind == "full":
        out = [{"input_ids": torch.randint(1000, 20000, (B, T), generator=g),
                "attention_mask": torch.ones(B, T, dtype=torch.long)} for _ in range(n)]
    else:
        import csv

        tok = bb.load_tokenizer(cfg.backbone)
        glue = cfg.data.glue_dir or str(ROOT.parent / "shared" / "glue")
        with open(Path(glue) / "SST-2" / "train.tsv", newline="") as fh:
            rows = [r[0] for r in csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)][1:]
        idx = torch.randperm(len(rows), generator=g)[: n * B].tolist()
        out = [dict(tok([rows[i] for i in idx[k * B:(k + 1) * B]], truncation=True, max_length=T, padding=True,
                        return_tensors="pt")) for k in range(n)]
    for b in out:
        b.pop("token_type_ids", None)
        b["labels"] = torch.randint(0, 2, (B,), generator=g)
    return [{k: v.to(device) for k, v in b.items()} for b in out]


def step(model, opt, b) -> None:
    logits = model("sst2", input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    task_loss(logits, b["labels"], False).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def step_times(models: dict, data: list[dict], repeats: int, device: str) -> dict[str, float]:
    """Median seconds per step for each (model, optimizer), interleaved over the same batches."""
    for model, opt in models.values():  # warm-up: allocator, kernels, lazy init
        for b in data[:2]:
            step(model, opt, b)
    times = {name: [] for name in models}
    for r in range(repeats):
        b = data[r % len(data)]
        for name, (model, opt) in models.items():
            sync(device)
            t0 = time.perf_counter()
            step(model, opt, b)
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--kinds", default="full,sst2")
    ap.add_argument("--backbone", default="minilm")
    ap.add_argument("--out")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for the hire model, e.g. method.gru_layers=3")
    a = ap.parse_args()
    register()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = build("baseline", [f"backbone={a.backbone}"], device)
    hire = build("hire", [f"backbone={a.backbone}", *a.overrides], device)
    models = {"baseline": base[:2], "hire": hire[:2]}
    result = {"device": device, "threads": torch.get_num_threads(), "backbone": a.backbone,
              "overrides": a.overrides, "params": {k: count(m) for k, (m, _) in models.items()}}
    print(f"{'batches':8s} {'baseline s':>11s} {'hire s':>8s} {'ratio':>6s}")
    for kind in a.kinds.split(","):
        data = batches(kind, base[2], min(a.repeats, 4), a.batch, a.length, device)
        t = step_times(models, data, a.repeats, device)
        ratio = t["hire"] / t["baseline"]
        result[kind] = {**t, "ratio": ratio, "tokens": int(sum(b["attention_mask"].sum() for b in data))}
        print(f"{kind:8s} {t['baseline']:11.3f} {t['hire']:8.3f} {ratio:6.2f}x")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
