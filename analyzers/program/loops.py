"""Facts about loops: which loops enclose a node, which loops train, and gradient-accumulation steps."""
from __future__ import annotations

import ast
from typing import Callable, Iterator, Optional

import libcst as cst

from analyzers.context import FileContext, code_children, dotted_name
from analyzers.program.library import is_data_loader, iterates_its_argument
from analyzers.program.ranks import is_rank_test
from analyzers.program.values import is_backward, is_optimizer_step

LoopStack = tuple  # tuple of cst.For | cst.While, outermost first


def loop_stack(ctx: FileContext) -> LoopStack:
    """The ``for``/``while`` loops of the current function whose body encloses the current node (during the walk)."""
    fn = ctx.function
    return tuple(lp for lp in ctx.loops
                 if (type(lp) is cst.For or type(lp) is cst.While) and ctx.loop_function.get(lp) is fn)


def body_nodes(scope: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Nodes under ``scope`` without entering nested functions, lambdas or classes."""
    stack = [scope]
    while stack:
        node = stack.pop()
        yield node
        for child in code_children(node):
            if not isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                stack.append(child)


class _TrainingLoops:
    def __init__(self, ctx: FileContext) -> None:
        self.answers: dict[int, bool] = {}


def loop_trains(loop: cst.CSTNode, ctx: Optional[FileContext] = None) -> bool:
    """The loop's body calls ``.backward()`` somewhere (its own statements, not nested functions).
    With ``ctx``, answers are kept for the file, so each loop is looked at once."""
    cache = ctx.facts(_TrainingLoops).answers if ctx is not None else {}
    found = cache.get(id(loop))
    if found is None:
        found = cache[id(loop)] = any(isinstance(node, cst.Call) and is_backward(node) for node in body_nodes(loop))
    return found


def batch_of_training_loop(expr: cst.BaseExpression, ctx: FileContext, at: Optional[cst.CSTNode] = None) -> bool:
    """``expr`` is an item of what a training loop iterates (``x`` in ``for x, y in loader: ... backward()``): a
    batch of data, not the model being trained. Only a plain name bound by the target of the innermost ``for``
    around it, in the same function, whose body calls backward and never calls the name itself (``for net in
    nets: net(x).sum().backward()`` iterates models). ``at``: the node that uses ``expr`` (during the walk, the
    nodes under the one being visited have no parent yet)."""
    if not isinstance(expr, cst.Name):
        return False
    loop = next((a for a in ctx.ancestors(at or expr) if isinstance(a, (cst.For, cst.FunctionDef, cst.ClassDef,
                                                                    cst.Lambda))), None)
    if not isinstance(loop, cst.For) or expr.value not in _target_names(loop.target):
        return False
    return loop_trains(loop, ctx) and not any(
        isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == expr.value
        for node in body_nodes(loop.body))


def _target_names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(_target_names(element.value) for element in target.elements))
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return set()


def iterated(iterable: cst.BaseExpression) -> cst.BaseExpression:
    """What a ``for`` really iterates: ``loader`` for ``enumerate(tqdm(loader))``."""
    while isinstance(iterable, cst.Call) and iterable.args and iterates_its_argument(dotted_name(iterable.func)):
        iterable = iterable.args[0].value
    return iterable


def accumulation_divisor(test: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """``N`` for an ``if (i + 1) % N == 0`` / ``if step % N == 0`` test with a non-literal ``N``."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    comparison = test.comparisons[0]
    if not isinstance(comparison.operator, cst.Equal):
        return None
    left, right = test.left, comparison.comparator
    for a, b in ((left, right), (right, left)):
        if isinstance(a, cst.BinaryOperation) and isinstance(a.operator, cst.Modulo):
            if isinstance(b, cst.Integer) and b.value == "0" and isinstance(a.right, (cst.Name, cst.Attribute)):
                return a.right
    return None


def counted_divisor(test: cst.BaseExpression, loop: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """``N`` for a test that reaches a count of passes by a counter the loop advances: ``if n == accum_steps``,
    ``if self.micro >= self.grad_accum`` (after ``n += 1`` in the loop). The count is a name, not a counter
    itself; ``<`` / ``!=`` tests pick the passes before the count, not the one that reaches it."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1 or not counts_passes(test, loop):
        return None
    comparison = test.comparisons[0]
    counters = _counted_names(loop)
    left, right = test.left, comparison.comparator
    if isinstance(comparison.operator, (cst.Equal, cst.GreaterThanEqual, cst.GreaterThan)) and \
            dotted_name(left) in counters:
        counted, count = left, right
    elif isinstance(comparison.operator, (cst.Equal, cst.LessThanEqual, cst.LessThan)) and \
            dotted_name(right) in counters:
        counted, count = right, left
    else:
        return None
    if not isinstance(count, (cst.Name, cst.Attribute)) or dotted_name(count) in counters:
        return None
    return count if isinstance(counted, (cst.Name, cst.Attribute)) else None


_ACCUM_WORDS = ("accum", "grad_steps", "update_freq", "iters_to_accumulate", "accumulate")


class AccumulationStep:
    """One ``if (i + 1) % N == 0: optimizer.step()`` inside a loop whose body runs ``backward()`` on every pass."""

    def __init__(self, node: cst.If, divisor: cst.BaseExpression, loop: cst.CSTNode, function) -> None:
        self.node = node
        self.divisor = divisor
        self.loop = loop
        self.function = function


class AccumulationFacts:
    """Gradient-accumulation steps in a file. Filled by :meth:`note_if` from each rule that asks, during the walk;
    each ``if`` is looked at once, so what a rule sees does not depend on which other rules run."""

    def __init__(self, ctx: FileContext) -> None:
        self.steps: list[AccumulationStep] = []
        self._seen: set[int] = set()

    def note_if(self, node: cst.If, ctx: FileContext) -> None:
        if id(node) in self._seen:
            return
        self._seen.add(id(node))
        stack = loop_stack(ctx)
        if not stack:
            return
        divisor = accumulation_divisor(node.test) or counted_divisor(node.test, stack[-1])
        if divisor is None:
            return
        word = (dotted_name(divisor) or "").rsplit(".", 1)[-1].lower()
        if not any(w in word for w in _ACCUM_WORDS):
            return
        steps = [n for n in body_nodes(node.body) if isinstance(n, cst.Call) and is_optimizer_step(n, ctx)]
        if not steps:
            return
        # backward runs on every pass: in the loop, outside this ``if``
        loop = stack[-1]
        inside = {id(n) for n in body_nodes(node)}
        if not any(isinstance(n, cst.Call) and is_backward(n) and id(n) not in inside for n in body_nodes(loop)):
            return
        self.steps.append(AccumulationStep(node, divisor, loop, ctx.function))


def steps_each_iteration(loop: cst.CSTNode, ctx: FileContext) -> bool:
    """One pass of ``loop`` is one optimizer step: its own body (not a loop nested in it) calls ``opt.step()``.
    A value rebuilt in each pass lives for one step (``losses = []`` per batch, gathered over its chunks)."""
    return _own_body_calls(loop, lambda call: is_optimizer_step(call, ctx))


def _own_body_calls(loop: cst.CSTNode, wanted: Callable[[cst.Call], bool]) -> bool:
    """A call of ``loop``'s own body (not of a loop, function or class nested in it) is ``wanted``."""
    stack = list(code_children(loop.body)) if hasattr(loop, "body") else []
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Call) and wanted(node):
            return True
        if isinstance(node, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        stack.extend(code_children(node))
    return False


def one_pass_is_a_batch(loop: cst.CSTNode, ctx: FileContext) -> bool:
    """One pass of ``loop`` handles one batch: its own body (not a loop nested in it) calls ``.backward()`` or an
    optimizer step or takes ``next()`` of an iterator, or it iterates a ``DataLoader`` the file builds (``for x, y
    in loader``, also through ``enumerate`` / ``tqdm``). An epoch loop, whose batches are handled by the functions
    it calls or by a loop nested in it, is not one; neither is a loop over something the program cannot name."""
    if _own_body_calls(loop, lambda call: is_backward(call) or is_optimizer_step(call, ctx) or
                       (isinstance(call.func, cst.Name) and call.func.value == "next")):
        return True
    if not isinstance(loop, cst.For):
        return False
    source = iterated(loop.iter)
    if isinstance(source, cst.Name):
        binding = ctx.binding(source.value)
        source = binding.value if binding is not None and binding.kind in ("assign", "annassign") else None
    return isinstance(source, cst.Call) and is_data_loader(ctx.call_name(source))


def training_step_loop(stack: LoopStack, ctx: FileContext) -> Optional[cst.CSTNode]:
    """The loop whose one pass is the training step a node runs in: the outermost loop around it (``stack``,
    outermost first) that handles one batch a pass. A few generator updates in ``for _ in range(k)`` nested in a
    batch loop are part of that batch's step, and what they build (a generated sample) can be backpropagated
    again by the step's other losses. None when no loop around the node handles a batch."""
    return next((loop for loop in stack if one_pass_is_a_batch(loop, ctx)), None)


def guard_between(node: cst.CSTNode, loop: cst.CSTNode, ctx: FileContext, *, except_handlers: bool = False) -> bool:
    """An ``if`` (other than a rank check) or, optionally, an ``except`` between ``node`` and ``loop``: ``node``
    does not run on every pass. An ``if``'s own test always runs: it guards only its branches."""
    below = node
    for ancestor in ctx.ancestors(node):
        if ancestor is loop:
            return False
        if isinstance(ancestor, cst.If) and below is not ancestor.test and not is_rank_test(ancestor.test, ctx):
            return True
        if isinstance(ancestor, cst.IfExp) and below is not ancestor.test:
            return True
        if except_handlers and isinstance(ancestor, (cst.ExceptHandler, cst.ExceptStarHandler)):
            return True
        below = ancestor
    return False


def in_inner_loop(node: cst.CSTNode, loop: cst.CSTNode, ctx: FileContext) -> bool:
    """Another loop between ``node`` and ``loop``: ``node`` runs many times per pass of ``loop``, or none."""
    for ancestor in ctx.ancestors(node):
        if ancestor is loop:
            return False
        if isinstance(ancestor, (cst.For, cst.While)):
            return True
    return False


def enclosing_function_name(ctx: FileContext) -> Optional[str]:
    fn = ctx.function_def
    return fn.name.value if fn is not None else None


def functions_that(tree: ast.Module, does: Callable[[ast.AST], bool]) -> set[str]:
    """The top-level functions of a parsed file for which ``does(function)`` holds, or that call (by name) another
    function of the file that does, transitively: what the repository's summaries say a file's functions do."""
    functions = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    direct = {name for name, fn in functions.items() if does(fn)}
    calls = {name: {node.func.id for node in ast.walk(fn) if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name) and node.func.id in functions}
             for name, fn in functions.items()}
    return closure(direct, calls)


def closure(direct: set, calls: dict) -> set:
    """Functions (by name) that do something directly or call one that does, transitively."""
    result = set(direct)
    changed = True
    while changed:
        changed = False
        for fn, called in calls.items():
            if fn not in result and called & result:
                result.add(fn)
                changed = True
    return result


def _counted_names(loop: cst.CSTNode) -> set[str]:
    """Dotted names ``loop``'s body counts with (``n += 1``, ``left -= 1``): what a test that counts passes
    compares. The pass index itself is not one: ``if k >= warmup`` picks the passes from some point on, not
    every few."""
    names = {dotted_name(node.target) for node in body_nodes(loop.body)
             if isinstance(node, cst.AugAssign) and isinstance(node.operator, (cst.AddAssign, cst.SubtractAssign))}
    return {name for name in names if name}


def counts_passes(test: cst.BaseExpression, loop: cst.CSTNode) -> bool:
    """``test`` holds on some passes of ``loop`` by counting them: a remainder (``(i + 1) % accum == 0``,
    ``step % n``) or a comparison of a counter the loop advances (``if left > 1``, after ``left -= 1`` in the
    loop). A test on what a pass computed (``torch.isfinite(loss)``, ``norm < limit``) does
    not count passes."""
    counters = _counted_names(loop)
    for node in body_nodes(test):
        if isinstance(node, cst.Comparison) and any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn))
                                                    for c in node.comparisons):
            continue
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
            return True
        if isinstance(node, cst.Comparison):
            operands = [node.left, *(c.comparator for c in node.comparisons)]
            if any(dotted_name(o) in counters for o in operands if isinstance(o, (cst.Name, cst.Attribute))):
                return True
    return False


def _ends_in_continue(block: cst.BaseSuite) -> bool:
    body = block.body
    last = body[-1] if body else None
    if isinstance(last, cst.SimpleStatementLine):
        return bool(last.body) and isinstance(last.body[-1], cst.Continue)
    return False


def counted_guard(node: cst.CSTNode, loop: cst.CSTNode, ctx: FileContext) -> Optional[cst.If]:
    """The ``if`` that lets ``node`` (in ``loop``'s own body, not in a loop nested in it) run only on the passes a
    count picks: an ``if`` around it whose test :func:`counts_passes` (``if (i + 1) % accum == 0: opt.step()``),
    or an ``if`` before it in the loop's body whose branch ends in ``continue`` (``if left > 1: left -= 1;
    continue`` then ``opt.step()``). None when ``node`` runs on every pass or on passes something else picks."""
    below, holder = node, node
    for ancestor in ctx.ancestors(node):
        if ancestor is loop.body:
            break
        if isinstance(ancestor, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if isinstance(ancestor, cst.If) and below is not ancestor.test:
            return ancestor if counts_passes(ancestor.test, loop) else None
        below = holder = ancestor
    else:
        return None
    # ``holder`` is the statement of the loop's body that holds ``node``: an ``if`` before it that skips the rest
    statements = list(loop.body.body) if isinstance(loop.body, cst.IndentedBlock) else []
    for statement in statements:
        if statement is holder:
            break
        if (isinstance(statement, cst.If) and statement.orelse is None and _ends_in_continue(statement.body)
                and counts_passes(statement.test, loop)):
            return statement
    return None
