"""A sweep checks every job's config before it launches any.

Hydra composes a job's config only when that job starts, so one bad value in `train.batch_size=8,16,abc`
would surface in job 3, after jobs 1 and 2 ran. Here the launching process enumerates the jobs with
Hydra's BasicSweeper's own split, composes each and runs the pre-flight: the first bad job is named in one line (exit 2) before the parent run exists.
The data checks parse every TSV row, so they run once per distinct set of inputs. An Optuna sweep
draws its values as it goes and is not checked: with the searched keys at their defaults, a check
that ties a fixed key to a searched one would refuse a valid search.
"""
from __future__ import annotations

import copy

from hydra import compose
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from deepen_run.errors import UserError, composition_line
from deepen_run.util import one_line


def job_overrides(config) -> list[list[str]] | None:
    """Each job's overrides, in launch order, as Hydra's BasicSweeper splits them (its own function),
    or None for another sweeper."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    if not str(OmegaConf.select(config, "hydra.sweeper._target_", default="")).endswith("BasicSweeper"):
        return None
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    args = [f"{k}={v}" for k, v in params.items()] + [str(o) for o in config.hydra.overrides.task]
    try:
        return BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(args), None)[0]
    except Exception:  # noqa: BLE001 (interval(...): for a sampling sweeper; glob(): needs Hydra's config loader)
        return None


def composer(config_name: str):
    """compose(job) for the jobs of one sweep: most sweeps repeat each setting over seeds, so a setting
    is composed once and each of its seeds gets a copy with `seed` set, which is what composing that
    job gives (a plain value; a `${seed}` elsewhere resolves when read)."""
    made: dict[tuple, object] = {}

    def one(job: list[str]):
        seeds = [o for o in job if o.startswith("seed=") and o[5:].isascii() and o[5:].isdigit()]
        rest = tuple(o for o in job if o not in seeds)
        if len(seeds) != 1 or any(o.lstrip("+~").partition("=")[0] == "seed" for o in rest):  # ++seed=7 after it
            return compose(config_name=config_name, overrides=job)
        if rest not in made:
            made[rest] = compose(config_name=config_name, overrides=job)
        cfg = copy.deepcopy(made[rest])
        cfg.seed = int(seeds[0][5:])
        return cfg

    return one


def _one_line(e: BaseException) -> str:
    """The error and its cause (Hydra wraps what OmegaConf said), folded onto one line."""
    cause = e.__cause__
    return one_line(f"{e} {cause}" if cause is not None and str(cause) not in str(e) else e)


def check_signal_time(config) -> None:
    """SLURM sends --signal's SIGUSR2 up to 60 s before signal_delay_s says (its time-limit checks come
    every 30 s; sbatch(1)). One that comes while the job's Python starts, before submitit's handler,
    ends the job with no checkpoint, no requeue and no result (a launcher without sacct then waits for
    ever): a job gets at least a minute to start."""
    launcher = OmegaConf.select(config, "hydra.launcher", default=None)
    if launcher is None or not str(launcher.get("_target_", "")).endswith("SlurmLauncher"):
        return
    limit, delay = int(launcher.timeout_min), int(launcher.signal_delay_s)
    if limit * 60 < delay + 120:
        raise UserError(f"hydra.launcher.signal_delay_s={delay} with hydra.launcher.timeout_min={limit}: SLURM may "
                        "send SIGUSR2 up to 60 s earlier, while a job is still starting, and the job would end "
                        f"unsaved and not requeued; keep timeout_min*60 >= signal_delay_s + 120 (timeout_min="
                        f"{-(-(delay + 120) // 60)} or more); nothing was launched")


def check_jobs(config) -> None:
    check_signal_time(config)
    jobs = job_overrides(config)
    if jobs is None:
        return
    from deepen_run.run.preflight import check, numbers, typo
    from deepen_run.run.resume import plain_config

    compose = composer(config.hydra.job.config_name)
    seen: set[str] = set()
    for k, job in enumerate(jobs):
        swept = [o for i, o in enumerate(job) if len({j[i] for j in jobs}) > 1] or job  # what names it to the user
        which = f"sweep job {k + 1} of {len(jobs)} ({' '.join(swept)})"
        try:
            cfg = compose(job)
            numbers(cfg)
            inputs = {k: v for k, v in plain_config(cfg).items() if k not in ("seed", "train", "schedule", "tracking")}
            key = OmegaConf.to_yaml(OmegaConf.create(inputs))
            if key not in seen:
                check(cfg)
                seen.add(key)
        except UserError as e:
            raise UserError(f"{which}: {_one_line(e)}; nothing was launched") from None
        except Exception as e:  # noqa: BLE001 (Hydra/OmegaConf composition errors: wrong type, unknown key)
            methods = {o for j in jobs for o in j if o.lstrip("+~").startswith("method=")}
            said = typo(str(e), job, methods_swept=len(methods) > 1) or (
                composition_line(e, job) if isinstance(e, (HydraException, OmegaConfBaseException)) else
                f"{type(e).__name__}: {_one_line(e)}")
            raise UserError(f"{which}: {said}; nothing was launched") from None
