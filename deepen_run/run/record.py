"""One object closes a run's record: RunRecord opens (or resumes) the MLflow run and run.json, and on
exit writes exactly one ending, the same in both: FINISHED on a clean exit, KILLED (after the last
step's checkpoint is saved) when `Stopped` arrives, FAILED with the error's first line otherwise.

A signal only sets a flag (run/stop.py), so nothing here is ever interrupted half-way: no MLflow call
needs guarding and MLflow's status and run.json's always agree.
"""
from __future__ import annotations

from typing import Optional

from deepen_run.data.fingerprint import save_fingerprint
from deepen_run.run import checkpoint as ck
from deepen_run.run import resume, summary
from deepen_run.run.lifecycle import provenance
from deepen_run.run.stop import Stopped
from deepen_run.tracking.models import system_metrics
from deepen_run.tracking.store import TrackingLost
from deepen_run.util import first_line, phase


class RunRecord:
    """with RunRecord(...) as rec: the run's life. rec.saver: the checkpointer, once the recipe has one
    (a stopped run saves its last step through it); rec.restored: false while a resume has not yet
    loaded its checkpoint (a failure then keeps the run's earlier status)."""

    def __init__(self, cfg, tasks: list, tracker, home, name: str, tags: dict, run_id: Optional[str],
                 main_process: bool):
        self.cfg, self.tasks, self.tracker, self.home, self.name, self.tags = cfg, tasks, tracker, home, name, tags
        self.run_id, self.main_process, self.restored = run_id, main_process, not run_id
        self.before = tracker.client.get_run(run_id).info.status if run_id and tracker.enabled else ""
        self.saver: Optional[ck.Checkpointer] = None
        self.monitor = None

    def __enter__(self) -> "RunRecord":
        cfg, tracker = self.cfg, self.tracker
        where = {"run_dir": str(self.home)} if self.home is not None else {}  # what the orphan reaper reads
        if not self.run_id:  # before run.json: a SIGKILL between the two must not leave a run whose config
            resume.save_run_config(self.home, cfg)  # a resume reads from Hydra's copy (which lacks a sweep job's name)
        tracker.start(self.name, self.tags | provenance() | where, run_id=self.run_id)
        try:  # from here on, whatever fails (a full disk writing run.json) ends the run
            resume.write_run_file(self.home, tracker.run_id, cfg.tracking.uri, cfg.tracking.experiment)
            if not self.run_id:
                save_fingerprint(self.home, cfg, self.tasks)
            self.monitor = system_metrics(tracker, cfg.tracking.system_metrics)
            if self.run_id:  # a resume: same run, RUNNING again; nothing it already logged is logged twice
                tracker.resume()
        except BaseException as e:
            self.__exit__(type(e), e, e.__traceback__)
            raise
        return self

    def __exit__(self, kind, error, tb) -> bool:
        status = "FINISHED" if error is None else "FAILED"
        try:
            if isinstance(error, (Stopped, TrackingLost)) and self.saver is not None and self.saver.step > 0:
                self.saver.save(self.saver.step)  # the last step, saved here only: what resume=auto continues
            if isinstance(error, Stopped):  # the checkpoint left is named on it: the exit line, a job's outcome
                status = "KILLED"
                error.recorded, error.checkpoint = True, ck.latest(self.home) if self.home is not None else None
                # no checkpoint: stopped while loading, before its first step (nothing to resume)
                self.tracker.set_tags({"interrupted": str(error)} |
                                      ({"stopped_before_first_step": "true"} if error.checkpoint is None else {}))
            elif isinstance(error, Exception) and not isinstance(error, TrackingLost):
                if not self.restored:
                    status = self.before or "KILLED"
                self.tracker.set_tags({"error" if self.restored else "resume_error": first_line(error, 5000)})
        finally:
            if self.monitor is not None:
                self.monitor.finish()
            try:
                self.tracker.end(status)
            except TrackingLost:
                status = "FAILED"  # run.json says how it ended when MLflow cannot
            if self.main_process:
                resume.finish(self.home, status)
                if status == "FINISHED":
                    summary.show(self.tracker, self.home)
            phase("ended")
        return False
