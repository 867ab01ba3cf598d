"""TR501 inplace-on-leaf: in-place update of a leaf tensor that requires grad outside torch.no_grad()."""
from __future__ import annotations

from typing import Optional

import libcst as cst

from analyzers.context import FileContext, argument, dotted_name, is_false, is_true, method_name
from analyzers.model import Category, Severity
from analyzers.program.values import leaf_requiring_grad
from analyzers.rules.base import Invalid, Rule, Valid


_INPLACE = {
    "add_", "sub_", "mul_", "div_", "copy_", "zero_", "fill_", "clamp_", "clamp_min_", "clamp_max_", "clip_",
    "normal_", "uniform_", "addcmul_", "addcdiv_", "pow_", "neg_", "exp_", "log_", "sqrt_", "abs_", "sign_",
    "masked_fill_", "masked_scatter_", "index_add_", "index_fill_", "index_copy_", "scatter_", "scatter_add_",
    "lerp_", "bernoulli_", "exponential_", "random_", "fill_diagonal_", "true_divide_", "floor_divide_",
    "relu_", "sigmoid_", "tanh_", "squeeze_", "unsqueeze_", "t_", "transpose_", "resize_", "set_", "put_",
    "addmm_", "baddbmm_", "renorm_", "cauchy_", "log_normal_", "geometric_", "round_", "floor_", "ceil_",
    "reciprocal_", "sin_", "cos_", "nan_to_num_",
}


class InplaceOnLeaf(Rule):
    id = "TR501"
    slug = "inplace-on-leaf"
    category = Category.AUTOGRAD
    severity = Severity.HIGH
    summary = "in-place update of a leaf tensor that requires grad outside torch.no_grad()"
    what = """
        Flags in-place updates (`w -= lr * w.grad`, `w += ...`, `w[i] = ...`, `w.add_()`,
        `w.copy_()`, `w.zero_()`, `w.uniform_()`...) of a tensor created with
        `requires_grad=True` (or `.requires_grad_()`), of an `nn.Parameter` (including
        `self.weight = nn.Parameter(...)`) and of the loop variable of
        `for p in model.parameters()`, when they run outside `torch.no_grad()`.
    """
    why = """
        Autograd refuses to modify a leaf that requires grad in place: the line raises
        `RuntimeError: a leaf Variable that requires grad is being used in an in-place
        operation`. Manual SGD updates and weight re-initializations belong inside
        `with torch.no_grad():` (or use `nn.init.*_` functions, which do that for you).
    """
    example = """
        w = torch.randn(10, 1, requires_grad=True)
        ...
        loss.backward()
        w -= lr * w.grad
    """
    fix_example = """
        w = torch.randn(10, 1, requires_grad=True)
        ...
        loss.backward()
        with torch.no_grad():
            w -= lr * w.grad
        w.grad.zero_()
    """
    VALID = [
        "import torch\nw = torch.randn(3, requires_grad=True)\nwith torch.no_grad():\n    w -= 0.1 * w.grad\nw.grad.zero_()\n",
        "import torch\nw = torch.randn(3, requires_grad=True)\nw.data -= 0.1 * w.grad\n",
        "import torch\n@torch.no_grad()\ndef sgd(model, lr):\n    for p in model.parameters():\n        p -= lr * p.grad\n",
        "import torch\nimport torch.nn as nn\nclass L(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.weight = nn.Parameter(torch.empty(3, 3))\n        nn.init.kaiming_uniform_(self.weight)\n",
        # grad is not the leaf
        "import torch\nfor p in model.parameters():\n    if p.grad is not None:\n        p.grad.zero_()\n",
        # no requires_grad: a plain tensor
        "import torch\nbuf = torch.zeros(3)\nbuf += 1\nbuf.add_(2)\nbuf[0] = 5\n",
        "import torch\nx = torch.randn(3, requires_grad=True)\ny = x * 2\ny += 1\n",
        Valid("import torch\nw = torch.zeros(3, requires_grad=True)\nwith torch.inference_mode():\n    w.fill_(1.0)\n"),
    ]
    INVALID = [
        Invalid("import torch\nw = torch.randn(3, requires_grad=True)\nloss = (w * 2).sum()\nloss.backward()\n"
                "w -= 0.1 * w.grad\n", line=5, message="`w`"),
        Invalid("import torch\nfor p in model.parameters():\n    p.add_(p.grad, alpha=-0.01)\n", line=3, message="`p`"),
        Invalid("import torch\nimport torch.nn as nn\nclass L(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                "        self.weight = nn.Parameter(torch.empty(3, 3))\n        self.weight.uniform_(-0.1, 0.1)\n",
                line=7, message="self.weight"),
        Invalid("import torch as th\nb = th.zeros(4, requires_grad=True)\nb[0] = 1.0\n", line=3, message="`b`"),
        Invalid("import torch\nx = torch.ones(2).requires_grad_()\nx.mul_(2)\n", line=3),
        Invalid("import torch\nfor name, p in net.named_parameters():\n    p -= 0.1 * p.grad\n", line=3),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._marked: dict[str, object] = {}  # name -> binding that ``name.requires_grad_()`` marked
        self._known: dict[tuple, str] = {}  # (function id, name) -> description, for repeated updates
        self._grad_off: set = set()  # functions (None: module) after torch.set_grad_enabled(False)

    # ---- handlers --------------------------------------------------------------------------------
    def visit_AugAssign(self, node: cst.AugAssign, ctx: FileContext) -> None:
        target = node.target
        if isinstance(target, cst.Subscript):
            self._check(target.value, node, ctx)
        elif isinstance(target, (cst.Name, cst.Attribute)):
            self._check(target, node, ctx)

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        for target in node.targets:
            t = target.target
            if isinstance(t, cst.Subscript) and isinstance(t.value, (cst.Name, cst.Attribute)):
                self._check(t.value, t, ctx)
            elif isinstance(t, cst.Attribute) and t.attr.value == "requires_grad" and is_true(node.value):
                self._mark(t.value, ctx)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute):
            return
        attr = func.attr.value
        if attr in _INPLACE:
            receiver = func.value
            if isinstance(receiver, (cst.Name, cst.Attribute)) and ctx.qualified_name(receiver) is None:
                self._check(receiver, node, ctx)
        elif attr == "requires_grad_":
            if isinstance(ctx.parent(node), cst.Expr) and (not node.args or is_true(argument(node, 0, "requires_grad"))):
                self._mark(func.value, ctx)
        elif attr == "set_grad_enabled" and isinstance(ctx.parent(node), cst.Expr):
            if ctx.call_name(node) in ("torch.set_grad_enabled", "torch.autograd.set_grad_enabled"):
                mode = argument(node, 0, "mode")
                if is_false(mode):
                    self._grad_off.add(id(ctx.function_def) if ctx.function_def else None)
                elif is_true(mode):
                    self._grad_off.discard(id(ctx.function_def) if ctx.function_def else None)

    # ---- logic -------------------------------------------------------------------------------------
    def _mark(self, expr: cst.BaseExpression, ctx: FileContext) -> None:
        name = dotted_name(expr)
        if name is not None:
            self._marked[name] = ctx.binding(name)

    def _check(self, target: cst.BaseExpression, report_node: cst.CSTNode, ctx: FileContext) -> None:
        name = dotted_name(target)
        if name is None:
            return
        parts = name.split(".")
        if "data" in parts[1:] or "grad" in parts[1:]:
            return
        fn_key = id(ctx.function_def) if ctx.function_def else None
        description = self._leaf_description(name, ctx)
        if description is None:
            description = self._known.get((fn_key, name)) if self._still_augmented(name, ctx) else None
        if description is None:
            return
        self._known[(fn_key, name)] = description
        if ctx.in_no_grad() or fn_key in self._grad_off or None in self._grad_off:
            return
        self.report(report_node, f"in-place update of `{name}`, {description}, outside `torch.no_grad()`: autograd "
                                 f"raises 'a leaf Variable that requires grad is being used in an in-place operation'; "
                                 f"do the update under `with torch.no_grad():`")

    def _still_augmented(self, name: str, ctx: FileContext) -> bool:
        binding = ctx.binding(name)
        return binding is not None and binding.kind == "augassign"

    def _leaf_description(self, name: str, ctx: FileContext) -> Optional[str]:
        binding = ctx.binding(name)
        if binding is None:
            return None
        if name in self._marked and self._marked[name] is binding:
            return "a tensor marked with requires_grad"
        if binding.kind == "for" and isinstance(binding.node, cst.For):
            return self._parameter_loop(name, binding.node, ctx)
        if binding.kind not in ("assign", "annassign") or not isinstance(binding.value, cst.Call):
            return None
        return leaf_requiring_grad(binding.value, ctx)

    def _parameter_loop(self, name: str, loop: cst.For, ctx: FileContext) -> Optional[str]:
        iter_expr = loop.iter
        if isinstance(iter_expr, cst.Name):
            iter_expr = ctx.origin(iter_expr)
        if isinstance(iter_expr, cst.Call) and method_name(iter_expr) in ("list", "tuple") and iter_expr.args:
            iter_expr = iter_expr.args[0].value
        if not isinstance(iter_expr, cst.Call) or not isinstance(iter_expr.func, cst.Attribute):
            return None
        owner = dotted_name(iter_expr.func.value) or "the model"
        kind = iter_expr.func.attr.value
        target = loop.target
        if kind == "parameters" and isinstance(target, cst.Name) and target.value == name:
            return f"a parameter of `{owner}`"
        if (kind == "named_parameters" and isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2
                and isinstance(target.elements[1].value, cst.Name) and target.elements[1].value.value == name):
            return f"a parameter of `{owner}`"
        return None
