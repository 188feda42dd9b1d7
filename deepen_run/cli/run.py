"""`deepen-run`: the Hydra entry point. Bad input prints one line and exits 2, before heavy work.

- Composition errors (unknown group option or key, wrong type, bad override syntax) are Hydra's
  own message, folded onto one line: `main` asks Hydra to raise them (HYDRA_FULL_ERROR) instead of
  printing them over several lines, and prints them itself.
- The pre-flight (deepen_run/run/preflight.py) runs before torch, the model or an MLflow run.
- A UserError before an MLflow run exists removes what the attempt created, and nothing else
  (deepen_run/run/rundir.py): deepen-run deletes only files it created.
- In a sweep, a failing job is recorded (FAILED child) and returns NaN so the other jobs go on
  (deepen_run/sweep/callback.py).
- Ctrl-C / SIGTERM / SIGHUP / SIGUSR1 / SIGUSR2 are recorded (run/stop.py); the run ends KILLED with a
  checkpoint at its next check; exit code 128 + signal number (a sweep too: every job and the parent end KILLED).
- One run dir holds one run: the run's dir is locked for its life (lifecycle.run_dir_lock).
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from deepen_run.run.threads import quiet_waits  # noqa: E402 (before anything loads torch: libgomp reads it then)

quiet_waits()

import hydra  # noqa: E402

from deepen_run.config.schema import ROOT, Config, register  # noqa: E402
from deepen_run.errors import FromRun, UserError, composition_line, fail, fail_with  # noqa: E402
from deepen_run.methods import schemas  # noqa: E402
from deepen_run.util import QuickExit, first_line, one_line, phase  # noqa: E402

register(schemas())


def _log_only(msg: str) -> None:
    """Record the error in the job's log file, not on the console (stderr already has it)."""
    rec = logging.LogRecord("deepen_run", logging.ERROR, __file__, 0, msg, None, None)
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            h.handle(rec)


# Under `accelerate launch` / torchrun every process runs this entry point. Rank 0 keeps Hydra's
# run directory (.hydra/ config, log file, checkpoints); the others get a private scratch dir,
# removed at exit, with no .hydra/ and no log: one run leaves one directory, and no code that
# writes to (or cleans) "the run dir" can touch rank 0's or the user's working directory.
# RANK is the global rank both launchers set (multi-node included).
QUIET_RANK = (("hydra.output_subdir", "null"), ("hydra/job_logging", "disabled"), ("hydra/hydra_logging", "disabled"))


def quiet_other_ranks(argv: list[str]) -> list[str]:
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        return argv
    scratch = tempfile.mkdtemp(prefix=f"deepen-run-rank{rank}-")
    atexit.register(shutil.rmtree, scratch, True)
    quiet = {"hydra.run.dir": scratch, **dict(QUIET_RANK)}
    # Replace, not add: Hydra rejects a key given twice, and rank 0 alone owns the run dir.
    keep = [a for a in argv[1:] if a.split("=", 1)[0].lstrip("+~") not in quiet]
    return argv[:1] + keep + [f"{k}={v}" for k, v in quiet.items()]


def resolve_on_every_rank(cfg) -> tuple:
    """resume.resolve() on rank 0, whose answer the other ranks take: in their scratch dirs resume=auto
    would find no run, start afresh and wait on rank 0's collectives forever."""
    from deepen_run.run import resume

    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return resume.resolve(cfg)
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list, parse_flag_from_env
    from omegaconf import OmegaConf

    from deepen_run.run.fast import cpu_processes

    # The process group the run's Accelerator joins (reading ACCELERATE_USE_CPU as it does).
    main = PartialState(cpu=cpu_processes() or parse_flag_from_env("ACCELERATE_USE_CPU")).is_main_process
    answer, failed = [None], None
    if main:
        try:
            cfg, home = resume.resolve(cfg)
            answer = [(None, OmegaConf.to_container(cfg, resolve=False), home)]
        except Exception as e:  # noqa: BLE001 (re-raised below, after every rank has the line to stop with)
            user = isinstance(e, UserError)
            answer, failed = [((user, str(e) if user else f"rank 0: {first_line(e, 2000)}"), None, None)], e
    error, config, home = broadcast_object_list(answer)[0]
    if failed is not None:
        raise failed
    if error is not None:
        raise (UserError if error[0] else RuntimeError)(error[1])
    if main or home is None:
        return cfg, home
    return OmegaConf.merge(OmegaConf.structured(Config), config), home  # rank 0's run, as it resolved it


def _task(cfg) -> float:
    from deepen_run.run.progress import copied_to_log
    from deepen_run.run.stop import Stopped
    from deepen_run.sweep.jobs import current_job

    phase("composed")
    job = current_job()
    with copied_to_log():  # the run dir's log holds what the run printed
        if job is not None:
            return job.run(cfg, checked_run)  # a failing job returns None (jobs.NO_SCORE): the sweep goes on
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        try:
            return checked_run(cfg)
        except (HydraException, OmegaConfBaseException) as e:
            raise FromRun(e) from e
        except UserError as e:
            _log_only(one_line(e))
            raise  # through Hydra: rundir.RunDirGuard removes what this attempt created, then prints it
        except Stopped as e:
            print(f"\ndeepen-run: stopped by {e}; {_what_is_left(e)}", file=sys.stderr)
            sys.exit(128 + e.signum)


def _what_is_left(e) -> str:
    """The truth about a stopped run: its record says which checkpoint it left (if it got that far)."""
    if not e.recorded:
        return "no MLflow run had started yet; nothing to continue"
    if e.checkpoint is None:
        return "the run is KILLED with no checkpoint (resume=auto runs it again from step 0 as the same run)"
    return f"the run is KILLED, its checkpoint {e.checkpoint.name} kept (continue with resume=auto)"


def _hydra_main() -> None:
    hydra.main(version_base=None, config_path=str(ROOT / "conf"), config_name="config")(_task)()


def checked_run(cfg, tags: dict[str, str] | None = None) -> float:
    """Resume lookup, pre-flight, then the run itself, with the signals recorded (run/stop.py) from
    the start: a sweep job has installed its own flag, a single run installs one here."""
    from contextlib import nullcontext

    from deepen_run.run import resume
    from deepen_run.run.lifecycle import run_dir_lock
    from deepen_run.run.stop import StopFlag, installed

    own = StopFlag().install() if installed() is None else None
    try:
        cfg, home = resolve_on_every_rank(cfg)
        folder = home or resume.current_dir()
        # Only rank 0 owns the run dir; the other ranks of a multi-process run share its home.
        holding = run_dir_lock(folder, resuming=home is not None) \
            if folder is not None and os.environ.get("RANK", "0") == "0" else nullcontext()
        with holding:
            tasks = _checked(cfg, home)
            from deepen_run.run.runner import run

            return run(cfg, tasks, home, tags=tags)
    finally:
        if own is not None:
            own.uninstall()


def _checked(cfg, home) -> list:
    """The pre-flight -> the tasks; a resumed run's data must be what it started with."""
    from omegaconf.errors import InterpolationResolutionError

    from deepen_run.data.fingerprint import same_data
    from deepen_run.run.preflight import check

    try:
        tasks = check(cfg)
    except InterpolationResolutionError as e:  # a value the command leaves unset (${oc.env:...}): input
        raise UserError(f"{type(e).__name__}: {one_line(e)}") from None
    phase("checked")
    if home is not None:
        same_data(home, cfg, tasks)  # a resumed run trains on the data it started with
    return tasks


def counted_switches(overrides: list[str]) -> None:
    """OmegaConf reads any integer given to a bool key as true or false: train.eval_per_epoch=2 meant
    two evaluations an epoch to its user, and got one. Refused, as a value Hydra rejects is. Each
    override is read by Hydra's own parser (sweeps, choice(), range(), quoted values)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from deepen_run.config.keys import bool_keys

    switches, parser = bool_keys(schemas()), OverridesParser.create()
    for arg in overrides:
        try:
            o = parser.parse_override(arg)
            values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
        except Exception:  # noqa: BLE001 (a flag, or what Hydra itself refuses, in its own words)
            continue
        numbers = [v for v in values if not isinstance(v, bool) and str(v).strip().lstrip("-").isdigit()]
        if o.key_or_group in switches and any(int(v) not in (0, 1) for v in numbers):
            more = "; to evaluate more often, give train.eval_every=<steps>" if "eval_per_epoch" in arg else ""
            fail(f"{arg}: {o.key_or_group} is a switch (true or false), not a number{more}", 2)


def main() -> None:
    from deepen_run.cli.usage import run_help, wants_help

    if wants_help(sys.argv):  # our own page (every key, from the schema) instead of Hydra's generic one
        print(run_help())
        return
    phase("main")
    late = [a for a in sys.argv[2:] if a in ("-m", "--multirun")]
    if late:  # Hydra's argparse would say only "unrecognized arguments"
        fail(f"{late[0]} goes first: deepen-run -m <overrides> (a sweep), e.g. deepen-run -m seed=1,2 task=rte", 2)
    shown = [a for a in sys.argv[1:] if a in ("-c", "--cfg", "-i", "--info")]
    if shown and sys.argv[1:2] in (["-m"], ["--multirun"]):  # Hydra raises a ValueError with its traceback
        fail(f"{sys.argv[1]} and {shown[0]} do not go together: {shown[0]} prints one job's config; drop "
             f"{sys.argv[1]} (and give one value a key) to see it", 2)
    keys = {a.split("=", 1)[0].lstrip("+~"): a for a in sys.argv[1:] if "=" in a}
    if "arm" in keys and "method" in keys:  # an arm picks the method (conf/arm/): two choices, one wins
        fail(f"{keys['arm']} and {keys['method']}: an arm sets the method itself (conf/arm/); drop "
             f"{keys['method']}, or the arm", 2)
    counted_switches(sys.argv[1:])
    sys.argv = quiet_other_ranks(sys.argv)
    os.environ["HYDRA_FULL_ERROR"] = "1"  # raise composition errors to us instead of printing them
    from deepen_run.run.progress import quiet_warnings

    quiet_warnings()  # library warnings no user can act on (joblib's recycled workers)
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from deepen_run.run.stop import Stopped

    try:
        _hydra_main()
    except Stopped as e:  # a sweep's job stopped by a signal (a single run exits in _task)
        sys.exit(128 + e.signum)  # its parent is closed KILLED at exit (sweep/launch.py)
    except KeyboardInterrupt:  # Ctrl-C before a run or sweep installed its stop flag (composing, checking)
        fail("stopped by SIGINT while starting; the same command starts it again", 130)
    except UserError as e:  # normally printed by rundir.RunDirGuard.on_run_end, before Hydra's own line
        fail_with(e)
    except FromRun as e:
        raise e.error from None  # the run's own error, as it was raised there
    except ValueError as e:
        # Optuna's sweeper asks for the best trial once all have run; with every trial failed there is
        # none. Each trial is a FAILED child with its error tag; the parent ends FAILED at exit.
        if not str(e).startswith("No trials are completed yet"):
            raise
        exit_if_stopped()  # none completed because the search was stopped
        fail(f"every trial of the search failed (Optuna: {one_line(e)}); each trial's child run has an "
             "`error` tag that says why, and the sweep's parent run is FAILED", 1)
    except (HydraException, OmegaConfBaseException) as e:
        from deepen_run.run.preflight import typo

        better = typo(str(e), sys.argv[1:])  # a key without + that the schema lacks: did you mean ...
        fail(str(better) if better else composition_line(e, sys.argv[1:]), 2)
    except Exception as e:
        if type(e).__name__ == "UncompletedJobError":  # submitit: a job with no result, interrupted by the stop?
            exit_if_stopped()
        raise


def exit_if_stopped() -> None:
    """Exit 128 + signal if this process's sweep was stopped by one: the sweeper's complaint about the
    jobs the stop interrupted is not a failure. Its parent is closed KILLED at exit, with the sweep's
    line (sweep/launch.py)."""
    from deepen_run.run.stop import installed
    from deepen_run.sweep.launch import Launch

    launch = installed(Launch)
    if launch is not None and launch.signum is not None:
        sys.exit(128 + launch.signum)


def entry() -> None:
    """The console script: main(), then an exit without the interpreter's slow teardown once a run
    (or a sweep) has returned and recorded everything (util.QuickExit). Error exits stay ordinary."""
    exit_now = QuickExit()  # first: its atexit handler must run after every other one
    main()
    phase("exit")
    exit_now(0)


if __name__ == "__main__":
    entry()
