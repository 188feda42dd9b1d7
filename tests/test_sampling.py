"""Task-sampling schedules (docs/methods.md, section Sampling schedules)."""
import math
from collections import Counter

import pytest

from conftest import make_cfg
from deepen_run.data.loaders import train_size
from deepen_run.data.sampling import TaskSampler, alpha_at, probabilities

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
    # its sampling table names no exponent (an alpha of 1.0 would read as proportional)
    assert [r["alpha"] for r in s.table()] == ["", "", "", ""] and s.table()[0]["sst2"] == 0.25
    assert [r["alpha"] for r in TaskSampler(sched("sqrt"), SIZES, 10, 40, seed=0).table()] == [0.5] * 4


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


@pytest.mark.parametrize("name", ["proportional", "sqrt", "annealed"])
def test_a_fraction_keeps_schedules_non_uniform_where_a_cap_flattens_them(name):
    cfg = sched(name)
    capped = {t: train_size(n, None, 500) for t, n in SIZES.items()}
    frac = {t: train_size(n, 0.05, None) for t, n in SIZES.items()}
    for epoch in (1, 3):  # annealed: alpha 1 in epoch 1, 0.6 in epoch 3 of 5
        flat = probabilities(cfg, capped, epoch, 5)
        assert all(p == pytest.approx(1 / len(SIZES)) for p in flat.values())
        p = probabilities(cfg, frac, epoch, 5)
        assert max(p.values()) - min(p.values()) > 0.2, p
        assert max(p, key=p.get) == "sst2" and min(p, key=p.get) == "rte"
        # The same probabilities as the full data's, up to rounding of the subsample sizes.
        assert p == pytest.approx(probabilities(cfg, SIZES, epoch, 5), abs=2e-3)


def test_a_large_alpha_gives_the_limit_not_an_overflow():
    """p_i ∝ N_i ** alpha with |alpha| large: N ** 200 overflows a float (was an OverflowError after the
    model had loaded); the same ratios taken in logs give the limit, all on the largest task (or, for
    a large negative alpha, the smallest)."""
    big = sched("proportional")
    for alpha, task in ((200.0, max(SIZES, key=SIZES.get)), (-400.0, min(SIZES, key=SIZES.get))):
        big.alpha = alpha
        p = probabilities(big, SIZES, 1, 5)
        assert math.isclose(sum(p.values()), 1.0) and p[task] == pytest.approx(1.0), (alpha, p)
    big.alpha = 1.0  # an ordinary alpha keeps its exact powers
    assert probabilities(big, SIZES, 1, 5) == {t: n / sum(SIZES.values()) for t, n in SIZES.items()}
