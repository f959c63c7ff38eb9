"""``bench.fairness_engine``'s arrivals, round order and pooling, on made-up data (the benchmark itself runs the
model: ``python -m bench.fairness_engine``)."""

import pytest

from bench.fairness_engine import HEAVY, LIGHT, pooled, requests, round_order
from bench.fairness_steps import STEPS_PER_REQUEST


def test_arrivals_are_the_served_benchmarks_rates_and_the_same_for_a_seed():
    plan = requests(3000, 16, seed=0)
    assert plan == requests(3000, 16, seed=0) and plan != requests(3000, 16, seed=1)
    assert [at for at, _, _ in plan] == sorted(at for at, _, _ in plan) and 0 <= plan[0][0] and plan[-1][0] < 3000
    light_rate = 1.5 * 16 / STEPS_PER_REQUEST / 11
    counts = {tenant: sum(t == tenant for _, t, _ in plan) for tenant in (LIGHT, HEAVY)}
    assert counts[LIGHT] == pytest.approx(3000 * light_rate, rel=0.25)
    assert counts[HEAVY] == pytest.approx(3000 * 10 * light_rate, rel=0.1)
    assert all(64 <= len(prompt) <= 128 for _, _, prompt in plan)


def test_rounds_go_abba_so_a_drift_weighs_on_both_kinds():
    orders = [round_order(pair) for pair in range(4)]
    assert orders == [("keyed", "fcfs"), ("fcfs", "keyed"), ("keyed", "fcfs"), ("fcfs", "keyed")]


def test_pooled_ratios_take_all_tokens_over_all_seconds_and_steps():
    rounds = [{"keyed": True, "seconds": 10.0, "steps": 100, "output_tokens": 1000},
              {"keyed": False, "seconds": 9.0, "steps": 95, "output_tokens": 1000},
              {"keyed": True, "seconds": 12.0, "steps": 105, "output_tokens": 1000},
              {"keyed": False, "seconds": 14.0, "steps": 100, "output_tokens": 1000}]
    ratios = pooled(rounds)
    assert ratios["throughput_keyed_over_fcfs"] == pytest.approx(23 / 22)
    assert ratios["per_step_keyed_over_fcfs"] == pytest.approx((2000 / 205) / (2000 / 195))
