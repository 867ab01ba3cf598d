"""TR405 numpy-in-forward: NumPy on tensors inside forward() or a loss function breaks autograd."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import re
import libcst as cst

from analyzers.context import (
    all_children,
    FileContext,
    short,
    dotted_name,
    uses_name)
from analyzers.markdown import code_span, named
from analyzers.program.flow import subtree
from analyzers.program.graphs import detached_side_output, flows_back_into_result, taken_off_graph
from analyzers.program.names import last_name
from analyzers.program.values import TENSOR_ONLY_METHODS, returns_tensor_of_args
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule


_SHAPE_ATTRS = {"shape", "device", "dtype", "ndim", "is_cuda", "requires_grad", "layout", "is_sparse", "names"}
_SCALAR_METHODS = {"size", "dim", "numel", "item", "tolist", "numpy", "element_size", "get_device", "nelement",
                   "dim_order", "stride", "data_ptr", "is_contiguous", "is_floating_point"}
_SCALAR_BUILTINS = {"len", "isinstance", "type", "int", "float", "bool", "str", "id", "hasattr", "getattr", "print"}
_SCALAR_ANNOTATIONS = {"int", "float", "bool", "str", "tuple", "Tuple", "list", "List", "dict", "Dict"}
_NP_CONVERSIONS = {"array", "asarray", "asanyarray", "ascontiguousarray", "copy", "float32", "float64"}
_NP_TO_TORCH = {"power": "pow", "concatenate": "cat", "absolute": "abs", "arctan": "atan", "arcsin": "asin",
                "arccos": "acos", "arctan2": "atan2", "dot": "matmul", "expand_dims": "unsqueeze",
                "transpose": "permute", "swapaxes": "transpose", "maximum": "maximum", "minimum": "minimum"}
_NOT_LOSS_PREFIXES = ("plot", "print", "log_", "show", "save", "record", "track", "report", "write", "visual",
                      "draw", "display", "update", "reset", "get_", "load", "summar", "average", "avg", "smooth",
                      "eval", "val", "test", "compute_val", "compute_test", "compute_eval")


@dataclass
class _NumpyState:
    node: cst.FunctionDef
    kind: Optional[str]  # forward | loss | None
    label: str
    tainted: set[str] = field(default_factory=set)
    # in forward: names computed by the module's own layers (a gradient reaches parameters through them)
    activations: set[str] = field(default_factory=set)
    on_raw_input: set = field(default_factory=set)  # findings on the input, before any layer ran
    calls_layers: bool = False
    found: list[tuple[cst.CSTNode, str]] = field(default_factory=list)
    statements: set = field(default_factory=set)
    uses_torch: bool = False
    loss_class: bool = False  # the forward of a ``*Loss`` module: its inputs are predictions


class NumpyInForward(Rule):
    id = "TR405"
    source_hint = re.compile(r"numpy|np\.")  # ``.numpy()`` or a NumPy call
    slug = "numpy-in-forward"
    category = Category.NUMERICS
    severity = Severity.HIGH
    summary = "NumPy on tensors inside forward() or a loss function breaks autograd"
    what = """
        Flags `.numpy()` and NumPy calls (`np.exp`, `np.log`, `np.sum`, `np.array(t)`,
        `np.asarray`...) on tensors inside the `forward` of an `nn.Module` subclass or inside a
        loss function (a function whose name contains "loss", or a `*Loss` class). NumPy on
        shapes and constants (`np.sqrt(self.d_model)`, `np.prod(x.shape)`, `np.pi`) is fine, and
        so is NumPy on the raw input of a module that runs its own layers on another path
        (pre-processing, or an inference dispatcher handing the input to ONNX Runtime / OpenCV),
        and anything in an inference-only `forward` (`@torch.inference_mode()`, `@torch.no_grad()`).
        Only values known to be tensors count: inputs and what torch, the model or the module's
        layers compute from them, not what another object returns (a replay buffer's arrays); a
        module with neither layers nor torch in its `forward` is taken to compute in NumPy; and a
        copy taken off the graph on purpose (`.detach()` / `.data` then `.numpy()`) is flagged only
        when it comes back into the result.
    """
    why = """
        Autograd only records torch operations. A value that goes through NumPy is a plain
        array: nothing upstream of it receives a gradient, so the layers before it silently
        stop learning (or the loss cannot be backpropagated at all). It also forces a
        GPU→CPU copy and a device synchronisation on every call.
    """
    example = """
        def forward(self, x):
            h = self.fc(x)
            return torch.tensor(np.exp(h.detach().numpy()))
    """
    fix_example = """
        def forward(self, x):
            h = self.fc(x)
            return torch.exp(h)
    """
    VALID = [
        # type dispatch over outputs of other runtimes
        """
        import numpy as np
        import torch.nn as nn
        class Backend(nn.Module):
            def forward(self, im):
                y = self.model(im)
                y = [x if isinstance(x, np.ndarray) else x.numpy() for x in y]
                return y
        """,
        # an inference dispatcher: the input goes to another runtime on one branch, to the layers on another
        """
        import torch
        import torch.nn as nn
        class Backend(nn.Module):
            def forward(self, im):
                if self.pt:
                    y = self.model(im)
                elif self.onnx:
                    im = im.cpu().numpy()
                    y = self.session.run(None, {"images": im})
                return y
        """,
        """
        import numpy as np
        import torch
        import torch.nn as nn
        class Attn(nn.Module):
            def forward(self, q, k):
                scores = q @ k.transpose(-2, -1) / np.sqrt(self.d_k)
                n = np.prod(q.shape[:-1])
                return scores * np.pi / n
        """,
        # numpy outside forward / in evaluation helpers
        """
        import numpy as np
        import torch
        def evaluate(model, x):
            preds = model(x).detach().cpu().numpy()
            return np.mean(preds)
        """,
        # scalar parameters and sizes
        """
        import numpy as np
        import torch.nn as nn
        class PE(nn.Module):
            def forward(self, x, scale: float = 1.0):
                seq = x.size(1)
                pos = np.arange(seq)
                return x + self.table[:seq] * np.log(scale)
        """,
        # prioritized replay: the loss, and beside it the detached per-sample errors as new priorities
        """
        import torch
        def weighted_td_loss(q, target, weights):
            td = torch.nn.functional.smooth_l1_loss(q, target, reduction="none")
            weighted = weights * td
            return torch.mean(weighted), (weighted + 1e-6).detach().cpu().numpy()
        """,
        # the same, with the errors computed from two detached NumPy copies
        """
        import torch
        import torch.nn.functional as F
        def q_loss_and_errors(q, target, weights):
            loss = torch.mean(F.mse_loss(q, target, reduction="none") * weights)
            errors = target.data.cpu().numpy() - q.data.cpu().numpy()
            return loss, errors
        """,
        # arrays from a replay buffer are NumPy, not tensors; priorities and metrics leave the graph on purpose
        """
        import numpy as np
        import torch
        import torch.nn.functional as F
        def compute_td_loss(batch_size):
            state, action, reward, done, indices = replay_buffer.sample(batch_size)
            state = torch.FloatTensor(np.float32(state))
            q = current_model(state).gather(1, torch.LongTensor(action).unsqueeze(1)).squeeze(1)
            loss = (q - torch.FloatTensor(reward)).pow(2)
            priorities = loss + 1e-5
            loss = loss.mean()
            loss.backward()
            replay_buffer.update_priorities(indices, priorities.data.cpu().numpy())
            return loss
        def segmentation_loss(pred, target, metrics):
            loss = F.binary_cross_entropy_with_logits(pred, target)
            metrics["loss"] += loss.data.cpu().numpy() * target.size(0)
            return loss
        """,
        # a module computing in NumPy, with neither layers nor torch: nothing shows its values are tensors
        """
        import numpy as np
        import torch.nn as nn
        class ArrayPropagation(nn.Module):
            def __init__(self, weights):
                super().__init__()
                self.weights = weights
            def forward(self, x, adj):
                for weight, bias in self.weights:
                    x = np.maximum(adj @ x @ weight + bias, 0)
                return x
        """,
        # a loss-plotting helper is not a loss function
        """
        import numpy as np
        import torch
        def plot_losses(losses):
            smooth = np.convolve(losses, np.ones(5) / 5)
            plt.plot(smooth)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import numpy as np
            import torch
            import torch.nn as nn
            class Net(nn.Module):
                def forward(self, x):
                    h = self.fc(x)
                    return torch.from_numpy(np.exp(h.detach().numpy()))
            """,
            line=8, message="Net.forward",
        ),
        Invalid(
            """
            import numpy
            import torch
            from torch import nn
            class Gate(nn.Module):
                def forward(self, x, mask=None):
                    w = self.proj(x)
                    w = numpy.tanh(w)
                    return x * torch.as_tensor(w)
            """,
            line=8, message="`w`",
        ),
        Invalid(
            """
            import numpy as np
            import torch
            def focal_loss(logits, targets, gamma=2.0):
                p = torch.sigmoid(logits)
                weight = np.power(1 - p, gamma)
                return (weight * targets).mean()
            """,
            line=6, message="focal_loss",
        ),
        Invalid(
            """
            import numpy as np
            import torch
            import torch.nn as nn
            class DiceLoss(nn.Module):
                def forward(self, pred, target):
                    inter = np.sum(pred * target)
                    return 1 - 2 * inter / (pred.sum() + target.sum())
            """,
            line=7, message="DiceLoss.forward",
        ),
        Invalid(
            """
            import numpy as np
            import torch.nn as nn
            class M(nn.Module):
                def forward(self, x):
                    arr = x.cpu().numpy()
                    out = np.exp(arr)
                    return x
            """,
            line=6, message="x.cpu().numpy()",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._states: list[_NumpyState] = []
        self._numpy_names = {local for local, q in ctx.imports.names.items() if q == "numpy" or q.startswith("numpy.")}

    def _kind(self, node: cst.FunctionDef, ctx: FileContext) -> tuple[Optional[str], str]:
        cls = ctx.class_def
        block = ctx.parent(node)
        method = cls is not None and block is not None and ctx.parent(block) is cls
        name = node.name.value
        if method:
            label = f"{cls.name.value}.{name}"
            is_module = ctx.is_module_subclass(cls)
            if name == "forward" and is_module:
                return "forward", label
            if "loss" in cls.name.value.lower() and name in ("forward", "__call__"):
                return "loss", label
        else:
            label = name
        lowered = name.lower()
        if "loss" in lowered and not lowered.lstrip("_").startswith(_NOT_LOSS_PREFIXES):
            return "loss", label
        return None, label

    def visit_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        kind, label = self._kind(node, ctx)
        state = _NumpyState(node, kind, label)
        state.loss_class = ctx.class_def is not None and "loss" in ctx.class_def.name.value.lower()
        if kind is not None:
            params = node.params
            skip_first = label != node.name.value  # a method: drop self
            ordered = list(params.posonly_params) + list(params.params)
            if skip_first and ordered:
                ordered = ordered[1:]
            for param in ordered + list(params.kwonly_params):
                if _scalar_param(param):
                    continue
                state.tainted.add(param.name.value)
        self._states.append(state)

    def leave_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        state = self._states.pop()
        if state.kind == "loss" and not state.uses_torch:
            return
        if state.kind == "forward" and not (state.uses_torch or state.calls_layers or state.loss_class):
            return  # neither torch nor layers of its own: nothing shows its values are tensors with a graph
        for found, message in state.found:
            if detached_side_output(found, ctx):
                continue  # ``return loss, td.detach().cpu().numpy()``: priorities / stats beside the loss, on purpose
            if taken_off_graph(found) and not flows_back_into_result(found, ctx):
                continue  # taken off the graph on purpose (metrics, replay priorities) and never fed back
            if state.calls_layers and found in state.on_raw_input:
                # NumPy on the raw input of a module that runs its own layers elsewhere: pre-processing or a
                # hand-off to another runtime (ONNX Runtime, OpenCV), not a cut in this module's gradient path
                continue
            self.report(found, message)

    def _state(self) -> Optional[_NumpyState]:
        if self._states and self._states[-1].kind is not None and self.ctx.function is self._states[-1].node:
            return self._states[-1]
        return None

    def leave_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        state = self._state()
        if state is not None:
            self._taint([t.target for t in node.targets], node.value, state)

    def leave_AnnAssign(self, node: cst.AnnAssign, ctx: FileContext) -> None:
        state = self._state()
        if state is not None and node.value is not None:
            self._taint([node.target], node.value, state)

    def visit_For(self, node: cst.For, ctx: FileContext) -> None:
        state = self._state()
        if state is not None:
            self._taint([node.target], node.iter, state)

    def _taint(self, targets, value, state: _NumpyState) -> None:
        tensor = self._uses_tensor(value, state)
        activation = state.kind == "forward" and self._is_activation(value, state)
        for target in targets:
            for name in _target_names(target):
                if tensor:
                    state.tainted.add(name)
                else:
                    state.tainted.discard(name)
                if activation:
                    state.activations.add(name)
                else:
                    state.activations.discard(name)

    @staticmethod
    def _is_activation(expr: cst.CSTNode, state: _NumpyState) -> bool:
        """Computed by a layer of this module (``self.fc(x)``), or from such a value."""
        for node in subtree(expr):
            if isinstance(node, cst.Name) and node.value in state.activations:
                return True
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                receiver = node.func.value
                while isinstance(receiver, cst.Attribute):
                    receiver = receiver.value
                if isinstance(receiver, cst.Name) and receiver.value == "self" and \
                        isinstance(node.func.value, cst.Name):
                    return True  # self.layer(x)
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                    isinstance(node.func.value, cst.Attribute) and dotted_name(node.func.value) and \
                    dotted_name(node.func.value).startswith("self."):
                return True  # self.blocks.forward(x) / self.head.fc(x)
        return False

    def _uses_tensor(self, expr: cst.CSTNode, state: _NumpyState) -> Optional[str]:
        """The first tensor-valued name used in ``expr`` outside shape/scalar/NumPy contexts."""
        if not state.tainted:
            return None
        stack: list[cst.CSTNode] = [expr]
        while stack:
            node = stack.pop()
            if isinstance(node, cst.Name):
                if node.value in state.tainted:
                    return node.value
                continue
            if isinstance(node, cst.Attribute):
                if node.attr.value not in _SHAPE_ATTRS:
                    stack.append(node.value)
                continue
            if isinstance(node, cst.Call):
                func = node.func
                last = last_name(func)
                if isinstance(func, cst.Attribute) and last in _SCALAR_METHODS:
                    continue
                if isinstance(func, cst.Name) and last in _SCALAR_BUILTINS:
                    continue
                if self._is_numpy(func):
                    continue  # reported on its own
                if isinstance(func, cst.Attribute) and not (dotted_name(func) or "").startswith("self."):
                    stack.append(func.value)  # a method: a tensor's method keeps it a tensor, another object's is unknown
                    if returns_tensor_of_args(node, self.ctx):
                        stack.extend(reversed([a.value for a in node.args]))
                elif returns_tensor_of_args(node, self.ctx):
                    stack.extend(reversed([func] + [a.value for a in node.args]))
                else:
                    stack.append(func)  # ``model(x)`` with ``model`` a parameter of the loss function
                continue
            if isinstance(node, cst.Arg):
                stack.append(node.value)
                continue
            if isinstance(node, (cst.Lambda, cst.SimpleString, cst.FormattedString)):
                continue
            stack.extend(reversed(all_children(node)))
        return None

    def _is_numpy(self, func: cst.BaseExpression) -> bool:
        if not self._numpy_names:
            return False
        head = func
        while isinstance(head, cst.Attribute):
            head = head.value
        return isinstance(head, cst.Name) and head.value in self._numpy_names and \
            (self.ctx.qualified_name(func) or "").startswith("numpy")

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if not self._states:
            return
        state = self._state()
        if state is None:
            return
        func = node.func
        if state.kind == "forward" and isinstance(func, cst.Attribute) and \
                (dotted_name(func.value) or "").startswith("self") and func.attr.value not in _SCALAR_METHODS:
            state.calls_layers = True
        if not state.uses_torch:
            name = ctx.call_name(node) if isinstance(func, (cst.Name, cst.Attribute)) else None
            if name is not None and name.startswith("torch") or \
                    isinstance(func, cst.Attribute) and func.attr.value in TENSOR_ONLY_METHODS:
                state.uses_torch = True
        last = last_name(func)
        if last == "numpy" and isinstance(func, cst.Attribute) and not node.args:
            if ctx.qualified_name(func) is None:
                self._found(state, node, f"{code_span(short(ctx, node))} in {state.label} converts a tensor to NumPy: "
                                         f"no gradient flows back through it, and it forces a device sync; "
                                         f"keep the computation in torch")
            return
        if not self._is_numpy(func):
            return
        for arg in node.args:
            tensor = self._uses_tensor(arg.value, state)
            if tensor is not None:
                np_name = dotted_name(func)
                if last in _NP_CONVERSIONS:
                    advice = f"keep `{tensor}` a tensor"
                else:
                    advice = f"use torch.{_NP_TO_TORCH.get(last, last)} instead"
                self._found(state, node, f"`{np_name}(...)` in {state.label} runs NumPy on {named('tensor', tensor)}: "
                                         f"autograd does not track NumPy, so no gradient flows back through it; "
                                         f"{advice}")
                return

    def _found(self, state: _NumpyState, node: cst.Call, message: str) -> None:
        if any(isinstance(a, (cst.IfExp, cst.If)) and uses_name(a.test, "isinstance")
               for a in self.ctx.ancestors(node)):
            return  # type dispatch (``x if isinstance(x, np.ndarray) else x.numpy()``): other runtimes' outputs
        if self.ctx.in_no_grad() or any("inference" in d or "no_grad" in d
                                        for d in self.ctx.decorators_of(state.node)):
            return  # no gradient is wanted there (a loss for logging, an inference-only forward)
        if state.kind == "forward" and not self._is_activation(node, state):
            state.on_raw_input.add(node)
        statement = self.ctx.statement_of(node)
        if statement in state.statements:
            return
        state.statements.add(statement)
        state.found.append((node, message))


def _scalar_param(param: cst.Param) -> bool:
    annotation = param.annotation.annotation if param.annotation is not None else None
    if isinstance(annotation, cst.Name) and annotation.value in _SCALAR_ANNOTATIONS:
        return True
    default = param.default
    if isinstance(default, (cst.Integer, cst.Float, cst.SimpleString, cst.Tuple)):
        return True
    if isinstance(default, cst.UnaryOperation) and isinstance(default.expression, (cst.Integer, cst.Float)):
        return True
    return isinstance(default, cst.Name) and default.value in ("True", "False")


def _target_names(target: cst.BaseExpression):
    if isinstance(target, cst.Name):
        yield target.value
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from _target_names(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from _target_names(target.value)
