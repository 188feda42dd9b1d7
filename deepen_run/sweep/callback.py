"""A multirun as one MLflow parent run with one child run per job: the launching process's side.

`SweepCallback` (hydra.callbacks in conf/config.yaml) checks every job's config before any starts,
then creates the parent run (and with it the store's schema, so parallel jobs never race on it) and
the sweep's identity for the jobs. The open sweep is a `Launch` (launch.py), which closes the parent
when the sweep ends; a sweep dir that holds a sweep is continued with resume=auto (resume.py).
Light at import: Hydra instantiates the callback for every run.
"""
from __future__ import annotations

import os
import shlex
import signal
import time
import uuid
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from deepen_run.config.redact import mask_logs
from deepen_run.errors import UserError, fail, fail_with
from deepen_run.masking import mask_override, mask_uri
from deepen_run.run.clean import SWEEP_FILE
from deepen_run.run.stop import StopFlag
from deepen_run.sweep import summary as sweep_summary
from deepen_run.sweep.outcomes import previous, write_json


def sweep_params(config) -> dict[str, str]:
    """The sweep's overrides as params of the parent: `seed` = `1,2,3,4` sits in the seed column.
    Secrets masked: the params, the run note's command and deepen_sweep.json all come from here."""
    task = [mask_override(str(o)) for o in config.hydra.overrides.task]
    space = [mask_override(f"{k}={v}") for k, v in (OmegaConf.select(config, "hydra.sweeper.params") or {}).items()]
    # the command line's value of a key wins over the preset's, as in Hydra
    out = {key.lstrip("+~"): value for key, _, value in (o.partition("=") for o in space + task)}
    out["sweep.overrides"] = shlex.join(task)  # quoted as a shell takes them: the note's command pastes
    out["sweep.hydra_overrides"] = shlex.join(mask_override(str(o)) for o in config.hydra.overrides.hydra)
    return out


class SweepCallback(Callback):
    def __getstate__(self):  # launchers pickle the callback into every job: the open sweep stays here
        return {k: v for k, v in self.__dict__.items() if k != "launch"}

    def on_multirun_start(self, config, **kwargs) -> None:
        flag = StopFlag().install()  # a signal from here on is recorded, never raised into a write of open_sweep
        try:
            self.launch = open_sweep(config, flag)
        except UserError as e:  # every job's config, the store, the sweep's identity: before anything runs
            fail_with(e)
        except BaseException:
            flag.uninstall()  # Hydra 1.3 warns of a callback's error and goes on: no stray flag for the jobs
            raise

    def on_multirun_end(self, config, **kwargs) -> None:  # in the launching process, after on_multirun_start
        self.launch.end()


def open_sweep(config, flag):
    """Check every job, then create the parent run (or reopen it: resume=auto) and start watching."""
    from deepen_run.run.lifecycle import provenance, reap_orphans
    from deepen_run.run.resume import orphan_note, wanted
    from deepen_run.sweep.check import check_jobs
    from deepen_run.sweep.launch import Launch
    from deepen_run.sweep.resume import check_same, hold, jobs_of, reopen
    from deepen_run.tracking.store import Tracker

    mask_logs()  # Hydra's launcher logs each job's overrides
    sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
    params, jobs = sweep_params(config), jobs_of(config)
    old = previous(sweep_dir)  # a sweep dir holds one sweep: continued with resume=auto, else refused
    lock = None
    if old is not None:
        lock = hold(sweep_dir)  # before anything else: a second resume of it at once is refused here
        check_same(old, params, jobs, sweep_dir, resume=wanted(config.resume) is not None)
    check_jobs(config)
    sweeper = str(OmegaConf.select(config, "hydra.sweeper._target_", default=""))  # Optuna's: n_trials jobs
    n = len(jobs) if jobs is not None else int(config.hydra.sweeper.n_trials) if "optuna" in sweeper.lower() else None
    uri, experiment = config.tracking.uri, config.tracking.experiment
    tracker = Tracker(uri, experiment)
    tracker.check()
    reap_orphans(tracker, note=orphan_note)  # runs (and a parent) whose process died, once for all the jobs
    lock = lock or hold(sweep_dir)  # makes deepen_jobs/ too
    target = lambda key: str(OmegaConf.select(config, key, default="?")).rsplit(".", 1)[-1]  # noqa: E731
    # pid/host: a SIGKILLed launcher's parent is reaped like a run (lifecycle.reap_orphans)
    tags = {"sweep_role": "parent", "sweep_dir": str(sweep_dir), "launcher": target("hydra.launcher._target_"),
            "sweeper": target("hydra.sweeper._target_")} \
        | {k: v for k, v in provenance().items() if k in ("pid", "host", "command", "git_commit")}
    if flag.requested() is not None:  # before the parent run is made: nothing of this sweep is recorded
        fail(f"stopped by {signal.Signals(flag.signum).name} while the sweep was checked; nothing ran; the same "
             "command starts it again", 128 + flag.signum)
    if old is not None:  # the file holds the store's URI masked: this command's is the one to use
        info = old | {"uri": uri, "launcher_pid": os.getpid(), "attempt": old.get("attempt", 1) + 1}
        first_step = reopen(old, tracker, tags | {"sweep_id": old["sweep_id"]})
    else:
        sweep_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]
        parent = tracker.start(sweep_summary.parent_name(config, params), tags | {"sweep_id": sweep_id})
        tracker.log_params(params | {"sweep.jobs": n if n is not None else "?"})
        info = {"sweep_id": sweep_id, "parent_run_id": parent, "uri": uri, "experiment": experiment, "n_jobs": n,
                "dir": str(sweep_dir), "params": params, "jobs": jobs, "launcher_pid": os.getpid(), "attempt": 1}
        first_step = 0
    write_json(sweep_dir / SWEEP_FILE, info | {"uri": mask_uri(uri)})

    again = f"; attempt {info['attempt']}, continuing the interrupted sweep" if old is not None else ""
    print(f"[sweep {info['sweep_id']}] {n if n is not None else '?'} jobs; parent run {info['parent_run_id']} in "
          f"experiment {experiment!r} ({mask_uri(uri)}); outputs in {sweep_dir}{again}", flush=True)
    launch = Launch(info, tracker, first_step, lock).begin(flag)
    sweep_summary.start(info, tracker)  # the run note (results table), kept up to date as jobs end
    return launch
