"""TR413 integer-tensor-ratio: a count of matches (an integer tensor) divided with / on a torch that floor-divides
integers.
"""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import FileContext, dotted_name, short
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.flow import subtree
from analyzers.program.values import counts_matches
from analyzers.program.versions import VersionFacts
from analyzers.rules.base import Invalid, Rule, Valid


_TRUE_DIVISION = (1, 7)  # torch 1.7 made ``/`` on integer tensors a true division (1.6 raised, before floor-divided)


class IntegerTensorRatio(Rule):
    id = "TR413"
    source_hint = re.compile(r"sum|count_nonzero")  # matches are counted
    slug = "integer-tensor-ratio"
    category = Category.NUMERICS
    severity = Severity.MEDIUM
    summary = "a count of matches (an integer tensor) divided with / on a torch that floor-divides integers"
    what = """
        Flags `correct / total` where `correct` is an integer tensor counting matches
        (`(pred == y).sum()`, `torch.sum(pred == y)`, `pred.eq(y).sum()`, or a variable that
        only ever accumulates such counts), in a repository that pins PyTorch below 1.7
        (`requirements*.txt`, `setup.py`, `environment.yml`...). Unpinned code is left alone:
        since 1.7, `/` is a true division.
    """
    why = """
        Before PyTorch 1.5, `/` between integer tensors floor-divides: the accuracy
        `correct / total` is 0 until every sample is right (and `100. * correct / total` drops
        the fraction too, since the float scalar is cast to the tensor's integer type). 1.5 only
        warns, and 1.6 raises a RuntimeError instead.
    """
    example = """
        correct += (pred == target).sum()
        accuracy = 100. * correct / len(loader.dataset)
    """
    fix_example = """
        correct += (pred == target).sum().item()
        accuracy = 100. * correct / len(loader.dataset)
    """
    VALID = [
        Valid("""
            import torch
            correct = (pred == target).sum()
            accuracy = correct / len(target)
            """, requirements="torch>=1.8\n"),
        Valid("""
            import torch
            correct = 0
            correct += (pred == target).sum().item()
            accuracy = correct / total
            rate = (pred == target).float().sum() / total
            """, requirements="torch==1.4.0\n"),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            def test(model, loader):
                correct = 0
                for data, target in loader:
                    pred = model(data).argmax(dim=1)
                    correct += pred.eq(target.view_as(pred)).sum()
                return 100. * correct / len(loader.dataset)
            """,
            requirements="torch==1.4.0\ntorchvision==0.5.0\n",
            line=8, message="`correct`",
        ),
        Invalid(
            """
            import torch as T
            acc = T.sum(preds == labels) / labels.size(0)
            """,
            requirements="torch==1.6.0\n",
            line=3, message="RuntimeError",
        ),
    ]

    def visit_BinaryOperation(self, node: cst.BinaryOperation, ctx: FileContext) -> None:
        if not isinstance(node.operator, cst.Divide):
            return
        cap = ctx.facts(VersionFacts).cap("torch")
        if cap is None or cap.admits(_TRUE_DIVISION):
            return  # asked first: most repositories run a torch that divides truly
        left = node.left
        while isinstance(left, cst.BinaryOperation) and isinstance(left.operator, cst.Multiply) and \
                isinstance(left.left, (cst.Integer, cst.Float)):
            left = left.right  # 100. * correct: the scalar takes the tensor's integer type
        if isinstance(node.right, cst.Float):
            return  # how an old torch divided by a float scalar is not worth guessing
        counted = counts_matches(left, ctx) or (isinstance(left, cst.Name) and self._only_counts(left.value, node, ctx))
        if not counted:
            return
        effect = "raises a RuntimeError" if cap.admits((1, 6)) else "floor-divides, so the ratio loses its fraction"
        self.report(node, f"{code_span(short(ctx, node))} divides {code_span(short(ctx, left))}, an integer tensor "
                          f"counting matches: on the pinned torch {cap.text} ({cap.source}) `/` on integer tensors "
                          f"{effect}; take `.item()` of the count (or `.float()`) before dividing")

    @staticmethod
    def _only_counts(name: str, use: cst.CSTNode, ctx: FileContext) -> bool:
        """Every value ``name`` takes in its function is 0 or a count of matches, and at least one is a count."""
        scope = next((a for a in ctx.ancestors(use) if isinstance(a, cst.FunctionDef)), ctx.module)
        counts = 0
        for node in subtree(scope):
            if isinstance(node, cst.Assign) and any(dotted_name(t.target) == name for t in node.targets):
                value = node.value
            elif isinstance(node, cst.AugAssign) and dotted_name(node.target) == name:
                value = node.value
            else:
                continue
            if counts_matches(value, ctx):
                counts += 1
            elif not (isinstance(value, cst.Integer) and value.value == "0"):
                return False
        return counts > 0
