"""Which code runs on every process of a distributed job and which only on some: the one answer to "is this a
rank guard" and "does this value depend on the rank".

A value depends on the rank when the program gets it from where ranks come from, not when its text holds a word:

- a library call or attribute that returns the process's rank or whether it is the main one
  (:data:`analyzers.program.library.RANK_SOURCES`: ``dist.get_rank()``, ``accelerator.is_main_process``,
  ``trainer.is_global_zero``, ``os.environ["LOCAL_RANK"]``...);
- a name the program itself uses as the process index: what it passes as ``DistributedDataParallel``'s
  ``device_ids``, to ``torch.cuda.set_device``, as ``init_process_group``'s ``rank``, or the first parameter of
  the function ``torch.multiprocessing.spawn`` starts (spawn passes the process index there);
- a name assigned from such a value (``master_process = ddp_rank == 0``), or a function of this file that
  returns one (``def is_main_process(): return get_rank() == 0``);
- where nothing in the file says where a value comes from (a parameter, ``args.local_rank``, a helper imported
  from the project), an identifier spelled as the launchers and libraries spell ranks (``rank``,
  ``local_rank``, ``is_main_process``): the convention ``torch.distributed.launch`` and the libraries set.

A rank guard is a test (``if``, ``while``, conditional expression) that reads such a value.
"""
from __future__ import annotations

import ast
from typing import Iterator, Optional

import libcst as cst

from analyzers.context import (NODE_TYPES, FileContext, all_children, argument, code_children, dotted_name,
                               string_value)
from analyzers.program.devices import expression_nodes
from analyzers.program.flow import module_function, small_statements
from analyzers.program.library import (DISTRIBUTED_PACKAGES, RANK_ATTRIBUTES, RANK_ENVIRONMENT, RANK_PREDICATE_NAMES,
                                       Does, does, is_ddp, is_library)
from analyzers.program.names import name_words

_MAX_DEPTH = 4


def _spelled_as_rank(identifier: str) -> bool:
    """``rank``, ``local_rank``, ``ddp_rank``, ``is_rank_zero``, ``is_main_process``: how launchers and libraries
    name the rank. Used only where the program does not say where a value comes from."""
    return "rank" in name_words(identifier) or identifier in RANK_PREDICATE_NAMES


class _RankNames:
    """The names a file uses as the process index and its functions that return a rank value (built once)."""

    def __init__(self, ctx: FileContext) -> None:
        self.names: set[str] = set()
        self.functions: dict[str, cst.FunctionDef] = {}
        spawned: set[str] = set()
        stack: list[cst.CSTNode] = [ctx.module]  # code nodes only: whitespace is most of a file's nodes
        while stack:
            node = stack.pop()
            node_type = type(node)
            if node_type is cst.FunctionDef:
                self.functions.setdefault(node.name.value, node)
            elif node_type is cst.Call:
                self._note_call(node, ctx, spawned)
            children = code_children(node)
            children.reverse()  # source order: the first function of a name is the one kept
            stack.extend(children)
        for name in spawned:
            fn = self.functions.get(name)
            if fn is not None and fn.params.params:
                self.names.add(fn.params.params[0].name.value)
        self.returning: dict[str, bool] = {}

    def _note_call(self, call: cst.Call, ctx: FileContext, spawned: set[str]) -> None:
        qualified = ctx.call_name(call)
        if qualified is None:
            return
        if is_ddp(qualified):
            ids = argument(call, 1, "device_ids")
            if isinstance(ids, (cst.List, cst.Tuple)) and len(ids.elements) == 1:
                self._add(ids.elements[0].value)
        elif does(qualified, Does.SELECTS_PROCESS_DEVICE):
            self._add(argument(call, 0, "device"))
        elif does(qualified, Does.JOINS_PROCESS_GROUP):
            self._add(argument(call, 99, "rank"))
        elif does(qualified, Does.SPAWNS_PROCESSES):
            target = argument(call, 0, "fn")
            if isinstance(target, cst.Name):
                spawned.add(target.value)

    def _add(self, expr: Optional[cst.BaseExpression]) -> None:
        name = dotted_name(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
        if name is not None:
            self.names.add(name)


def _rank_names(ctx: FileContext) -> _RankNames:
    return ctx.facts(_RankNames)


def _returns_rank(fn: cst.FunctionDef, ctx: FileContext, depth: int) -> bool:
    known = _rank_names(ctx).returning
    name = fn.name.value
    if name not in known:
        known[name] = False  # recursion ends here
        known[name] = any(isinstance(node, cst.Return) and node.value is not None
                          and depends_on_rank(node.value, ctx, depth + 1)
                          for node in small_statements(fn.body))
    return known[name]


def _is_rank_source(expr: cst.BaseExpression, ctx: FileContext, depth: int) -> bool:
    """``expr`` itself (not a part of it) is a rank value."""
    if isinstance(expr, cst.Call):
        qualified = ctx.call_name(expr)
        if does(qualified, Does.RETURNS_RANK):
            return True
        if qualified in ("os.environ.get", "os.getenv"):
            return string_value(argument(expr, 0, "key")) in RANK_ENVIRONMENT
        fn = _rank_names(ctx).functions.get(expr.func.value) if isinstance(expr.func, cst.Name) else None
        if fn is not None:
            return _returns_rank(fn, ctx, depth)
        if qualified is None or not is_library(qualified):
            # a helper this file does not define (``utils.is_main_process()``): its name is all there is
            callee = dotted_name(expr.func)
            return callee is not None and _spelled_as_rank(callee.rsplit(".", 1)[-1])
        return False
    if isinstance(expr, cst.Subscript):
        if ctx.qualified_name(expr.value) == "os.environ" and len(expr.slice) == 1 and \
                isinstance(expr.slice[0].slice, cst.Index):
            return string_value(expr.slice[0].slice.value) in RANK_ENVIRONMENT
        return False
    if not isinstance(expr, (cst.Name, cst.Attribute)):
        return False
    name = dotted_name(expr)
    if name is None:
        return False
    facts = _rank_names(ctx)
    if name in facts.names:
        return True
    binding = ctx.binding(name, expr)
    if binding is not None and binding.kind in ("assign", "annassign", "walrus", "augassign") \
            and binding.value is not None and binding.value is not expr:
        if depends_on_rank(binding.value, ctx, depth + 1):
            return True
        if binding.kind != "augassign" and not _spelled_as_rank(name.rsplit(".", 1)[-1]):
            return False  # the program says where the value comes from, and it is not a rank
    last = name.rsplit(".", 1)[-1]
    if isinstance(expr, cst.Attribute) and last in RANK_ATTRIBUTES:
        return True
    return _spelled_as_rank(last)


# calls whose result is computed from their arguments' values alone (a rank in, a rank-dependent value out);
# any other call (``model(x)``, ``DDP(net, device_ids=[rank])``) makes something new of its arguments
_VALUE_CALLS = frozenset({"int", "str", "float", "bool", "abs", "min", "max", "format", "os.path.join",
                          "pathlib.Path", "os.path.expanduser"})
_VALUE_METHODS = frozenset({"format", "join", "replace", "item", "lower", "upper"})


def _parts(expr: cst.BaseExpression, ctx: FileContext) -> Iterator[cst.BaseExpression]:
    """The sub-expressions a value is computed from: through operators, comparisons, f-strings, containers,
    subscripts and value conversions (``int(...)``, ``os.path.join``, ``"{}".format``); not into the arguments of
    other calls, lambdas or comprehensions."""
    stack: list[cst.CSTNode] = [expr]
    while stack:
        node = stack.pop()
        node_type = type(node)
        if node_type in _EXPRESSIONS:
            yield node
        if node_type in _NOT_ENTERED:
            continue
        if node_type is cst.Call:
            method = node.func.attr.value if isinstance(node.func, cst.Attribute) else None
            if method in _VALUE_METHODS or (ctx.call_name(node) or dotted_name(node.func)) in _VALUE_CALLS:
                stack.extend(reversed([a.value for a in node.args]))
                if method in _VALUE_METHODS:
                    stack.append(node.func.value)
            continue
        stack.extend(reversed(all_children(node)))


_EXPRESSIONS = frozenset(t for t in NODE_TYPES if issubclass(t, cst.BaseExpression))  # isinstance, by set
_NOT_ENTERED = frozenset(t for t in NODE_TYPES if issubclass(t, (cst.Name, cst.Attribute, cst.Lambda, cst.ListComp,
                                                                  cst.SetComp, cst.DictComp, cst.GeneratorExp)))


def depends_on_rank(expr: Optional[cst.BaseExpression], ctx: FileContext, depth: int = 0) -> bool:
    """Whether ``expr``'s value depends on which process computes it (``rank == 0``, ``f"ckpt_{rank}.pt"``,
    ``is_main_process()``, ``not accelerator.is_local_main_process``)."""
    if expr is None or depth > _MAX_DEPTH:
        return False
    for part in _parts(expr, ctx):
        if _is_rank_source(part, ctx, depth):
            return True
    return False


def is_rank_test(test: cst.BaseExpression, ctx: FileContext) -> bool:
    """A condition that holds on some processes and not others: it reads the rank."""
    return depends_on_rank(test, ctx)


def rank_guarded(node: cst.CSTNode, ctx: FileContext) -> bool:
    """Whether ``node`` runs only on some processes: under a test of the rank, or in a function a library
    decorator runs on rank zero only (Lightning's ``rank_zero_only``)."""
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, (cst.If, cst.IfExp, cst.While)) and is_rank_test(ancestor.test, ctx):
            return True
        if isinstance(ancestor, cst.FunctionDef):
            return any(does(ctx.qualified_name(d.decorator.func if isinstance(d.decorator, cst.Call)
                                               else d.decorator), Does.RUNS_ON_RANK_ZERO)
                       for d in ancestor.decorators)
    return False


def returns_off_rank(node: cst.If, ctx: FileContext) -> bool:
    """``if <rank test>: return``: the rest of the function runs on some processes only."""
    # the shape first: the rank question follows the test's names through the file, and few ``if``s return
    return isinstance(node.body, cst.IndentedBlock) and any(
        isinstance(s, cst.SimpleStatementLine) and any(isinstance(small, cst.Return) for small in s.body)
        for s in node.body.body) and is_rank_test(node.test, ctx)


def in_single_process_test(node: cst.CSTNode, ctx: FileContext) -> bool:
    """``node`` runs in a test that a test runner collects (a ``test*`` function of a file that collects tests)
    and that does no distributed work: neither it nor a function of this file it calls names a package that
    coordinates processes (``library.DISTRIBUTED_PACKAGES``) or wraps a model in DDP. The runner runs it in one
    process, whatever the rest of the file sets up for its distributed tests."""
    from analyzers.program.roles import collects_tests

    if not collects_tests(ctx):
        return False
    test = None
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, cst.FunctionDef) and ancestor.name.value.startswith("test"):
            test = ancestor  # the outermost: a helper defined inside a test runs in it
    return test is not None and not _does_distributed_work(test, ctx, depth=1)


def _does_distributed_work(fn: cst.FunctionDef, ctx: FileContext, depth: int) -> bool:
    for node in [*fn.decorators, fn.params, fn.body]:
        for inner in expression_nodes(node):
            if isinstance(inner, (cst.Name, cst.Attribute)):
                qualified = ctx.qualified_name(inner) or ""
                if is_ddp(qualified) or any(qualified == package or qualified.startswith(package + ".")
                                            for package in DISTRIBUTED_PACKAGES):
                    return True
            if depth and isinstance(inner, cst.Call) and isinstance(inner.func, cst.Name):
                called = module_function(ctx, inner.func.value)
                if called is not None and called is not fn and _does_distributed_work(called, ctx, depth - 1):
                    return True
    return False



# ---- print kept to one process ------------------------------------------------------------------------------------
# Distributed launch helpers (``init_distributed_mode`` of DeiT, DETR, MAE...) replace the built-in ``print`` by one
# that prints on the main process only. What counts is that the program replaces it, whatever the helper is called.

_BUILTINS_MODULES = frozenset({"builtins", "__builtin__"})


def _builtins_aliases(tree: ast.Module) -> set[str]:
    """The names a parsed file binds the built-ins module to (``import builtins as __builtin__``), anywhere in it."""
    return {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
            for alias in node.names if alias.name in _BUILTINS_MODULES}


def _replaces_print(nodes: Iterator[ast.AST], aliases: set[str]) -> bool:
    """Does any of ``nodes`` assign the built-in ``print``: ``builtins.print = f``, ``setattr(builtins, "print", f)``?"""
    def is_builtins(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id in aliases

    for node in nodes:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "print"
                                                and is_builtins(t.value) for t in node.targets):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and \
                len(node.args) >= 2 and is_builtins(node.args[0]) and \
                isinstance(node.args[1], ast.Constant) and node.args[1].value == "print":
            return True
    return False


def print_replacing_functions(tree: ast.Module) -> set[str]:
    """The top-level functions of a parsed file that replace the built-in ``print``, or call another function of the
    file that does (for :mod:`analyzers.program.modules`' summaries of the repository's files)."""
    aliases = _builtins_aliases(tree)
    if not aliases:
        return set()
    from analyzers.program.loops import functions_that  # loops asks this module about rank guards
    return functions_that(tree, lambda fn: _replaces_print(ast.walk(fn), aliases))


def print_kept_to_one_process(ctx: FileContext) -> bool:
    """Does the program replace the built-in ``print`` (the way launch helpers keep it to the main process): at the
    file's top level, or through a function it calls, its own or one it imports from the repository? Then a bare
    ``print(...)`` prints on one process, not on every rank."""
    tree = ctx.python_tree
    if tree is None:
        return False
    aliases = _builtins_aliases(tree)
    top_level = [node for statement in tree.body if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                                ast.ClassDef))
                 for node in ast.walk(statement)]
    if aliases and _replaces_print(iter(top_level), aliases):
        return True
    from analyzers.program.modules import calls_marked_function  # modules summarizes files with this module
    return calls_marked_function(ctx, lambda summary: summary.print_replacing_functions,
                                 own=print_replacing_functions(tree))
