"""``bench.fairness``'s pooling of repeated runs and its service gap of backlogged keys, on made-up data (the
benchmark itself runs in ``make bench``)."""

import pytest

from bench.fairness import HEAVY, LIGHT, RUN_ORDER, run_order, service_gap, summarize
from bench.serve import percentiles


def run(light_ttfts_ms: list[float], tok_s: float = 100.0, per_step: float = 10.0, seconds: float = 100.0) -> dict:
    light = {"ttft_ms": percentiles([ms / 1000 for ms in light_ttfts_ms]), "ttfts_ms": light_ttfts_ms}
    return {"output_tok_s": tok_s, "output_tokens_per_step": per_step, "duration_s": seconds,
            "steps": tok_s * seconds / per_step, LIGHT: light, HEAVY: {}}


def test_p99_is_taken_over_the_pooled_samples_and_each_repeat_keeps_its_own_ratio():
    alone = [run([100.0] * 19 + [200.0]), run([100.0] * 20)]
    fair = [run([150.0] * 20), run([120.0] * 19 + [400.0])]
    runs = {"alone": alone, "fair": fair, "fcfs": [run([5000.0] * 20, tok_s=104.0, per_step=10.5)]}

    pooled, ratios = summarize(runs)

    assert ratios["light_requests_pooled"] == {"alone": 40, "fair": 40, "fcfs": 20}
    assert pooled["alone"]["p99"] == pytest.approx(100.0 + 0.61 * 100.0)  # numpy's linear interpolation, 40 samples
    assert pooled["fair"]["p99"] == pytest.approx(150.0 + 0.61 * 250.0)
    assert ratios["light_p99_ttft_fair_over_alone"] == pytest.approx(302.5 / 161.0)
    each = ratios["light_p99_ttft_fair_over_alone_each_repeat"]
    assert each == pytest.approx([150.0 / (100.0 + 0.81 * 100.0), (120.0 + 0.81 * 280.0) / 100.0])
    assert ratios["throughput_fair_over_fcfs"] == pytest.approx(100.0 / 104.0)
    assert ratios["output_per_step_fair_over_fcfs"] == pytest.approx(10.0 / 10.5)


def test_throughput_is_pooled_over_each_kinds_runs_and_kept_per_repeat():
    # keyed: 9,000 + 8,800 tokens in 200 s over 900 + 1,100 steps; arrival order: 10,000 + 9,900 in 200 s, 1,000 +
    # 1,000 steps
    fair = [run([1.0], tok_s=100.0, per_step=10.0, seconds=90.0), run([1.0], tok_s=80.0, per_step=8.0, seconds=110.0)]
    fcfs = [run([1.0], tok_s=100.0, per_step=10.0), run([1.0], tok_s=99.0, per_step=9.9)]
    _, ratios = summarize({"alone": [run([1.0]), run([1.0])], "fair": fair, "fcfs": fcfs})

    assert ratios["throughput_fair_over_fcfs"] == pytest.approx(17800.0 / 19900.0)
    assert ratios["throughput_fair_over_fcfs_each_repeat"] == pytest.approx([1.0, 80.0 / 99.0])
    assert ratios["output_per_step_fair_over_fcfs"] == pytest.approx((17800.0 / 2000.0) / (19900.0 / 2000.0))


def test_alone_and_keyed_runs_must_pair_by_repeat():
    with pytest.raises(ValueError):
        summarize({"alone": [run([1.0])], "fair": [run([1.0]), run([1.0])], "fcfs": [run([1.0])]})


def trace(prompt_tokens: int, token_times: list[float]) -> dict:
    return {"prompt_tokens": prompt_tokens, "token_times": token_times, "ok": True}


def test_service_gap_counts_the_window_both_keys_had_requests_waiting():
    # Key a (weight 1): a 10-token prompt answered at 0.1 s, two output tokens; its last request starts at 0.3 s.
    # Key b (weight 2): its last request starts at 0.5 s, so the window ends at 0.3 s.
    traces = {"a": [trace(10, [0.1, 0.2]), trace(10, [0.3])],
              "b": [trace(20, [0.1, 0.3]), trace(40, [0.5, 0.6])]}
    gap = service_gap(traces, {"a": 1.0, "b": 2.0}, grid_s=0.1)

    assert gap["window_s"] == pytest.approx(0.3)
    # a: 10 + 2 at 0.1, + 2 at 0.2, + 10 + 2 at 0.3 = 26; b: (20 + 2) / 2 at 0.1, + 2 / 2 at 0.3 = 12.
    assert gap["weighted_service"] == pytest.approx({"a": 26.0, "b": 12.0})
    # d(t) = a - b on the grid 0, 0.1, 0.2, 0.3: 0, 1, 3, 14: it grew by 14 at most.
    assert gap["max_gap"] == pytest.approx(14.0)
    assert gap["raw_service_ratio"] == pytest.approx(24.0 / 26.0)


def test_each_pair_of_repeats_gives_every_kind_the_same_mean_position():
    for first in range(4):
        pair = [run_order(first), run_order(first + 1)]
        assert all(sorted(order) == sorted(RUN_ORDER) for order in pair)
        positions = {name: sum(order.index(name) for order in pair) for name in RUN_ORDER}
        assert len(set(positions.values())) == 1, positions  # a drifting host weighs on each kind alike
