"""`resume=`: which run dir to continue, and with which config.

resume=<run dir>  continue that run with the config it was started with (its .hydra/config.yaml);
                  an override given now must agree with it, else one error line names the key.
resume=true       the most recently checkpointed run dir whose config equals this command's config,
                  looked for next to this run's dir (the default layout: outputs/runs/<date>/<time>)
                  and under outputs/runs and outputs/multiruns.
The resumed run keeps writing checkpoints (and run.json) in its original dir; the dir Hydra makes
for the resuming command holds only that command's log and .hydra/.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from deepen_run.checkpoint import latest, read_run_file
from deepen_run.config import ROOT, Config
from deepen_run.errors import UserError

SAVED = Path(".hydra") / "config.yaml"


def wanted(value) -> Optional[str]:
    """None (no resume), 'latest', or a path."""
    if value is None or value is False or str(value).strip().lower() in ("", "false", "null", "none", "no"):
        return None
    return "latest" if value is True or str(value).strip().lower() in ("true", "yes", "latest") else str(value)


def current_dir() -> Optional[Path]:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None


def _plain(cfg) -> dict:
    d = OmegaConf.to_container(cfg, resolve=False)
    d.pop("resume", None)
    return d


def _candidates(here: Optional[Path]) -> set[Path]:
    patterns = [(ROOT / "outputs" / "runs", "*/*"), (ROOT / "outputs" / "multiruns", "*/*/*")]
    if here is not None:
        patterns += [(here.parent, "*"), (here.parent.parent, "*/*")]
    found = {p.resolve() for base, pat in patterns if base.is_dir() for p in base.glob(pat) if (p / SAVED).is_file()}
    return found - ({here.resolve()} if here is not None else set())


def find_latest(cfg, here: Optional[Path]) -> Path:
    mine = _plain(cfg)
    best = None
    for home in _candidates(here):
        ckpt = latest(home)
        if ckpt is not None and read_run_file(home).get("status") != "FINISHED" and _plain(OmegaConf.load(home / SAVED)) == mine:
            if best is None or ckpt.stat().st_mtime > best[0]:
                best = (ckpt.stat().st_mtime, home)
    if best is None:
        raise UserError("resume=true: no checkpointed run of this exact config under outputs/ (or next to "
                        "this run's dir); pass resume=<run dir>, or drop resume to start afresh")
    return best[1]


def _check_overrides(cfg, saved, home: Path) -> None:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    for ov in HydraConfig.get().overrides.task:
        key = ov.split("=", 1)[0].lstrip("+~")
        if key == "resume" or key.startswith("hydra"):
            continue
        now, then = OmegaConf.select(cfg, key), OmegaConf.select(saved, key)
        as_data = (lambda x: OmegaConf.to_container(x, resolve=False) if OmegaConf.is_config(x) else x)
        if as_data(now) != as_data(then):
            raise UserError(f"resume: {key} was {as_data(then)!r} in {home} but is {as_data(now)!r} now; a resumed "
                            "run keeps its config (drop the override, or start a new run without resume)")


def resolve(cfg) -> tuple:
    """(config to run, run dir to resume or None)."""
    want = wanted(cfg.resume)
    if want is None:
        return cfg, None
    here = current_dir()
    home = find_latest(cfg, here) if want == "latest" else Path(want).expanduser().resolve()
    if not (home / SAVED).is_file():
        raise UserError(f"resume={cfg.resume}: {home} is not a deepen-run run dir (no {SAVED})")
    if read_run_file(home).get("status") == "FINISHED":
        raise UserError(f"resume={cfg.resume}: the run in {home} has FINISHED; start a new run instead")
    if latest(home) is None:
        raise UserError(f"resume={cfg.resume}: {home} has no checkpoint yet (checkpoints/step-N, written every "
                        "train.save_every steps); start the run afresh")
    saved = OmegaConf.load(home / SAVED)
    _check_overrides(cfg, saved, home)
    merged = OmegaConf.merge(OmegaConf.structured(Config), saved)
    merged.resume = str(home)
    return merged, home
