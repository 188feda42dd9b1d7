"""`deepen-probe`: which layers of a pretrained encoder are redundant, and so safe to duplicate?

A second Hydra app on the same conf/ groups (backbone, task) and the same data/tracking keys as
deepen-run (primary config conf/probe.yaml). For every layer it removes it, and separately
duplicates it, and measures the final hidden states against the unmodified model on real dev
inputs (deepen_run/model/probe.py). Records one MLflow run (tag probe=true): probe/redundancy.csv,
probe/redundancy.png, per-layer metrics; prints the table and the suggested layers as the override to paste
(`backbone.duplicate_layers=[i,j]`, with any method).
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from deepen_run.config.schema import ROOT, Inputs  # noqa: E402
from deepen_run.errors import FromRun, UserError, composition_line, fail, fail_with  # noqa: E402

@dataclass
class ProbeSettings:
    """probe.*: the layer redundancy probe.

    samples: dev examples per task
    batch_size: examples per forward pass
    mlm_probability: tokens masked for the MLM reconstruction accuracy (if the head exists)
    suggest: how many layers to suggest for backbone.duplicate_layers
    progress: show a progress bar in a terminal (never in a log file or a pipe)
    """
    samples: int = 256
    batch_size: int = 64
    mlm_probability: float = 0.15
    suggest: int = 2
    progress: bool = True


@dataclass
class ProbeConfig(Inputs):
    """deepen-probe's config: deepen-run's backbone, task, data and tracking keys, and its own.

    seed: random seed (which dev examples and tokens are masked)
    """
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    seed: int = 42


ConfigStore.instance().store(name="probe_schema", node=ProbeConfig)


def checkpoint_keys(bcfg) -> Optional[set]:
    """Tensor names in the backbone's safetensors checkpoint, read from the file header only."""
    from safetensors import safe_open
    from transformers.utils import cached_file

    from deepen_run.model import backbone as bb

    path = bb.resolve(bcfg.path)
    for name in ("model.safetensors", "model.safetensors.index.json"):
        try:
            f = cached_file(path, name, revision=bcfg.revision, local_files_only=bb.local_only(path))
        except OSError:  # this file is not there (or cannot be fetched): try the next
            f = None
        if f and name.endswith(".json"):
            return set(json.load(open(f))["weight_map"])
        if f:
            with safe_open(f, "pt") as fh:
                return set(fh.keys())
    return None


def load(bcfg):
    """(encoder, MLM model sharing that encoder or None, why there is no MLM head)."""
    from transformers import AutoModelForMaskedLM

    from deepen_run.model import backbone as bb
    from deepen_run.model.backbone import resolve

    if not bcfg.pretrained:
        return bb.load_model(bcfg), None, "backbone.pretrained=false: random weights have no pretrained MLM head"
    from deepen_run.model import adapter

    keys = checkpoint_keys(bcfg)
    if keys is not None and not any(k.startswith(adapter.mlm_prefixes(bb.model_type(bcfg))) for k in keys):
        return bb.load_model(bcfg), None, (f"checkpoint {bcfg.path} ships the bare encoder, without its "
                                           "pretrained MLM head")
    path = resolve(bcfg.path)
    mlm, info = AutoModelForMaskedLM.from_pretrained(
        path, revision=bcfg.revision, trust_remote_code=bcfg.trust_remote_code,
        local_files_only=bb.local_only(path), output_loading_info=True, dtype=bb.DTYPE)
    if info["missing_keys"]:  # no safetensors header to read: the load tells us instead
        return bb.load_model(bcfg), None, f"checkpoint {bcfg.path} has no pretrained MLM head weights"
    return mlm.base_model, mlm, ""


def check(cfg) -> list:
    from deepen_run.model import backbone as bb
    from deepen_run.data import loaders as gd
    from deepen_run.data.glue import get_tasks

    from deepen_run.run.preflight import schema_keys

    schema_keys(cfg)  # `+probe.sample=5` adds a key no one reads: refused, naming the nearest
    tasks = get_tasks(list(cfg.task.names))
    p = cfg.probe
    for key in ("samples", "batch_size", "suggest"):
        if not getattr(p, key) > 0:
            raise UserError(f"probe.{key}={getattr(p, key)} must be positive")
    if not 0 < p.mlm_probability < 1:
        raise UserError(f"probe.mlm_probability={p.mlm_probability} must be in (0, 1)")
    if cfg.backbone.duplicate_layers:  # the probe measures copies itself, one layer at a time
        raise UserError("deepen-probe measures the checkpoint's own layers, each removed and duplicated in "
                        "turn: drop backbone.duplicate_layers")
    for key in ("train_fraction", "max_train_samples"):  # accepted silently, they would seem to matter
        if cfg.data[key] is not None:
            raise UserError(f"data.{key}={cfg.data[key]}: deepen-probe reads dev examples only (probe.samples "
                            f"of them, data.max_eval_samples at most): drop data.{key}")
    from deepen_run.run.preflight import seq_length, tracking_store

    OmegaConf.to_object(cfg.data)  # data's own checks (config/checks.py), e.g. data.max_seq_length
    tracking_store(cfg.tracking)
    gd.check_glue_dir(cfg.data.glue_dir, tasks, need_train=False)
    bb.preflight(cfg.backbone)
    seq_length(cfg)  # within the backbone's position table
    from deepen_run.model import adapter

    adapter.refuse_shared(bb.model_type(cfg.backbone), "deepen-probe")
    return tasks


def table(rows: list[dict], ref_acc: float) -> str:
    fmt = lambda v: "     -" if isinstance(v, float) and math.isnan(v) else f"{v:6.4f}"  # noqa: E731
    lines = ["layer  cos_removed  cos_duplicated  mlm_acc_removed  mlm_acc_duplicated"]
    lines += [f"{r['layer']:5d}  {fmt(r['cos_removed']):>11}  {fmt(r['cos_duplicated']):>14}  "
              f"{fmt(r['mlm_acc_removed']):>15}  {fmt(r['mlm_acc_duplicated']):>18}" for r in rows]
    if not math.isnan(ref_acc):
        lines.append(f"unmodified model: mlm_acc {ref_acc:.4f}")
    return "\n".join(lines)


def figure(rows: list[dict], ref_acc: float, title: str):
    from deepen_run.figures import plt

    has_mlm = not math.isnan(ref_acc)
    fig, axes = plt.subplots(1, 2 if has_mlm else 1, figsize=(11 if has_mlm else 6, 4), squeeze=False)
    x = [r["layer"] for r in rows]
    panels = [("cos", "cosine to unmodified model (final hidden states)", None)]
    if has_mlm:
        panels.append(("mlm_acc", "MLM token reconstruction accuracy", ref_acc))
    for ax, (key, ylabel, ref) in zip(axes[0], panels):
        ax.plot(x, [r[f"{key}_removed"] for r in rows], "o-", label="layer removed")
        ax.plot(x, [r[f"{key}_duplicated"] for r in rows], "s-", label="layer duplicated")
        if ref is not None:
            ax.axhline(ref, color="gray", ls="--", label="unmodified")
        ax.set(xlabel="layer (0-based)", ylabel=ylabel, xticks=x)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def run(cfg) -> list[dict]:
    import torch

    from deepen_run.model import backbone as bb
    from deepen_run.data import loaders as gd
    from deepen_run.model import probe
    from deepen_run.config.redact import public_config
    from deepen_run.masking import mask_string, secret_env_values
    from deepen_run.tracking.store import Tracker, flatten

    from deepen_run.run.progress import interactive, quiet_libraries

    tasks = check(cfg)
    quiet_libraries()  # off a terminal (a log file, CI): no "Loading weights" bar redrawn line by line
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment)
    tracker.check()
    t0 = time.time()
    torch.manual_seed(cfg.seed)
    tok = bb.load_tokenizer(cfg.backbone)
    dcfg = OmegaConf.merge(cfg.data, {"max_eval_samples": min(cfg.probe.samples, cfg.data.max_eval_samples
                                                              or cfg.probe.samples)})
    sets = [next(iter(gd.load_task(t, dcfg, tok, cfg.seed, with_train=False).dev.values())) for t in tasks]
    batches = probe.sample_batches(sets, tok, cfg.probe.batch_size)
    encoder, mlm, note = load(cfg.backbone)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    (mlm or encoder).to(device)
    masked = probe.mask_tokens(batches, tok, cfg.probe.mlm_probability, cfg.seed) if mlm is not None else None
    rows, ref_acc = probe.redundancy(encoder, batches, mlm, masked, progress=cfg.probe.progress and interactive())
    suggested = probe.suggest(rows, cfg.probe.suggest)
    n = sum(len(s) for s in sets)

    # tracking.run_name masked as a run's is (run/names.py): a secret variable's value may be in it
    name = mask_string(cfg.tracking.run_name, secret_env_values()) if cfg.tracking.run_name \
        else f"probe-{cfg.backbone.name}-{'+'.join(cfg.task.names)}"
    tracker.start(name, {"probe": "true", "backbone": cfg.backbone.name, "task": "+".join(cfg.task.names)})
    status = "FAILED"
    try:
        tracker.log_params(flatten(public_config(cfg)))  # secrets masked, as a run's params
        csv_rows = [{k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows]
        tracker.log_csv(csv_rows, "probe/redundancy.csv")
        title = f"{cfg.backbone.name} on {'+'.join(cfg.task.names)} dev ({n} examples)"
        tracker.log_figure(figure(rows, ref_acc, title), "probe/redundancy.png")
        for r in rows:
            tracker.log_metrics({f"probe/{k}": v for k, v in r.items() if k != "layer" and not math.isnan(v)},
                                r["layer"])
        extra = {} if math.isnan(ref_acc) else {"probe/mlm_acc_reference": ref_acc}
        tracker.log_metrics({"probe/num_examples": n, "probe/runtime_s": time.time() - t0, **extra}, 0)
        # The override exactly as deepen-run takes it, so it can be pasted after any method.
        advice = (f"suggested: backbone.duplicate_layers=[{','.join(map(str, suggested))}] (the {len(suggested)} "
                  "layers whose duplication moves the final hidden states least: highest cos_duplicated)")
        text = table(rows, ref_acc) + ("" if mlm is not None else f"\nmlm_acc: empty, {note}") + "\n" + advice
        tracker.log_text(text + "\n", "probe/summary.txt")
        tracker.set_tags({"probe.suggested_layers": str(suggested)} | ({"probe.mlm_note": note} if note else {}))
        print(text)
        print(f"probe: {n} examples, {time.time() - t0:.1f}s")
        status = "FINISHED"
    finally:
        tracker.end(status)
    return rows


@hydra.main(version_base=None, config_path=str(ROOT / "conf"), config_name="probe")
def _hydra_main(cfg) -> None:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        run(cfg)  # a UserError goes on to rundir.RunDirGuard: it removes what this attempt made, prints it
    except (HydraException, OmegaConfBaseException) as e:
        raise FromRun(e) from e  # the probe's own error (a bug), not a composition error: its traceback


def main() -> None:
    from deepen_run.cli.usage import probe_help, wants_help

    if wants_help(sys.argv):  # our own page (every key, from the schema) instead of Hydra's generic one
        print(probe_help(ProbeConfig))
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"  # composition errors come to us, as in deepen-run (cli/run.py)
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        _hydra_main()
    except UserError as e:  # a -m job's (a single run's is printed by rundir.RunDirGuard)
        fail_with(e, "deepen-probe")
    except FromRun as e:
        raise e.error from None
    except (HydraException, OmegaConfBaseException) as e:
        from deepen_run.run.preflight import typo

        better = typo(str(e), sys.argv[1:], app="probe")  # a key without + that the schema lacks
        fail(str(better) if better else composition_line(e, sys.argv[1:]), 2, prog="deepen-probe")


if __name__ == "__main__":
    main()
