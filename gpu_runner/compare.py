"""Head vs base: deltas of the measures, and regressions beyond the configured thresholds.

Works on report dicts (what the sandboxed child returns), so the worker needs no torch.
"""
from __future__ import annotations

from typing import Optional

DEFAULT_THRESHOLDS = {"step_time": 0.25, "memory": 0.25}  # +25% step time or peak memory is a regression


def _ratio(head: Optional[float], base: Optional[float]) -> Optional[float]:
    if head is None or base is None or base <= 0:
        return None
    return head / base


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
        regression = threshold is not None and ratio > 1 + float(threshold)
        rows.append({"measure": label, "head": h[key], "base": b[key], "change": f"{(ratio - 1) * 100:+.0f}%",
                     "regression": regression,
                     "message": (f"{label} grew by {(ratio - 1) * 100:.0f}% against the base (threshold "
                                 f"{float(threshold) * 100:.0f}%)") if regression else ""})
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
