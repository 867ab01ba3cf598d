import random

from gpu_runner.compare import compare_reports, mann_whitney_greater


def report(step, memory, params=1000, loss=0.5, rounds=None):
    data = {"measures": {"step_time_ms": step, "peak_memory_bytes": memory, "params": params,
                         "loss_after_steps": loss}}
    if rounds is not None:
        data["step_time_rounds"] = rounds
    return data


def samples(median: float, seed: int, count: int = 10, spread: float = 0.1) -> list[float]:
    rng = random.Random(seed)
    return [median * (1 + rng.uniform(-spread, spread)) for _ in range(count)]


def test_mann_whitney_one_sided_p_values():
    low, high = [float(x) for x in range(10)], [float(x) for x in range(10, 20)]
    assert mann_whitney_greater(high, low) < 1e-3
    assert mann_whitney_greater(low, high) > 0.99
    assert 0.3 < mann_whitney_greater(low, low) < 0.7  # all ties: no evidence either way
    assert mann_whitney_greater([], low) == 1.0


def test_slower_in_every_interleaved_round_is_flagged():
    base_rounds = [samples(10.0, seed) for seed in range(3)]
    head_rounds = [samples(13.5, seed + 10) for seed in range(3)]
    rows = {r["measure"]: r for r in compare_reports(report(13.5, 100, rounds=head_rounds),
                                                     report(10.0, 100, rounds=base_rounds),
                                                     {"step_time": 0.25, "memory": 0.25})}
    assert rows["step time"]["regression"] and "interleaved rounds" in rows["step time"]["message"]
    assert not rows["peak memory"]["regression"]
    assert rows["parameters"]["change"] == "+0"


def test_one_slow_round_or_a_single_measurement_is_not_a_regression():
    # the load doubled during one round only: its own head and base both slowed, and so did one pair's head
    base_rounds = [samples(10.0, 1), samples(10.0, 2), samples(10.0, 3)]
    head_rounds = [samples(20.0, 4), samples(10.0, 5), samples(10.0, 6)]
    rows = {r["measure"]: r for r in compare_reports(report(20.0, 100, rounds=head_rounds),
                                                     report(10.0, 100, rounds=base_rounds))}
    assert not rows["step time"]["regression"] and "not a regression" in rows["step time"]["decision"]
    single = {r["measure"]: r for r in compare_reports(report(30.0, 100), report(10.0, 100))}
    assert not single["step time"]["regression"] and "too few" in single["step time"]["decision"]


def test_memory_beyond_its_threshold_is_flagged_and_missing_measures_are_skipped():
    rows = {r["measure"]: r for r in compare_reports(report(10.0, 130), report(10.0, 100), {"memory": 0.25})}
    assert rows["peak memory"]["regression"] and not rows["step time"]["regression"]
    assert not any(r["regression"] for r in compare_reports(report(11.0, 120), report(10.0, 100)))
    assert compare_reports({"measures": {}}, report(1, 1), {"step_time": 0.25}) == []
