"""`resume=`: which run dir to continue, and with which config (docs/reliability.md, section Resume:
resume=<run dir>, resume=true, resume=auto). A run's starting config is saved once, when it starts, as
<run dir>/run_config.yaml: Hydra rewrites <run dir>/.hydra/config.yaml on every start in that dir, so it
cannot say what the run was (older runs without run_config.yaml fall back to it). The resumed run keeps
writing checkpoints (and run.json) in its original dir; the dir Hydra makes for the resuming command
holds only its log.

run.json is a run dir's record of its MLflow run: the run id, the store (password masked), the experiment
and the status. A resume continues that run, not a new one; the run-dir guard and the orphan reaper
read it too. Written whole (a temporary file, then renamed), never half.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from deepen_run.run.checkpoint import latest, steps_of, usable
from deepen_run.run.clean import RUN_CONFIG, RUN_FILE  # run_config.yaml: the config the run started with, written once
from deepen_run.config.redact import restore_masked, scrub
from deepen_run.config.schema import ROOT, Config
from deepen_run.errors import UserError
from deepen_run.masking import mask_uri, secret_env_values
from deepen_run.run.lifecycle import DirInUse, in_use
from deepen_run.run.progress import job_num

SAVED = Path(".hydra") / "config.yaml"  # Hydra's copy: the config of the LAST command in the dir


def read_run_file(home: Path) -> dict:
    f = home / RUN_FILE
    return json.loads(f.read_text()) if f.is_file() else {}


def write_run_file(home: Optional[Path], run_id: str, uri: str, experiment: str, status: str = "RUNNING") -> None:
    if home is not None and run_id:  # a record on disk: no user:password@'s password
        tmp = home / f".{RUN_FILE}.tmp"  # then renamed: a full disk leaves the old run.json, never half of one
        tmp.write_text(json.dumps({"run_id": run_id, "tracking_uri": mask_uri(uri), "experiment": experiment,
                                   "status": status}))
        tmp.replace(home / RUN_FILE)


def finish(home: Optional[Path], status: str) -> None:
    """Record how the run ended; a FINISHED run drops its full-state checkpoints (optimizer state is
    twice the model, and a finished schedule cannot be continued) and keeps checkpoints/best."""
    info = read_run_file(home) if home is not None else {}
    if not info:
        return
    write_run_file(home, info["run_id"], info["tracking_uri"], info["experiment"], status)
    if status == "FINISHED":
        for _, p in steps_of(home):
            shutil.rmtree(p, ignore_errors=True)


def orphan_note(run_id: str, tags: dict) -> str:
    """What a dead run left to continue from, said truthfully; its run.json is marked KILLED too."""
    if tags.get("sweep_role") == "parent":
        return "rerun the sweep's command with resume=auto to continue it"
    home = Path(tags["run_dir"]) if tags.get("run_dir") else None
    if home is None or read_run_file(home).get("run_id") != run_id:
        return "resume=auto in its run dir continues it"
    finish(home, "KILLED")
    last = latest(home)
    if last is None:
        return f"no checkpoint was saved; resume=auto in {home} runs it again from step 0 as the same run"
    return f"resume=auto in {home} continues it from its checkpoint {last.name}"


def wanted(value) -> Optional[str]:
    """None (no resume), 'latest', 'auto', or a path. None and False read as 'none' and 'false'."""
    low = str(value).strip().lower()
    if low in ("", "false", "null", "none", "no"):
        return None
    return {"auto": "auto", "true": "latest", "yes": "latest", "latest": "latest"}.get(low, str(value))


def saved_config(home: Path) -> Optional[Path]:
    for f in (home / RUN_CONFIG, home / SAVED):
        if f.is_file():
            return f
    return None


def save_run_config(home: Optional[Path], cfg) -> None:
    """Called when a new run starts (never on a resume): what every later resume reads."""
    if home is not None:
        tmp = home / f".{RUN_CONFIG}.tmp"  # no secret on disk: a resume takes them from its own command
        tmp.write_text(OmegaConf.to_yaml(OmegaConf.create(plain_config(cfg, keep_resume=True))))
        tmp.replace(home / RUN_CONFIG)


def current_dir() -> Optional[Path]:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None


def plain_config(cfg, keep_resume: bool = False) -> dict:
    """The config as compared between attempts: unresolved, secrets masked on both sides (the saved
    run_config.yaml holds them masked)."""
    d = OmegaConf.to_container(cfg, resolve=False)
    if not keep_resume:
        d.pop("resume", None)
    return scrub(d, secret_env_values())


def _candidates(here: Optional[Path]) -> set[Path]:
    patterns = [(ROOT / "outputs" / "runs", "*/*"), (ROOT / "outputs" / "multiruns", "*/*/*")]
    if here is not None:
        patterns += [(here.parent, "*"), (here.parent.parent, "*/*")]
    found = {p.resolve() for base, pat in patterns if base.is_dir() for p in base.glob(pat)}
    if here is not None:
        found.add(here.resolve())
    return {p for p in found if saved_config(p) is not None}


def _continuable(home: Path, mine: dict) -> bool:
    return (latest(home) is not None and read_run_file(home).get("status") != "FINISHED"
            and not differences(plain_config(OmegaConf.load(saved_config(home))), mine) and not in_use(home))


def find_latest(cfg, here: Optional[Path], own_first: bool = False, own_only: bool = False) -> Optional[Path]:
    """The unfinished checkpointed run of this exact config (a live one is skipped), or None.
    own_only: a sweep's job continues its own dir's run or none (never another sweep's job)."""
    mine = plain_config(cfg)
    if own_first and here is not None and saved_config(here) is not None and _continuable(here, mine):
        return here.resolve()
    if own_only:
        return None
    homes = [home for home in _candidates(here) if _continuable(home, mine)]
    return max(homes, key=lambda home: latest(home).stat().st_mtime, default=None)  # ties: the first


def check_free(here: Optional[Path]) -> None:
    """A new run must not take over a dir that holds another run's work (one run dir, one run)."""
    if here is not None and in_use(here):
        raise DirInUse.for_dir(here)
    info = read_run_file(here) if here is not None else {}
    if not info:
        return
    if info.get("status") == "FINISHED":
        raise UserError(f"hydra.run.dir={here} holds the FINISHED run {info.get('run_id')}; one run dir holds "
                        "one run: pass another hydra.run.dir")
    if latest(here) is not None:
        raise UserError(f"hydra.run.dir={here} holds the unfinished run {info.get('run_id')} with checkpoints; "
                        "continue it with resume=auto (same config), or pass another hydra.run.dir")


def check_dir(cfg, here: Path) -> None:
    """What `resolve` refuses about the command's own run dir, asked before Hydra rewrites its `.hydra/`
    and log (run/rundir.py): a new run in another run's dir, any resume in a FINISHED run's dir,
    resume=auto there with another config."""
    want, status = wanted(OmegaConf.select(cfg, "resume")), read_run_file(here).get("status")
    if want is None or status == "FINISHED":
        check_free(here)
    elif want == "auto" and status is not None and not in_use(here):
        _same_config(cfg, here)


def config_diff(then, now, prefix: str = "") -> list[str]:
    out = []
    for k in dict.fromkeys([*then, *now]):
        a, b = then.get(k), now.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}")
    return out


def differences(then: dict, now: dict) -> list[str]:
    """config_diff, less the keys a newer deepen-run added that hold their default now: a run saved
    before the key existed ran with that default (e.g. train.model_selection=final)."""
    schema = OmegaConf.structured(Config)
    return [k for k in config_diff(then, now)
            if _at(then, k, _MISSING) is not _MISSING or OmegaConf.select(schema, k, default="<none>") != _at(now, k)]


_MISSING = object()


def _at(d: dict, key: str, missing=None):
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            return missing
        d = d[part]
    return d


def _same_config(cfg, here: Path) -> None:
    """resume=auto in a dir that holds a run: that run's config, or one line naming what differs."""
    f = saved_config(here)
    if f is None:
        return
    then, now = plain_config(OmegaConf.load(f)), plain_config(cfg)
    keys = differences(then, now)
    if keys:
        show = "; ".join(f"{k} was {_at(then, k)!r}, now {_at(now, k)!r}" for k in keys[:3])
        more = f" (and {len(keys) - 3} more)" if len(keys) > 3 else ""
        raise UserError(f"resume=auto: hydra.run.dir={here} holds run {read_run_file(here).get('run_id')} of another "
                        f"config: {show}{more}; drop the change to continue it, or pass another hydra.run.dir")


def _check_overrides(cfg, saved, home: Path) -> None:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    for ov in HydraConfig.get().overrides.task:
        key = ov.split("=", 1)[0].lstrip("+~")
        if key == "resume" or key.startswith("hydra"):
            continue
        now, then = OmegaConf.select(cfg, key), OmegaConf.select(saved, key)
        as_data = (lambda x: OmegaConf.to_container(x, resolve=False) if OmegaConf.is_config(x) else x)  # noqa: E731
        if as_data(now) != as_data(then):
            raise UserError(f"resume: {key} was {as_data(then)!r} in {home} but is {as_data(now)!r} now; a resumed "
                            "run keeps its config (drop the override, or start a new run without resume)")


def resolve(cfg) -> tuple:
    """(config to run, run dir to resume or None)."""
    want, here = wanted(cfg.resume), current_dir()
    if here is not None:  # what the run-dir guard asked before Hydra wrote there; a sweep's job is asked here
        check_dir(cfg, here)  # this dir's own run: a changed override is named, not silently skipped
    if want is None:
        return cfg, None
    if want == "auto" and here is not None and read_run_file(here).get("status") not in (None, "FINISHED") \
            and not in_use(here) and latest(here) is None:
        return cfg, here  # killed before its first checkpoint: the same run again, from step 0
    if want in ("latest", "auto"):
        home = find_latest(cfg, here, own_first=want == "auto", own_only=want == "auto" and job_num() is not None)
        if home is None and want == "auto":
            check_free(here)
            return cfg, None  # nothing to continue: a fresh run
        if home is None:
            raise UserError("resume=true: no checkpointed run of this exact config under outputs/ (or in or next "
                            "to this run's dir); pass resume=<run dir>, or resume=auto to start afresh if none")
    else:
        home = Path(want).expanduser().resolve()
    if saved_config(home) is None:
        raise UserError(f"resume={cfg.resume}: {home} is not a deepen-run run dir (no {RUN_CONFIG} or {SAVED})")
    if read_run_file(home).get("status") == "FINISHED":
        raise UserError(f"resume={cfg.resume}: the run in {home} has FINISHED; start a new run instead")
    if latest(home) is None:
        raise UserError(f"resume={cfg.resume}: {home} has no checkpoint yet (checkpoints/step-N, written every "
                        "train.save_every steps); start the run afresh")
    if usable(home, report=lambda line: print(f"deepen-run: warning: {line}", file=sys.stderr)) is None:
        raise UserError(f"resume={cfg.resume}: every checkpoint in {home}/checkpoints is damaged (see the warnings); "
                        "start the run afresh in another hydra.run.dir")
    saved = OmegaConf.create(restore_masked(OmegaConf.to_container(OmegaConf.load(saved_config(home))),
                                            OmegaConf.to_container(cfg, resolve=False)))
    _check_overrides(cfg, saved, home)
    merged = OmegaConf.merge(OmegaConf.structured(Config), saved)
    merged.resume = str(home)
    return merged, home
