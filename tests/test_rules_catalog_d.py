"""Realistic scenarios for the catalog's part 2, third batch: TR414 (log1p / expm1)."""
from __future__ import annotations

import textwrap

from analyzers.config import Config
from analyzers.engine import analyze_text
from tests.test_notebooks import notebook
from tests.test_rules_catalog_c import lines, run


# ---- TR414: log(1 + x) and exp(x) - 1 -----------------------------------------------------------

def test_log1p_through_every_import_spelling():
    findings = run("""
        import torch
        import torch as th
        from torch import log, exp

        def density(rate, t, eps):
            a = torch.log(1. + rate)
            b = th.log(rate * t + 1)
            c = log(1 + eps)
            d = exp(t) - 1
            return a + b + c + d
        """, "TR414")
    assert lines(findings, "TR414") == [7, 8, 9, 10]
    fixes = {f.line: f.fix for f in findings}
    assert fixes[7].replacement.strip() == "a = torch.log1p(rate)"
    assert fixes[8].replacement.strip() == "b = th.log1p(rate * t)"
    # a bare ``log`` / ``exp`` imported from torch: the name to write is not in scope, so no fix is offered
    assert fixes[9] is None and fixes[10] is None
    assert "torch.log1p(x)" in next(f.message for f in findings if f.line == 9)


def test_log1p_in_a_loss_helper_and_a_while_loop():
    findings = run("""
        import torch
        import torch.nn.functional as F

        def poisson_nll(log_rate, counts):
            return (log_rate.exp() - counts * log_rate).mean()

        def shrink(weights, lam):
            step = 0
            while step < 10:
                weights = weights * (weights.abs().exp() - 1)
                weights = torch.log(weights.abs() + 1) * lam
                step += 1
            return F.softplus(weights)
        """, "TR414")
    assert lines(findings, "TR414") == [11, 12]


def test_numpy_math_softplus_and_stable_code_are_quiet():
    assert run("""
        import math
        import numpy as np
        import torch

        y = np.log(1 + counts)
        z = np.exp(x) - 1
        w = math.log(1 + lr)
        sp = torch.log(1 + torch.exp(x))          # softplus: TR411's finding
        sp2 = torch.log(1 + x.exp())
        ok = torch.log1p(x) + torch.expm1(x)
        shifted = torch.log(2 + x) + torch.exp(x) - 2
        constant = torch.log(torch.tensor(1 + 1e-3))
        both = torch.log(1 + 1)
        """, "TR414") == []


def test_log1p_in_a_notebook_cell():
    nb = notebook(("markdown", "# Features\n"),
                  ("code", "import torch\n"),
                  ("code", "x = torch.rand(8)\nfeatures = torch.log(1 + x)\n"))
    result = analyze_text(nb, "features.ipynb", Config(select=("TR414",)))
    assert [(f.rule, f.cell, f.line) for f in result.findings] == [("TR414", 3, 2)]
    assert result.findings[0].fix is not None
