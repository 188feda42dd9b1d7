"""Task-sampling schedules (METHODS.md §3)."""
import math
from collections import Counter

import pytest

from conftest import make_cfg
from deepen_run.sampling import TaskSampler, alpha_at, probabilities

SIZES = {"sst2": 67349, "mrpc": 3668, "rte": 2490, "cola": 8551}


def sched(name):
    return make_cfg(f"schedule={name}").schedule


@pytest.mark.parametrize("name,alpha", [("proportional", 1.0), ("sqrt", 0.5), ("uniform", 0.0)])
def test_power_schedules(name, alpha):
    p = probabilities(sched(name), SIZES, 1, 5)
    z = sum(n ** alpha for n in SIZES.values())
    for t, n in SIZES.items():
        assert p[t] == pytest.approx(n ** alpha / z)
    assert sum(p.values()) == pytest.approx(1.0)


def test_annealed_alpha_runs_from_one_to_point_two():
    cfg = sched("annealed")
    E = 25
    assert alpha_at(cfg, 1, E) == pytest.approx(1.0)
    assert alpha_at(cfg, E, E) == pytest.approx(0.2)
    assert alpha_at(cfg, 13, E) == pytest.approx(1 - 0.8 * 12 / 24)
    assert probabilities(cfg, SIZES, 1, E) == pytest.approx(probabilities(sched("proportional"), SIZES, 1, E))


def test_round_robin_takes_turns():
    s = TaskSampler(sched("round_robin"), SIZES, 10, 40, seed=0)
    assert [s.task(i) for i in range(8)] == list(SIZES) * 2


def test_one_task_is_always_that_task():
    s = TaskSampler(sched("sqrt"), {"rte": 2490}, 10, 100, seed=0)
    assert {s.task(i) for i in range(100)} == {"rte"}


@pytest.mark.parametrize("name", ["proportional", "sqrt", "uniform"])
def test_empirical_frequencies_match(name):
    n = 4000
    s = TaskSampler(sched(name), SIZES, n, n, seed=3)
    counts = Counter(s.task(i) for i in range(n))
    for t, p in s.probs(1).items():
        sd = math.sqrt(p * (1 - p) / n)
        assert abs(counts[t] / n - p) < 4 * sd + 1e-9, (t, counts[t] / n, p)


def test_draws_are_reproducible_after_resume():
    full = TaskSampler(sched("sqrt"), SIZES, 50, 200, seed=7)
    seq = [full.task(i) for i in range(200)]
    resumed = TaskSampler(sched("sqrt"), SIZES, 50, 200, seed=7)  # a new process, from step 120
    assert [resumed.task(i) for i in range(120, 200)] == seq[120:]
    other = TaskSampler(sched("sqrt"), SIZES, 50, 200, seed=8)
    assert [other.task(i) for i in range(200)] != seq
