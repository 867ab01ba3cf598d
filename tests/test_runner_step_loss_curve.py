"""The step's loss check reads the curve of a short run on one repeated batch: a verdict of falling (pass) or not
falling (warn) needs both readings of the curve, its ends and the means of its first and last two, to agree; a curve
that went both ways is undecided, and a loss that rose is never described as having fallen."""
from __future__ import annotations

import types

import pytest

pytest.importorskip("torch")

from gpu_runner import steps as steps_module  # noqa: E402


def loss_check(losses):
    plan = object.__new__(steps_module._Plan)
    plan.path, plan.first_line = "train.py", 3
    plan.instruments = types.SimpleNamespace(detached_error=None, disconnected=[], losses=list(losses),
                                             loss_lines=[steps_module._Where("train.py", 9, "loss.backward()")])
    return plan._loss_check()


def test_a_steady_fall_passes():
    result = loss_check([2.0, 1.9, 1.7, 1.5, 1.3, 1.1])
    assert result.status == "pass" and "fell from 2 to 1.1" in result.message


def test_a_flat_or_rising_curve_warns_without_saying_it_fell():
    for losses in ([1.0, 1.0, 1.0, 1.0], [1.0, 1.1, 1.2, 1.4]):
        result = loss_check(losses)
        assert result.status == "warn" and "did not fall" in result.message and "fell from" not in result.message


def test_a_last_loss_above_the_first_is_undecided_even_when_the_middle_fell():
    # the means of the ends fell (4.98 -> 4.89) but the last loss is above the first: noise, not a verdict
    result = loss_check([4.98, 4.98, 4.62, 4.87, 4.66, 4.67, 5.12])
    assert result.status == "skip" and result.message.startswith("undecided")
    assert result.details["undecided"] is True
    assert "fell from" not in result.message and "4.98 → 5.12" in result.message


def test_a_last_loss_below_the_first_with_rising_means_is_undecided():
    result = loss_check([2.0, 1.0, 1.5, 2.4, 1.9])
    assert result.status == "skip" and "went both ways" in result.message
