"""Head vs base: deltas of the measures, and regressions beyond the configured thresholds.

Works on report dicts (what the sandboxed child returns), so the worker needs no torch. Step times are noisy
(another process on the machine moves them by 2x), so a step-time regression needs all three of: the head's
samples slower than the base's by a one-sided Mann-Whitney U test (``SIGNIFICANCE``), the head's median over the
base's beyond the threshold, and every round of the interleaved measurements (base and head back to back, in
alternating order: the load they share cancels, and so does whatever being measured second does; each side by its fastest step) beyond the threshold too. One measurement per side decides nothing. Peak memory is
counted in tensor bytes (or CUDA's allocator), which no load moves, so its threshold applies as it is.
"""
from __future__ import annotations

import math
import statistics
from typing import Optional

DEFAULT_THRESHOLDS = {"step_time": 0.25, "memory": 0.25}  # +25% step time or peak memory is a regression
SIGNIFICANCE = 0.01  # one-sided p-value of the Mann-Whitney U test below which the head's steps are slower


def _ratio(head: Optional[float], base: Optional[float]) -> Optional[float]:
    if head is None or base is None or base <= 0:
        return None
    return head / base


def mann_whitney_greater(head: list[float], base: list[float]) -> float:
    """One-sided p-value that ``head``'s values tend to be larger than ``base``'s (Mann-Whitney U, normal
    approximation with continuity and tie corrections; fine from about 8 samples a side)."""
    n, m = len(head), len(base)
    if not n or not m:
        return 1.0
    pooled = sorted([(value, 0) for value in head] + [(value, 1) for value in base])
    ranks = [0.0] * len(pooled)
    ties = 0.0
    start = 0
    while start < len(pooled):  # average ranks over runs of equal values
        end = start
        while end + 1 < len(pooled) and pooled[end + 1][0] == pooled[start][0]:
            end += 1
        for index in range(start, end + 1):
            ranks[index] = (start + end) / 2 + 1
        size = end - start + 1
        ties += size ** 3 - size
        start = end + 1
    u = sum(rank for rank, (_, side) in zip(ranks, pooled) if side == 0) - n * (n + 1) / 2
    total = n + m
    variance = n * m / 12 * ((total + 1) - ties / (total * (total - 1)))
    if variance <= 0:
        return 1.0
    z = (u - n * m / 2 - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2))


def _samples(report: dict) -> list[list[float]]:
    """The step-time samples of each measurement round of ``report`` (its own run first)."""
    rounds = report.get("step_time_rounds")
    if isinstance(rounds, list):
        return [[float(x) for x in r if isinstance(x, (int, float)) and not isinstance(x, bool)]
                for r in rounds if isinstance(r, list)]
    return []


def step_time_regression(head: dict, base: dict, threshold: float) -> tuple[bool, str]:
    """(regression, why) for the step times of ``head`` against ``base`` (see the module's docstring)."""
    head_rounds, base_rounds = _samples(head), _samples(base)
    pairs = [(h, b) for h, b in zip(head_rounds, base_rounds) if h and b]
    head_all, base_all = [x for h, _ in pairs for x in h], [x for _, b in pairs for x in b]
    if len(pairs) < 2 or min(len(head_all), len(base_all)) < 8:
        return False, "too few interleaved measurements to tell a change from the machine's load"
    ratio = statistics.median(head_all) / statistics.median(base_all)
    p_value = mann_whitney_greater(head_all, base_all)
    # each round by its fastest step: another process only ever adds time to a step (preempted, caches evicted)
    slowest = min(min(h) / min(b) for h, b in pairs)
    if ratio > 1 + threshold and p_value < SIGNIFICANCE and slowest > 1 + threshold:
        return True, (f"step time grew by {(ratio - 1) * 100:.0f}% against the base (threshold {threshold * 100:.0f}%; "
                      f"{len(pairs)} interleaved rounds, each at least {(slowest - 1) * 100:+.0f}%; Mann-Whitney "
                      f"p = {p_value:.2g})")
    return False, (f"median {(ratio - 1) * 100:+.0f}%, the slowest-looking round {(slowest - 1) * 100:+.0f}%, "
                   f"Mann-Whitney p = {p_value:.2g} over {len(pairs)} interleaved rounds: not a regression")


def compare_reports(head: dict, base: dict, thresholds: Optional[dict] = None) -> list[dict]:
    """One row per measure: head, base, the change, and whether it is a regression (``status`` warning)."""
    thresholds = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    h, b = head.get("measures") or {}, base.get("measures") or {}
    rows = []
    for key, label, threshold in (("step_time_ms", "step time", thresholds.get("step_time")),
                                  ("peak_memory_bytes", "peak memory", thresholds.get("memory"))):
        ratio = _ratio(h.get(key), b.get(key))
        if ratio is None:
            continue
        decided = ""
        if threshold is None:
            regression = False
        elif key == "step_time_ms":
            regression, decided = step_time_regression(head, base, float(threshold))
        else:
            regression = ratio > 1 + float(threshold)
        message = ""
        if regression:
            message = decided or (f"{label} grew by {(ratio - 1) * 100:.0f}% against the base (threshold "
                                  f"{float(threshold) * 100:.0f}%)")
        rows.append({"measure": label, "head": h[key], "base": b[key], "change": f"{(ratio - 1) * 100:+.0f}%",
                     "regression": regression, "message": message, **({"decision": decided} if decided else {})})
    if h.get("params") is not None and b.get("params") is not None:
        rows.append({"measure": "parameters", "head": h["params"], "base": b["params"],
                     "change": f"{h['params'] - b['params']:+,}", "regression": False, "message": ""})
    if h.get("loss_after_steps") is not None and b.get("loss_after_steps") is not None:
        rows.append({"measure": "loss after steps", "head": h["loss_after_steps"], "base": b["loss_after_steps"],
                     "change": f"{h['loss_after_steps'] - b['loss_after_steps']:+.4f}", "regression": False,
                     "message": ""})
    for row in rows:
        row["status"] = "warning" if row["regression"] else "ok"
    return rows
