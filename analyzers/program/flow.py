"""Value flow inside one file: mutations, stores, and the values call sites pass to a parameter."""
from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from analyzers.context import dotted_name

# Methods that change a list / dict / set in place.
MUTATING_METHODS = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "add", "discard",
    "sort", "reverse", "popitem", "__setitem__",
})


def subtree(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node under ``node`` (iterative: deep expressions cannot overflow the stack)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))  # source order


def _target_root(target: cst.BaseExpression) -> Optional[str]:
    """``x`` for ``x[...]`` / ``x.attr[...]`` targets (the container that is written into)."""
    while isinstance(target, cst.Subscript):
        target = target.value
    return dotted_name(target)


def mutated_names(scope: cst.CSTNode) -> set[str]:
    """Dotted names whose value is changed in place anywhere under ``scope``.

    ``x.append(..)``, ``x[k] = ..``, ``x += ..``, ``del x[k]`` mutate ``x``; a plain ``x = ..`` rebinds it
    and does not.
    """
    mutated: set[str] = set()
    for node in subtree(scope):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            if node.func.attr.value in MUTATING_METHODS:
                name = _target_root(node.func.value)
                if name:
                    mutated.add(name)
        elif isinstance(node, cst.Assign):
            for target in node.targets:
                if isinstance(target.target, cst.Subscript):
                    name = _target_root(target.target)
                    if name:
                        mutated.add(name)
        elif isinstance(node, cst.AugAssign):
            name = _target_root(node.target)
            if name:
                mutated.add(name)
        elif isinstance(node, cst.Del):
            for element in subtree(node.target):
                if isinstance(element, cst.Subscript):
                    name = _target_root(element)
                    if name:
                        mutated.add(name)
    return mutated


def stored_attributes(scope: cst.CSTNode, names: set[str]) -> dict[str, str]:
    """``{"layers": "self.layers"}`` for ``self.layers = layers``: which of ``names`` are kept on an object."""
    stored: dict[str, str] = {}
    for node in subtree(scope):
        if isinstance(node, cst.Assign) and isinstance(node.value, cst.Name) and node.value.value in names:
            for target in node.targets:
                if isinstance(target.target, cst.Attribute):
                    attribute = dotted_name(target.target)
                    if attribute:
                        stored[node.value.value] = attribute
    return stored


def parameter_index(fn: cst.FunctionDef, name: str) -> Optional[int]:
    """Position of parameter ``name`` as a call passes it positionally (``self`` excluded for methods)."""
    positional = [*fn.params.posonly_params, *fn.params.params]
    names = [p.name.value for p in positional]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return names.index(name) if name in names else None


def call_site_values(module: cst.Module, fn: cst.FunctionDef, name: str) -> Optional[list[cst.BaseExpression]]:
    """The expressions every call of ``fn`` in this file passes for parameter ``name``.

    None when the answer is unknown: no call in the file, or a call that passes it through ``*args`` /
    ``**kwargs`` or relies on the default (callers elsewhere may pass anything).
    """
    function_name = fn.name.value
    position = parameter_index(fn, name)
    first = [*fn.params.posonly_params, *fn.params.params][:1]
    method = bool(first) and first[0].name.value in ("self", "cls")
    values: list[cst.BaseExpression] = []
    for node in subtree(module):
        if not isinstance(node, cst.Call):
            continue
        if method:  # obj.train_step(...)
            called = node.func.attr.value if isinstance(node.func, cst.Attribute) else None
        else:  # train(...), not model.train()
            called = node.func.value if isinstance(node.func, cst.Name) else None
        if called != function_name:
            continue
        value = None
        for arg in node.args:
            if arg.star:
                return None
            if arg.keyword is not None and arg.keyword.value == name:
                value = arg.value
        if value is None and position is not None:
            positional = [a for a in node.args if a.keyword is None]
            if position < len(positional):
                value = positional[position].value
        if value is None:
            return None
        values.append(value)
    return values or None


def assignment_before(ctx, use: cst.CSTNode, name: str, unpacked: bool = False) -> Optional[cst.BaseExpression]:
    """The value last assigned to ``name`` in the function (or module) that holds ``use``, before it.

    For questions asked after the walk, when the walk's own scopes are gone: the model variable at a call
    site, ``model = Net().to(device)`` two lines above ``train(model, ...)``. With ``unpacked``, an unpacking
    rebinds the name too: ``x, y = a, b`` gives ``a``; ``model, loader = accelerator.prepare(model, loader)``
    gives the whole right side (not the ``DataLoader(...)`` assigned before it).
    """
    scope: Optional[cst.CSTNode] = use
    while scope is not None and not isinstance(scope, (cst.FunctionDef, cst.Module)):
        scope = ctx.parents.get(id(scope))
    if scope is None:
        return None
    found = _last_assignment(scope, use, name, frozenset(ctx.ancestors(use)), unpacked)
    if found is None and isinstance(scope, cst.FunctionDef) and not _binds(scope, name):
        # a global read inside a function (``def test(): ... model(x)`` with ``model = Net()`` at module level):
        # the module's last assignment, since functions run after the module body defined them
        found = _last_assignment(ctx.module, None, name, unpacked=unpacked)
    return found


def _binds(fn: cst.FunctionDef, name: str) -> bool:
    params = fn.params
    return any(p.name.value == name for p in (*params.posonly_params, *params.params, *params.kwonly_params))


def _last_assignment(scope: cst.CSTNode, use: Optional[cst.CSTNode], name: str,
                     enclosing: frozenset = frozenset(), unpacked: bool = False) -> Optional[cst.BaseExpression]:
    found: Optional[cst.BaseExpression] = None
    stack: list[cst.CSTNode] = [scope.body] if isinstance(scope, cst.FunctionDef) else list(reversed(scope.body))
    order: list[cst.CSTNode] = []
    while stack:  # source order, without entering nested functions or classes
        node = stack.pop()
        if node is use:
            break
        order.append(node)
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        stack.extend(reversed(node.children))
    for node in order:
        if node in enclosing:
            continue  # ``model = model.to(device)`` read from its own right side: the assignment before it
        if isinstance(node, cst.Assign) and any(dotted_name(t.target) == name for t in node.targets):
            found = node.value
        elif unpacked and isinstance(node, cst.Assign):
            for t in node.targets:
                part = _unpacked_part(t.target, node.value, name)
                if part is not None:
                    found = part
    return found


def _unpacked_part(target: cst.BaseExpression, value: cst.BaseExpression,
                   name: str) -> Optional[cst.BaseExpression]:
    """What ``name`` receives from ``target = value`` when ``target`` unpacks: the matching element of a
    literal tuple, else the whole right side; None when ``target`` does not bind ``name``."""
    if not isinstance(target, (cst.Tuple, cst.List)):
        return None
    pairs = isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(target.elements) and \
        not any(isinstance(e, cst.StarredElement) for e in (*target.elements, *value.elements))
    for i, element in enumerate(target.elements):
        inner = element.value
        if dotted_name(inner) == name:
            return value.elements[i].value if pairs else value
        if isinstance(inner, (cst.Tuple, cst.List)):
            part = _unpacked_part(inner, value.elements[i].value if pairs else value, name)
            if part is not None:
                return part
    return None
