"""What a ``torch.load`` call unpickles, read from how the program uses its result.

``model.load_state_dict(torch.load(p))`` shows a dict of tensors; ``net = torch.load(p); net.eval()`` or
``net(x)`` a whole module; ``arr = torch.load(p); arr.astype(...)`` a NumPy array; ``ckpt = torch.load(p);
ckpt["args"].lr`` an object with attributes. ``weights_only=True`` loads the first and refuses the others. The
tables of methods live in :mod:`analyzers.program.library`; what ``torch.save`` writes is
:class:`analyzers.program.roles.CheckpointWrites`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst

from analyzers.context import dotted_name
from analyzers.program.flow import ModuleNodes, subtree
from analyzers.program.library import (ARRAY_ONLY_METHODS, CONTAINER_ATTRIBUTES, ITEM_METHODS, MODULE_ONLY_METHODS,
                                       PLAIN_VALUE_BUILTINS, RETURNS_RECEIVER, STATE_DICT_CONSUMERS,
                                       STATE_DICT_KEYWORDS, Does, does)
from analyzers.program.roles import Payload

if TYPE_CHECKING:
    from analyzers.context import FileContext

_MAX_USES = 40  # reads of a name followed: enough for a loading function, bounded for a long script


class LoadedPayloads:
    """Per file: ``of(load)``, the payload kinds the uses of a load's result show (empty: the uses say nothing),
    and ``uses(load)``, a phrase naming the use that showed each kind, for messages."""

    def __init__(self, ctx: "FileContext") -> None:
        self.ctx = ctx
        self._parents = ctx.facts(ModuleNodes).parents
        self._found: dict[int, dict[Payload, str]] = {}
        self._escapes: dict[int, str] = {}
        self._escape = ""

    def of(self, load: cst.Call) -> set[Payload]:
        return set(self._shown(load))

    def use(self, load: cst.Call, kind: Payload) -> str:
        """The code that shows ``kind`` (``ckpt.args``, ``net.eval()``), or "" when none does."""
        return self._shown(load).get(kind, "")

    def escapes(self, load: cst.Call) -> str:
        """Where the loaded value (or an item of it) goes to code this file does not show, so that code decides
        what the payload must be: returned (by a function this file never calls), yielded, or passed to a function or class other than a builtin (the
        code of that use, ``build_model(ckpt["cfg"])``); "" when every use stays in view."""
        self._shown(load)
        return self._escapes.get(id(load), "")

    def fed_whole_to_state_dict(self, load: cst.Call) -> bool:
        """The load itself is the state dict argument of a consumer (``model.load_state_dict(torch.load(p))``,
        ``Net.from_pretrained(..., state_dict=torch.load(p))``): the file holds a state dict, else that call fails."""
        arg = self._parent(load)
        call = self._parent(arg) if isinstance(arg, cst.Arg) else None
        if not isinstance(call, cst.Call) or arg.value is not load:
            return False
        if arg.keyword is not None:
            return arg.keyword.value in STATE_DICT_KEYWORDS
        method = call.func.attr.value if isinstance(call.func, cst.Attribute) else dotted_name(call.func)
        return method in STATE_DICT_CONSUMERS and call.args[0] is arg

    def _shown(self, load: cst.Call) -> dict[Payload, str]:
        if id(load) not in self._found:
            found: dict[Payload, str] = {}
            self._escape = ""
            self._judge(load, found, depth=3)
            self._found[id(load)] = found
            self._escapes[id(load)] = self._escape
        return self._found[id(load)]

    def _parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self._parents.get(id(node))

    def _code(self, node: cst.CSTNode) -> str:
        return " ".join(self.ctx.module.code_for_node(node).split())

    def _judge(self, value: cst.BaseExpression, found: dict[Payload, str], depth: int) -> None:
        """What the expression ``value`` (the load, an item of it, or a read of the name it was stored in) is used
        as, added to ``found``."""
        parent = self._parent(value)
        if isinstance(parent, cst.Subscript) and parent.value is value:
            self._judge(parent, found, depth)  # ``ckpt["model"]``: judged by what that item is used as
        elif isinstance(parent, cst.BooleanOperation):
            self._judge(parent, found, depth)  # ``ckpt.get("ema") or ckpt["model"]``: either item, used as the whole
        elif isinstance(parent, cst.Attribute) and parent.value is value and self._passes_through(parent):
            # ``ckpt.get("model")`` is an item; ``.to(device)``, ``.float()`` hand back the value they are called on
            # (a tensor's or a module's, as the library table documents): judged by what the result is used as
            self._attribute(parent, found)
            self._judge(self._parent(parent), found, depth)
        elif isinstance(parent, cst.Arg):
            call = self._parent(parent)
            if not isinstance(call, cst.Call):
                return
            method = call.func.attr.value if isinstance(call.func, cst.Attribute) else ""
            if method in STATE_DICT_CONSUMERS and parent.keyword is None and call.args[0] is parent or \
                    parent.keyword is not None and parent.keyword.value in STATE_DICT_KEYWORDS:
                found.setdefault(Payload.TENSORS, self._code(call))
            elif not self._escape and self._hands_over(call, method):
                self._escape = self._code(call)
        elif isinstance(parent, cst.Return) and value is not None:
            # returned from a helper: judged by what the file's callers of the helper do with it
            calls = self._callers(parent, value) if depth else None
            if calls is None:
                self._escape = self._escape or self._code(parent)
            for call in calls or ():
                self._judge(call, found, depth - 1)
        elif isinstance(parent, cst.Yield) and not self._escape:
            self._escape = self._code(parent)
        elif isinstance(parent, cst.Call) and parent.func is value:
            found.setdefault(Payload.MODULE, self._code(parent))  # ``net(x)``: the file holds something callable
        elif isinstance(parent, cst.Attribute) and parent.value is value:
            self._attribute(parent, found)
        elif isinstance(parent, cst.Assign) and depth and len(parent.targets) == 1 and parent.value is value:
            name = dotted_name(parent.targets[0].target)
            if name:
                for read in self._reads(parent, name)[:_MAX_USES]:
                    self._judge(read, found, depth - 1)

    def _passes_through(self, attribute: cst.Attribute) -> bool:
        """``value.<attribute>(...)`` gives an item of the value or the value itself (moved or cast)."""
        call = self._parent(attribute)
        if not (isinstance(call, cst.Call) and call.func is attribute):
            return False
        return attribute.attr.value in ITEM_METHODS or attribute.attr.value in RETURNS_RECEIVER

    def _callers(self, returned: cst.Return, value: cst.BaseExpression) -> Optional[list[cst.Call]]:
        """The calls in this file of the function that returns the whole loaded value (``return ckpt``, not an item
        of it), by its name or as ``self.<name>``; None when it has none or the value returned is only a part."""
        fn = next((node for node in self._ancestry(returned) if isinstance(node, (cst.FunctionDef, cst.Lambda))), None)
        if not isinstance(fn, cst.FunctionDef) or isinstance(value, cst.Subscript):
            return None
        name = fn.name.value
        calls = [node for node in self.ctx.facts(ModuleNodes).of_type(cst.Call)
                 if (dotted_name(node.func) or "") in (name, f"self.{name}", f"cls.{name}")]
        return calls or None

    def _hands_over(self, call: cst.Call, method: str) -> bool:
        """Is ``call`` code that decides what its argument must be, out of this file's view? Not a builtin, torch or
        NumPy (they take tensors and arrays), nor a dict's, list's or tensor's own method."""
        qualified = self.ctx.qualified_name(call.func) or dotted_name(call.func) or ""
        if qualified in PLAIN_VALUE_BUILTINS or qualified.split(".", 1)[0] in ("torch", "numpy"):
            return False
        return method not in CONTAINER_ATTRIBUTES and not method.endswith("_")

    def _attribute(self, attribute: cst.Attribute, found: dict[Payload, str]) -> None:
        name = attribute.attr.value
        called = isinstance(self._parent(attribute), cst.Call) and self._parent(attribute).func is attribute
        if name in MODULE_ONLY_METHODS and called:
            found.setdefault(Payload.MODULE, self._code(attribute) + "()")
        elif name in ARRAY_ONLY_METHODS:
            found.setdefault(Payload.NUMPY, self._code(attribute))
        elif not called and name not in CONTAINER_ATTRIBUTES and not name.startswith("_"):
            # ``ckpt.args``, ``ckpt["opt"].lr``: a field of an object (a Namespace, a config, a custom class)
            found.setdefault(Payload.NAMESPACE, self._code(attribute))

    def _reads(self, assign: cst.Assign, name: str) -> list[cst.BaseExpression]:
        """The reads of ``name`` (a local, or ``self.x``) in the function that assigns it: the same names or
        attributes, not the assignment's own target."""
        scope = next((node for node in self._ancestry(assign) if isinstance(node, (cst.FunctionDef, cst.Module))),
                     self.ctx.module)
        if name.startswith("self."):
            cls = next((node for node in self._ancestry(assign) if isinstance(node, cst.ClassDef)), None)
            scope = cls if cls is not None else scope
        target = assign.targets[0].target
        reads: list[cst.BaseExpression] = []
        for node in subtree(scope):
            if node is target or not isinstance(node, (cst.Name, cst.Attribute)) or dotted_name(node) != name:
                continue
            parent = self._parent(node)
            if isinstance(parent, cst.AssignTarget) or (isinstance(parent, cst.Attribute) and parent.attr is node):
                continue
            reads.append(node)
        return reads

    def _ancestry(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        chain = [node]
        while (parent := self._parent(chain[-1])) is not None:
            chain.append(parent)
        return chain


def loaded_payloads(ctx: "FileContext", load: cst.Call) -> set[Payload]:
    """The payload kinds the uses of ``load``'s result show; empty when they show none."""
    return ctx.facts(LoadedPayloads).of(load)


def checkpoint_load_of(expr: Optional[cst.BaseExpression], ctx: "FileContext", depth: int = 0) -> Optional[cst.Call]:
    """The checkpoint read (``torch.load(...)``) a value comes from: the call itself, through names it was
    assigned to, or a key of one (``ckpt["model"]``); None otherwise."""
    if expr is None or depth > 3:
        return None
    if isinstance(expr, cst.Call):
        return expr if does(ctx.qualified_name(expr.func), Does.READS_TORCH_CHECKPOINT) else None
    if isinstance(expr, cst.Subscript):
        return checkpoint_load_of(expr.value, ctx, depth + 1)
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return checkpoint_load_of(ctx.assigned_value(expr), ctx, depth + 1)
    return None
