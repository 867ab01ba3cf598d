"""bench/static.py's paired summary: each file's best parse and best analysis over rounds decide the ratios."""
from bench.static import paired_summary


def test_one_round_gives_the_files_own_ratios():
    summary = paired_summary([[["a.py", 0.010, 0.015], ["b.py", 0.001, 0.004]]])
    assert summary["rounds"] == 1
    assert summary["parse_cpu_s"] == 0.01 and summary["torchreview_cpu_s"] == 0.02
    assert summary["worst_file"]["path"] == "b.py" and summary["worst_file"]["ratio"] == 4.0
    # only a file parsing in 5 ms or more is measurable
    assert summary["measurable_files"] == 1 and summary["worst_measurable_file"]["path"] == "a.py"
    assert summary["worst_measurable_file"]["ratio"] == 1.5


def test_a_noisy_round_does_not_decide_a_files_ratio():
    quiet = [["a.py", 0.010, 0.015], ["b.py", 0.020, 0.030]]
    # in the second round the machine was busy during a.py's analysis and b.py's parse
    busy = [["a.py", 0.010, 0.030], ["b.py", 0.040, 0.031]]
    summary = paired_summary([busy, quiet])
    assert summary["rounds"] == 2
    assert summary["worst_measurable_file"]["ratio"] == 1.5
    assert summary["ratio"] == 1.5


def test_best_parse_and_best_analysis_may_come_from_different_rounds():
    summary = paired_summary([[["a.py", 0.010, 0.030]], [["a.py", 0.020, 0.020]]])
    assert summary["worst_measurable_file"]["ratio"] == 2.0
