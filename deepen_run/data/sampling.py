"""Which task each multi-task step trains on (docs/methods.md, section Sampling schedules).

Task i is drawn with p_i ∝ N_i ** alpha (N_i = its training examples); `annealed` moves alpha
linearly from `alpha` (first epoch) to `alpha_end` (last epoch); `round_robin` takes tasks in turn.
"""
from __future__ import annotations

import math

import numpy as np


def alpha_at(cfg, epoch: int, total_epochs: int) -> float:
    """epoch counts from 1. With one epoch, an annealed schedule stays at its start."""
    if cfg.kind != "annealed":
        return cfg.alpha
    if total_epochs <= 1:
        return cfg.alpha
    return cfg.alpha - (cfg.alpha - cfg.alpha_end) * (epoch - 1) / (total_epochs - 1)


def probabilities(cfg, sizes: dict[str, int], epoch: int, total_epochs: int) -> dict[str, float]:
    if cfg.kind == "round_robin":
        return {t: 1 / len(sizes) for t in sizes}
    alpha = alpha_at(cfg, epoch, total_epochs)
    try:
        w = np.array([float(n) ** alpha for n in sizes.values()])
    except OverflowError:
        w = np.zeros(0)
    if not (w.size and np.isfinite(w.sum()) and w.sum() > 0):  # a large |alpha|: the same ratios, in logs
        z = alpha * np.log([float(n) for n in sizes.values()])
        w = np.exp(z - z.max())
    return dict(zip(sizes, (w / w.sum()).tolist()))


def epoch_length(tcfg, n_tasks: int, per_pass: int) -> int:
    """Steps in one epoch. per_pass: steps for one pass over every task's training set.

    One task: one pass. Several: train.steps_per_epoch if set, else train.steps_per_task x n_tasks
    (the PALs paper's 300 x n_tasks, which follows the task list), else one pass.
    """
    if n_tasks > 1 and tcfg.steps_per_epoch:
        return max(1, tcfg.steps_per_epoch)
    if n_tasks > 1 and tcfg.steps_per_task:
        return max(1, tcfg.steps_per_task * n_tasks)
    return max(1, per_pass)


def total_steps(tcfg, n_tasks: int, per_pass: int) -> int:
    """The run's steps: train.max_steps, else num_epochs epochs of epoch_length."""
    return tcfg.max_steps if tcfg.max_steps > 0 else math.ceil(tcfg.num_epochs * epoch_length(tcfg, n_tasks, per_pass))


class TaskSampler:
    """Draws the task of each step; seeded, and resumable from (step) alone."""

    def __init__(self, cfg, sizes: dict[str, int], steps_per_epoch: int, total_steps: int, seed: int):
        self.cfg, self.sizes, self.names = cfg, sizes, list(sizes)
        self.steps_per_epoch = max(1, steps_per_epoch)
        self.total_epochs = max(1, -(-total_steps // self.steps_per_epoch))
        self.seed = seed

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch + 1

    def probs(self, epoch: int) -> dict[str, float]:
        return probabilities(self.cfg, self.sizes, epoch, self.total_epochs)

    def task(self, step: int) -> str:
        if len(self.names) == 1:
            return self.names[0]
        if self.cfg.kind == "round_robin":
            return self.names[step % len(self.names)]
        p = self.probs(self.epoch_of(step))
        # A generator keyed by (seed, step): the draw of step s is the same after a resume.
        rng = np.random.default_rng([self.seed, step])
        return self.names[rng.choice(len(self.names), p=list(p.values()))]

    def table(self) -> list[dict]:
        """The probabilities used in every epoch, for the sampling artifacts."""
        alpha = (lambda e: "") if self.cfg.kind == "round_robin" else \
            (lambda e: alpha_at(self.cfg, e, self.total_epochs))  # round robin has no exponent
        return [{"epoch": e, "alpha": alpha(e), **self.probs(e)} for e in range(1, self.total_epochs + 1)]
