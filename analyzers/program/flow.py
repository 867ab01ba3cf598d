"""Value flow inside one file: mutations, stores, and the values call sites pass to a parameter."""
from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from analyzers.context import (CHILD_FIELDS, NODE_TYPES, FileContext, all_children, call_receiver,
                               code_children_as_written, dotted_name, iter_names, method_name)
from analyzers.program.library import LOG_SINKS, is_logging_call

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
        stack.extend(reversed(all_children(current)))  # source order


class ModuleNodes:
    """Every code node of the file (``code_children``'s: no whitespace or punctuation) in source order, and each
    one's parent, listed once per file (``ctx.facts(ModuleNodes)``) for the questions that look over the whole
    module, after the walk or before it reaches a node; each such question was a walk of its own."""

    def __init__(self, ctx) -> None:
        nodes: list[cst.CSTNode] = []
        append = nodes.append
        # Once the engine's walk is over, its parent map is this one (the same code nodes, each under its parent):
        # shared, not built again. Asked during the walk, the map is built here.
        parents: Optional[dict[int, cst.CSTNode]] = None if getattr(ctx, "walked", False) else {}
        stack: list[cst.CSTNode] = [ctx.module]
        pop, extend = stack.pop, stack.extend
        while stack:
            node = pop()
            append(node)
            children = code_children_as_written(node)
            if parents is not None:
                for child in children:
                    parents[id(child)] = node
            children.reverse()
            extend(children)
        self.nodes = nodes
        self.parents = parents if parents is not None else ctx.parents
        self._of_types: dict[tuple[type, ...], list[cst.CSTNode]] = {}

    def of_type(self, *kinds: type) -> list:
        """The nodes that are instances of ``kinds``, in source order."""
        found = self._of_types.get(kinds)
        if found is None:
            wanted = {node_type for node_type in NODE_TYPES if issubclass(node_type, kinds)}  # isinstance, by set
            found = self._of_types[kinds] = [node for node in self.nodes if type(node) in wanted]
        return found


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


def attribute_values(cls: cst.ClassDef, attribute: str) -> list[cst.BaseExpression]:
    """Every value a method of ``cls`` assigns to ``self.<attribute>`` (``self.model = model_fn`` gives
    ``model_fn``): what the attribute can hold, as far as this class sets it."""
    found: list[cst.BaseExpression] = []
    for node in subtree(cls):
        if isinstance(node, cst.Assign):
            targets, value = [t.target for t in node.targets], node.value
        elif isinstance(node, cst.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(dotted_name(target) == f"self.{attribute}" for target in targets):
            found.append(value)
    return found


def parameter_index(fn: cst.FunctionDef, name: str) -> Optional[int]:
    """Position of parameter ``name`` as a call passes it positionally (``self`` excluded for methods)."""
    positional = [*fn.params.posonly_params, *fn.params.params]
    names = [p.name.value for p in positional]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return names.index(name) if name in names else None


class FlowIndex:
    """What value-flow questions asked after the walk need, indexed once per file (``ctx.facts(FlowIndex)``): the
    calls by what they call, and each scope's statements in source order with their assignments, so following
    a parameter through every call site, or a name to its last assignment, is a lookup rather than a walk of
    the file for every question."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self._calls: Optional[dict[tuple[bool, str], list[cst.Call]]] = None
        self._scopes: dict[int, tuple[dict[int, int], list[tuple[int, cst.Assign]]]] = {}

    def calls(self, method: bool, name: str) -> list[cst.Call]:
        """``x.step(...)`` calls for (True, "step"), ``train(...)`` for (False, "train"); in source order."""
        if self._calls is None:
            self._calls = {}
            for node in self.ctx.facts(ModuleNodes).of_type(cst.Call):
                func = node.func
                if type(func) is cst.Attribute:
                    self._calls.setdefault((True, func.attr.value), []).append(node)
                elif type(func) is cst.Name:
                    self._calls.setdefault((False, func.value), []).append(node)
        return self._calls.get((method, name), [])

    def scope_order(self, scope: cst.CSTNode) -> tuple[dict[int, int], list[tuple[int, cst.Assign]]]:
        """The scope's code nodes in source order (id -> position), not entering nested functions or classes, and
        its assignments with their positions."""
        found = self._scopes.get(id(scope))
        if found is None:
            positions: dict[int, int] = {}
            assigns: list[tuple[int, cst.Assign]] = []
            stack: list[cst.CSTNode] = [scope.body] if isinstance(scope, cst.FunctionDef) else list(reversed(scope.body))
            while stack:
                node = stack.pop()
                positions[id(node)] = len(positions)
                if type(node) is cst.Assign:
                    assigns.append((positions[id(node)], node))
                if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                    continue
                stack.extend(reversed(code_children_as_written(node)))
            found = self._scopes[id(scope)] = (positions, assigns)
        return found


def may_run_before(ctx, first: cst.CSTNode, second: cst.CSTNode) -> bool:
    """Can ``first`` have run before ``second`` in one run of the program?

    No only when the order is plain: both in one scope (the module, or one function), ``first`` written after the
    end of ``second`` and no loop holding both (a later iteration would run it first): a model moved in a
    notebook cell below the loop that feeds it. Yes whenever they sit in different scopes (which function runs
    when is not known here)."""
    parents = ctx.facts(ModuleNodes).parents

    def chain(node: cst.CSTNode) -> list[cst.CSTNode]:
        found = [node]
        while (parent := parents.get(id(found[-1]))) is not None:
            found.append(parent)
        return found

    firsts, seconds = chain(first), chain(second)
    scope_kinds = (cst.FunctionDef, cst.Lambda, cst.ClassDef)
    first_scope = next((n for n in firsts[1:] if isinstance(n, scope_kinds)), None)
    second_scope = next((n for n in seconds[1:] if isinstance(n, scope_kinds)), None)
    if first_scope is not second_scope:
        return True
    second_ids = {id(n) for n in seconds}
    if any(id(n) == id(second) for n in firsts):
        return True  # ``first`` inside ``second``
    shared = [n for n in firsts if id(n) in second_ids]
    if any(isinstance(n, (cst.For, cst.While)) for n in shared):
        return True
    scope = first_scope if first_scope is not None else ctx.module
    positions, _ = ctx.facts(FlowIndex).scope_order(scope)
    at_first, at_second = positions.get(id(first)), positions.get(id(second))
    return at_first is None or at_second is None or at_first < at_second


def call_site_values(ctx, fn: cst.FunctionDef, name: str) -> Optional[list[cst.BaseExpression]]:
    """The expressions every call of ``fn`` in this file passes for parameter ``name``.

    None when the answer is unknown: no call in the file, or a call that passes it through ``*args`` /
    ``**kwargs`` or relies on the default (callers elsewhere may pass anything).
    """
    function_name = fn.name.value
    position = parameter_index(fn, name)
    first = [*fn.params.posonly_params, *fn.params.params][:1]
    method = bool(first) and first[0].name.value in ("self", "cls")
    values: list[cst.BaseExpression] = []
    calls = ctx.facts(FlowIndex).calls(method, function_name)
    if method and function_name == "__init__":
        # a constructor's parameters are what the class is called with (``Trainer(args)``), not what a
        # subclass's ``super().__init__(...)`` passes
        owner = ctx.parents.get(id(fn))
        while owner is not None and not isinstance(owner, cst.ClassDef):
            owner = ctx.parents.get(id(owner))
        calls = ctx.facts(FlowIndex).calls(False, owner.name.value) if owner is not None else []
    # obj.train_step(...) for a method; train(...), not model.train(), for a function
    for node in calls:
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
    # the walk's parents reach only what it has visited; a use further down the file needs the whole file's
    parents = ctx.parents if id(use) in ctx.parents else ctx.facts(ModuleNodes).parents
    ancestors: list[cst.CSTNode] = []
    scope: Optional[cst.CSTNode] = use
    while scope is not None and not isinstance(scope, (cst.FunctionDef, cst.Module)):
        scope = parents.get(id(scope))
        if scope is not None:
            ancestors.append(scope)
    if scope is None:
        return None
    current = parents.get(id(scope))
    while current is not None:
        ancestors.append(current)
        current = parents.get(id(current))
    found = _last_assignment(ctx, scope, use, name, frozenset(ancestors), unpacked)
    if found is None and isinstance(scope, cst.FunctionDef) and parameter(scope, name) is None:
        # a global read inside a function (``def test(): ... model(x)`` with ``model = Net()`` at module level):
        # the module's last assignment, since functions run after the module body defined them
        found = _last_assignment(ctx, ctx.module, None, name, unpacked=unpacked)
    return found


def parameter(fn: cst.FunctionDef, name: str) -> Optional[cst.Param]:
    """``fn``'s parameter called ``name`` (positional or keyword), if it has one."""
    params = fn.params
    return next((p for p in (*params.posonly_params, *params.params, *params.kwonly_params) if p.name.value == name),
                None)


def module_function(ctx, name: str) -> Optional[cst.FunctionDef]:
    """The function the file defines at module level under ``name``, if any."""
    return next((statement for statement in ctx.module.body
                 if isinstance(statement, cst.FunctionDef) and statement.name.value == name), None)


def _last_assignment(ctx, scope: cst.CSTNode, use: Optional[cst.CSTNode], name: str,
                     enclosing: frozenset = frozenset(), unpacked: bool = False) -> Optional[cst.BaseExpression]:
    positions, assigns = ctx.facts(FlowIndex).scope_order(scope)
    stop = positions.get(id(use), len(positions)) if use is not None else len(positions)
    for position, node in reversed(assigns):
        if position >= stop or node in enclosing:
            continue  # after the use; or ``model = model.to(device)`` read from its own right side
        if any(dotted_name(t.target) == name for t in node.targets):
            return node.value
        if unpacked:
            for t in reversed(node.targets):
                part = _unpacked_part(t.target, node.value, name)
                if part is not None:
                    return part
    return None


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


def decides_branch(expr: cst.BaseExpression, ctx) -> bool:
    """``expr``'s value is only the test of an ``if`` / ``while`` / conditional expression (through ``not``,
    ``and``, ``or``): Python reads it as one bool on the host, and it goes nowhere else."""
    current: cst.CSTNode = expr
    while True:
        parent = ctx.parent(current)
        if isinstance(parent, (cst.UnaryOperation, cst.BooleanOperation)) and \
                not isinstance(getattr(parent, "operator", None), (cst.Minus, cst.Plus, cst.BitInvert)):
            current = parent
            continue
        return isinstance(parent, (cst.If, cst.While, cst.IfExp)) and parent.test is current


# Small statements (``x = ...``, ``return ...``) and the nodes that can hold one: not expressions, since Python has no
# statement inside an expression, so a walk for statements need not enter them (most of a function's nodes).
_SMALL_STATEMENTS = frozenset(t for t in NODE_TYPES if issubclass(t, cst.BaseSmallStatement))
_STATEMENT_WALK = frozenset(t for t in NODE_TYPES if not issubclass(t, cst.BaseExpression))


def small_statements(scope: cst.CSTNode) -> Iterator[cst.BaseSmallStatement]:
    """Every small statement under ``scope`` (assignments, returns, ``pass``...), in source order, nested
    functions' included; what ``subtree`` would yield of them, without entering any expression."""
    wanted = _STATEMENT_WALK
    small = _SMALL_STATEMENTS
    stack: list[cst.CSTNode] = [scope]
    while stack:
        node = stack.pop()
        node_type = type(node)
        if node_type in small:
            yield node
            continue
        children = []  # code_children(node), less the expressions
        for field in CHILD_FIELDS[node_type]:
            value = getattr(node, field)
            value_type = type(value)
            if value_type in wanted:
                children.append(value)
            elif value_type is tuple or value_type is list:
                children.extend([v for v in value if type(v) in wanted])
        children.reverse()
        stack.extend(children)


class _AssignedValues:
    """Per scope, the values each plain name is assigned, listed by one walk of the scope (``ctx.facts``): a
    question asked for every name a ``return`` hands back was a walk of the whole function each time."""

    def __init__(self, ctx) -> None:
        self._scopes: dict[int, tuple[cst.CSTNode, dict[str, list[cst.BaseExpression]]]] = {}

    def of(self, scope: cst.CSTNode) -> dict[str, list[cst.BaseExpression]]:
        held = self._scopes.get(id(scope))
        if held is None:
            by_name: dict[str, list[cst.BaseExpression]] = {}
            for node in small_statements(scope):
                if type(node) is not cst.Assign:
                    continue
                for name in dict.fromkeys(t.target.value for t in node.targets if isinstance(t.target, cst.Name)):
                    by_name.setdefault(name, []).append(node.value)
            held = self._scopes[id(scope)] = (scope, by_name)  # the scope held: its id stays its own
        return held[1]


def assigned_values(ctx, scope: cst.CSTNode, name: str) -> list[cst.BaseExpression]:
    """Every value ``name`` is assigned in ``scope`` (all branches, in source order; ``a = b = v`` and plain
    targets only): where a name's value may come from, whatever path ran."""
    return list(ctx.facts(_AssignedValues).of(scope).get(name, ()))


def runs_when_true(branching: cst.CSTNode, node: cst.CSTNode, ctx) -> bool:
    """Whether ``node`` (inside the ``if`` / ``while`` ``branching``) runs when its test, read without a leading
    ``not``, holds: in the body of ``if x:`` or the ``else`` of ``if not x:``."""
    test = getattr(branching, "test", None)
    negated = isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
    orelse = getattr(branching, "orelse", None)
    in_else = orelse is not None and any(a is orelse for a in ctx.ancestors(node))
    return in_else == negated


def assigned_name(node: cst.Call, ctx: FileContext, chained: bool = False) -> Optional[str]:
    """``name`` in ``name = <node>`` (one target), else None; ``chained``: also through calls of methods on the
    result (``unet`` for the ``.to("cuda")`` of ``unet = UNet().to("cuda").half()``)."""
    top: cst.CSTNode = node
    while chained and isinstance(ctx.parent(top), cst.Attribute) and isinstance(ctx.parent(ctx.parent(top)), cst.Call):
        top = ctx.parent(ctx.parent(top))
    parent = ctx.parent(top)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        return dotted_name(parent.targets[0].target)
    return None


def computed_into(call: cst.Call, ctx: FileContext) -> Optional[str]:
    """``theta`` for ``theta = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))``: the name the value computed
    from the new tensor is assigned to, through methods and arithmetic."""
    node: cst.CSTNode = call
    while True:
        parent = ctx.parent(node)
        if isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation)) or (
                isinstance(parent, cst.Attribute) and isinstance(ctx.parent(parent), cst.Call)):
            node = parent if not isinstance(parent, cst.Attribute) else ctx.parent(parent)
            continue
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0].target,
                                                                                      cst.Name):
            return parent.targets[0].target.value
        return None


def targets(node: cst.CSTNode) -> list[str]:
    """The plain names an assignment or ``for`` target binds: ``a, (b, c)`` gives ``a, b, c``; ``a, *b`` gives ``a, b``."""
    names = []
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Name):
            names.append(current.value)
        elif isinstance(current, (cst.Tuple, cst.List)):
            stack.extend(reversed([e.value for e in current.elements]))
        elif isinstance(current, cst.StarredElement):
            stack.append(current.value)  # ``first, *rest = ...`` binds ``rest``
    return names


_HOST_NUMBER_BUILTINS = frozenset({"int", "float", "bool", "range"})


def read_only_as_host_scalar(ctx, scope: cst.CSTNode, name: str) -> bool:
    """Every read of ``name`` in ``scope`` is a slice bound (``x[:, a : a + n]``), through arithmetic, or the
    argument of ``int`` / ``float`` / ``bool`` / ``range``: Python takes a 0-dim tensor's value there, on the host,
    and no device ever reads the tensor. False when ``name`` is never read."""
    reads = reads_of(ctx, scope, name)
    for use in reads:
        parent = ctx.parent(use)
        while isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation)):
            use, parent = parent, ctx.parent(parent)
        if isinstance(parent, cst.Slice):
            continue
        grand = ctx.parent(parent) if isinstance(parent, cst.Arg) else None
        if isinstance(grand, cst.Call) and makes_python_number(grand, ctx):
            continue
        return False
    return bool(reads)


def reads_of(ctx, scope: cst.CSTNode, name: str) -> list[cst.Name]:
    """The reads of the local ``name`` in ``scope``: not its stores, parameters, or ``x.name`` attributes."""
    reads = []
    for node in subtree(scope):
        if not isinstance(node, cst.Name) or node.value != name:
            continue
        parent = ctx.parent(node)
        if isinstance(parent, (cst.AssignTarget, cst.Param)) or (
                isinstance(parent, (cst.AugAssign, cst.AnnAssign)) and parent.target is node) or (
                isinstance(parent, cst.Attribute) and parent.attr is node):
            continue
        reads.append(node)
    return reads


def makes_python_number(call: cst.Call, ctx) -> bool:
    """``int(...)`` / ``float(...)`` / ``bool(...)`` / ``range(...)`` of the builtins: a tensor argument is read
    once, on the host, into a Python number."""
    return isinstance(call.func, cst.Name) and call.func.value in _HOST_NUMBER_BUILTINS and \
        ctx.binding(call.func.value) is None


def _chosen_values(ctx, node: cst.CSTNode) -> dict[str, str]:
    """``{"args.weights": "'freeze'"}`` for a node under ``if args.weights == 'freeze':`` (the body, not the else):
    the literal each enclosing test's expression equals where ``node`` runs. Expressions a loop around ``node``
    rebinds (``for phase in ...: if phase == "train"``) change between iterations and are left out."""
    chosen: dict[str, str] = {}
    looped: set[str] = set()
    child = node
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, cst.For):
            looped |= {n.value for n in subtree(ancestor.target) if isinstance(n, cst.Name)}
        if isinstance(ancestor, cst.If) and child is ancestor.body:
            test = ancestor.test
            if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and \
                    isinstance(test.comparisons[0].operator, cst.Equal):
                left, right = test.left, test.comparisons[0].comparator
                if isinstance(left, (cst.SimpleString, cst.Integer)):
                    left, right = right, left
                if isinstance(right, (cst.SimpleString, cst.Integer)) and isinstance(left, (cst.Name, cst.Attribute)):
                    chosen.setdefault(ctx.module.code_for_node(left), right.value)
        child = ancestor
    return {key: value for key, value in chosen.items() if key.split(".", 1)[0] not in looped}


def exclusive_branches(ctx, first: cst.CSTNode, second: cst.CSTNode) -> bool:
    """``first`` and ``second`` never run in one pass of the program: they sit in different arms of one ``if`` /
    ``elif`` / ``else``, ``try`` / ``except`` or ``match`` (``in_different_arms``), or under tests of the same
    expression for different literals (``if args.weights == 'finetune': model.train()`` and ``if args.weights ==
    'freeze': model.requires_grad_(False)``)."""
    if in_different_arms(ctx, first, second):
        return True
    one, other = _chosen_values(ctx, first), _chosen_values(ctx, second)
    return any(key in other and other[key] != value for key, value in one.items())


def in_different_arms(ctx, first: cst.CSTNode, second: cst.CSTNode) -> bool:
    """``first`` and ``second`` sit in different arms of the innermost ``if`` / ``try`` / ``match`` holding both
    (an ``elif`` is an arm of the ``if`` it continues); a test is no arm: ``if flag:`` runs with either branch."""
    first_chain = [first, *ctx.ancestors(first)]
    around_second = {id(a) for a in ctx.ancestors(second)}
    for below, ancestor in zip(first_chain, first_chain[1:]):
        if id(ancestor) in around_second:
            if not isinstance(ancestor, (cst.If, cst.Try, cst.TryStar, cst.Match)):
                return False
            second_chain = [second, *ctx.ancestors(second)]
            other = second_chain[second_chain.index(ancestor) - 1]
            return other is not below and not (isinstance(ancestor, cst.If) and (ancestor.test is below or ancestor.test is other))
    return False


def enclosing_block(ctx, node: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The block of statements ``node`` is in: the innermost indented block, or the module."""
    return next((a for a in ctx.ancestors(node) if isinstance(a, (cst.IndentedBlock, cst.Module))), None)


def reaches_through_own_methods(cls: cst.ClassDef, fn: cst.FunctionDef, found, depth: int = 2) -> bool:
    """Some node of ``fn``'s body, or of a method of ``cls`` that it calls on ``self`` (``self.make_weight(...)``,
    ``depth`` calls deep), satisfies ``found``: what a method does includes what the helpers it delegates to do."""
    methods = {stmt.name.value: stmt for stmt in cls.body.body if isinstance(stmt, cst.FunctionDef)}
    seen: set[str] = set()
    frontier = [fn]
    for _ in range(depth + 1):
        following = []
        for method in frontier:
            for node in subtree(method.body):
                if found(node):
                    return True
                if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                        isinstance(node.func.value, cst.Name) and node.func.value.value == "self":
                    name = node.func.attr.value
                    if name in methods and name not in seen:
                        seen.add(name)
                        following.append(methods[name])
        frontier = following
    return False


def _list_scope(ctx, use: cst.CSTNode, name: str) -> Optional[cst.CSTNode]:
    """Where a list named ``name`` lives, seen from ``use``: the class for ``self.x`` (its methods share it),
    the enclosing function for a local name, the module for a global one."""
    nodes = ctx.facts(ModuleNodes)
    current = nodes.parents.get(id(use))
    function = None
    while current is not None:
        if isinstance(current, cst.ClassDef) and name.startswith("self."):
            return current
        if isinstance(current, cst.FunctionDef) and function is None:
            function = current
        current = nodes.parents.get(id(current))
    if name.startswith("self."):
        return None
    if function is not None and any(dotted_name(t.target) == name for node in subtree(function)
                                    if isinstance(node, cst.Assign) for t in node.targets):
        return function
    return ctx.module


def list_items(ctx, use: cst.CSTNode, name: str) -> Optional[list[cst.BaseExpression]]:
    """Every value the code puts into the list ``name`` (``x`` or ``self.x``) visible from ``use``: the elements
    of the list literals bound to it, and what ``.append(v)``, ``.insert(i, v)``, ``.extend([...])``,
    ``x[i] = v`` and ``x += [...]`` add. None when the list gets anything the code does not show item by item
    (a call's result, a comprehension, an ``extend`` of another list) or is never built here."""
    scope = _list_scope(ctx, use, name)
    if scope is None:
        return None
    items: list[cst.BaseExpression] = []
    built = False

    def literal(value: cst.BaseExpression) -> bool:
        if isinstance(value, (cst.List, cst.Tuple)) and \
                not any(isinstance(e, cst.StarredElement) for e in value.elements):
            items.extend(e.value for e in value.elements)
            return True
        return False

    for node in subtree(scope):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                if dotted_name(target.target) == name:
                    if not literal(node.value):
                        return None
                    built = True
                elif isinstance(target.target, cst.Subscript) and dotted_name(target.target.value) == name:
                    items.append(node.value)
        elif isinstance(node, cst.AugAssign) and dotted_name(node.target) == name:
            if not literal(node.value):
                return None
        elif isinstance(node, (cst.AnnAssign, cst.NamedExpr)) and dotted_name(node.target) == name:
            return None
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                dotted_name(node.func.value) == name:
            method = node.func.attr.value
            if method == "append" and len(node.args) == 1:
                items.append(node.args[0].value)
            elif method == "insert" and len(node.args) == 2:
                items.append(node.args[1].value)
            elif method == "extend" and (len(node.args) != 1 or not literal(node.args[0].value)):
                return None
    return items if built and items else None


def item_values(ctx, expr: cst.BaseExpression) -> Optional[list[cst.BaseExpression]]:
    """What an item read from a list may be: ``xs[i]``, or a loop variable of ``for x in xs`` /
    ``for i, x in enumerate(xs)``, is one of the values the code puts into ``xs`` (:func:`list_items`).
    None when the expression is no such read or the list's items are not all known."""
    if isinstance(expr, cst.Subscript):
        name = dotted_name(expr.value)
        return list_items(ctx, expr, name) if name else None
    if not isinstance(expr, cst.Name):
        return None
    # the innermost ``for`` around the read whose target binds the name (during the walk or after it)
    parents = ctx.facts(ModuleNodes).parents
    loop = parents.get(id(expr))
    while loop is not None and not (isinstance(loop, cst.For) and expr.value in targets(loop.target)):
        if isinstance(loop, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        loop = parents.get(id(loop))
    if loop is None or ctx.inside(expr, loop.iter):
        return None
    source, target = loop.iter, loop.target
    if isinstance(source, cst.Call) and isinstance(source.func, cst.Name) and source.func.value == "enumerate" and \
            ctx.binding("enumerate", expr) is None and len(source.args) == 1:
        if not (isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2):
            return None
        source, target = source.args[0].value, target.elements[1].value
    if not (isinstance(target, cst.Name) and target.value == expr.value):
        return None
    name = dotted_name(source)
    return list_items(ctx, loop, name) if name else None


# ---- what a value is computed from, and what a return hands back ------------------------------------------

def names_computed_from(expr: cst.CSTNode, ctx: FileContext, depth: int = 3) -> set:
    """Dotted names ``expr``'s value is computed from, following the names' assignments ``depth`` levels back
    (``loss = ce + aux_weight * aux; aux = torch.stack(aux_losses).mean()`` uses ``aux_losses``)."""
    names = set(iter_names(expr))
    frontier = set(names)
    for _ in range(depth):
        found = set()
        for name in frontier:
            value = ctx.assigned_value(name)
            if isinstance(value, cst.AugAssign):
                value = value.value
            if value is not None:
                found.update(iter_names(value))
        frontier = found - names
        names |= found
        if not frontier:
            break
    return names


def returned_names(expr: cst.BaseExpression, ctx: FileContext) -> set[str]:
    """Names whose tensor value ``return expr`` hands back as is (``total``, ``total / n``, ``sum(losses)``, an
    element of a returned tuple or dict), following their assignments in the function."""
    out: set[str] = set()
    _returned_into(expr, ctx, out, 0)
    return out


def _returned_into(expr: cst.BaseExpression, ctx: FileContext, out: set, depth: int) -> None:
    """Names whose tensor value a ``return`` hands back as is (``total``, ``total / n``, ``sum(losses)``)."""
    if depth > 8:
        return
    if isinstance(expr, cst.IfExp):
        _returned_into(expr.body, ctx, out, depth + 1)
        _returned_into(expr.orelse, ctx, out, depth + 1)
    elif isinstance(expr, (cst.Name, cst.Attribute)):
        name = dotted_name(expr)
        if name is None or name in out:
            return
        out.add(name)
        values = [ctx.assigned_value(name)]
        if isinstance(expr, cst.Name) and ctx.function_def is not None:
            # every assignment of the name in the function, whichever branch ran last
            # (``outputs = (sum(aux_losses),) + outputs`` in one branch, ``(loss,) + outputs`` in the other)
            values += [v for v in assigned_values(ctx, ctx.function_def, name) if v is not values[0]]
        for value in values:
            if isinstance(value, cst.AugAssign):
                value = value.value  # ``loss += att_loss + rep_loss``: the terms added are returned too
            if value is not None and value is not expr:
                _returned_into(value, ctx, out, depth + 1)
    elif isinstance(expr, cst.Subscript):
        _returned_into(expr.value, ctx, out, depth + 1)
    elif isinstance(expr, (cst.Tuple, cst.List)):
        for element in expr.elements:
            _returned_into(element.value, ctx, out, depth + 1)
    elif isinstance(expr, cst.Dict):
        for element in expr.elements:
            if isinstance(element, cst.DictElement):
                _returned_into(element.value, ctx, out, depth + 1)
    elif isinstance(expr, cst.BinaryOperation):
        _returned_into(expr.left, ctx, out, depth + 1)
        _returned_into(expr.right, ctx, out, depth + 1)
    elif isinstance(expr, cst.Call):
        name = method_name(expr)
        receiver = call_receiver(expr)
        if receiver is not None and name in ("mean", "sum", "float"):
            _returned_into(receiver, ctx, out, depth + 1)
        elif name in ("sum", "stack", "cat", "mean"):
            for arg in expr.args:
                _returned_into(arg.value, ctx, out, depth + 1)


def logging_call_consuming(node: cst.CSTNode, ctx: FileContext) -> Optional[tuple[str, cst.Call]]:
    """The call that writes ``node``'s value out within its statement (``print(f"{loss.item()}")``,
    ``bar.set_postfix(loss=loss.item())``), with its name as written; None when the value is compared, chosen
    on, or computed with first (``math.log(loss.item())``)."""
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, cst.Call):
            name = method_name(ancestor)
            if name in LOG_SINKS:
                if not is_logging_call(name, ctx.qualified_name(ancestor.func)):
                    return None
                return dotted_name(ancestor.func) or name, ancestor
        elif isinstance(ancestor, (cst.Comparison, cst.BooleanOperation, cst.IfExp, cst.BaseSmallStatement,
                                   cst.BaseCompoundStatement)):
            return None
    return None

