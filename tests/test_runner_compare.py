from gpu_runner.compare import compare_reports


def report(step, memory, params=1000, loss=0.5):
    return {"measures": {"step_time_ms": step, "peak_memory_bytes": memory, "params": params, "loss_after_steps": loss}}


def test_regression_beyond_threshold_is_flagged():
    rows = {r["measure"]: r for r in compare_reports(report(13.0, 100), report(10.0, 100),
                                                     {"step_time": 0.25, "memory": 0.25})}
    assert rows["step time"]["regression"] and rows["step time"]["change"] == "+30%"
    assert not rows["peak memory"]["regression"]
    assert rows["parameters"]["change"] == "+0"


def test_within_threshold_is_fine_and_missing_measures_are_skipped():
    rows = compare_reports(report(11.0, 120), report(10.0, 100), {"step_time": 0.25, "memory": 0.25})
    assert not any(r["regression"] for r in rows)
    assert compare_reports({"measures": {}}, report(1, 1), {"step_time": 0.25}) == []
