"""Where a value comes from, when it comes from outside the program.

A path, a name or a URL is chosen by whoever runs the program when it is built from the command line, the
environment, a configuration file, what the user types, or a download. That decides how much a rule may trust
what the value points at (TR601: a checkpoint whose path the command line gives may be anybody's file).

The answer follows the value, never its spelling: through assignments (``ckpt = args.resume``), attributes and
items of a parsed namespace or configuration (``cfg["model"]["weights"]``, ``self.opt.resume``), expressions that
build a path from parts (``os.path.join(args.out, "best.pt")``, f-strings, ``%``, ``+``), calls given such a part,
a function's parameters (what every call of the function in the file passes; what Hydra or click fill in), up to
the library APIs that read the outside (the table in :mod:`analyzers.program.library`: ``sys.argv``,
``os.environ``, ``parse_args()``, ``yaml.safe_load``, ``hf_hub_download`` ...) and literal URLs. A name alone
proves nothing: ``args`` nobody is seen to parse is not the command line.
"""
from __future__ import annotations

import enum
from typing import Optional

import libcst as cst

from analyzers.context import dotted_name
from analyzers.program.flow import (ModuleNodes, assignment_before, attribute_values, call_site_values, module_function,
                                    parameter)
from analyzers.program.graphs import FunctionShapes
from analyzers.program.library import Does, does, method_does

# how many steps (assignments, parameters, parts) a value is followed back before the answer is "not known"
MAX_STEPS = 12
# builtins that hand back what they are given, as text (and input(), which reads it)
_BUILTINS = ("str", "input")
_URL_SCHEMES = ("http://", "https://", "ftp://", "s3://", "gs://", "hf://")


class Outside(enum.Enum):
    """Where from outside the program a value comes."""

    COMMAND_LINE = "the command line"
    ENVIRONMENT = "the environment"
    CONFIGURATION = "a configuration file"
    USER_INPUT = "what the user types"
    DOWNLOAD = "a download"
    # not known to come from outside, but not known not to: a parameter that no call in view passes (a library
    # function's, a class built in another file), so whatever its callers give
    CALLER = "whatever its callers pass"


_BY_DOES = ((Does.READS_COMMAND_LINE, Outside.COMMAND_LINE), (Does.READS_ENVIRONMENT, Outside.ENVIRONMENT),
            (Does.READS_CONFIGURATION, Outside.CONFIGURATION), (Does.READS_USER_INPUT, Outside.USER_INPUT),
            (Does.DOWNLOADS, Outside.DOWNLOAD))


def outside_origin(ctx, expr: Optional[cst.BaseExpression]) -> Optional[Outside]:
    """Where from outside the program ``expr``'s value comes, or None when nothing shows it does."""
    return _Follow(ctx).origin(expr)


class _Follow:
    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.steps = 0
        self.seen: set[int] = set()

    def origin(self, expr: Optional[cst.BaseExpression]) -> Optional[Outside]:
        if expr is None or id(expr) in self.seen or self.steps >= MAX_STEPS:
            return None
        self.seen.add(id(expr))
        self.steps += 1
        if isinstance(expr, (cst.Name, cst.Attribute)):
            return self._named(expr)
        if isinstance(expr, cst.Subscript):
            return self.origin(expr.value)  # an item of sys.argv, of os.environ, of a parsed configuration
        if isinstance(expr, cst.Call):
            return self._called(expr)
        if isinstance(expr, cst.SimpleString):
            value = expr.evaluated_value
            return Outside.DOWNLOAD if isinstance(value, str) and value.lower().startswith(_URL_SCHEMES) else None
        if isinstance(expr, cst.ConcatenatedString):
            return self._first(expr.left, expr.right)
        if isinstance(expr, cst.FormattedString):
            return self._first(*(part.expression for part in expr.parts
                                 if isinstance(part, cst.FormattedStringExpression)))
        if isinstance(expr, cst.BinaryOperation):
            return self._first(expr.left, expr.right)
        if isinstance(expr, cst.IfExp):
            return self._first(expr.body, expr.orelse)
        if isinstance(expr, cst.BooleanOperation):
            return self._first(expr.left, expr.right)
        if isinstance(expr, (cst.Tuple, cst.List)):
            return self._first(*(element.value for element in expr.elements))
        return None

    def _first(self, *parts: Optional[cst.BaseExpression]) -> Optional[Outside]:
        """Where from outside the first part that comes from outside comes; CALLER only when none is known to."""
        caller = None
        for part in parts:
            found = self.origin(part)
            if found is Outside.CALLER:
                caller = found
            elif found is not None:
                return found
        return caller

    def _api(self, qualified: Optional[str]) -> Optional[Outside]:
        for what, outside in _BY_DOES:
            if does(qualified, what):
                return outside
        return None

    def _named(self, expr: cst.BaseExpression) -> Optional[Outside]:
        ctx = self.ctx
        found = self._api(ctx.qualified_name(expr))
        if found is not None:
            return found
        dotted = dotted_name(expr)
        where = self._enclosing(expr, cst.FunctionDef)
        binding = None
        if where is ctx.function_def and dotted is not None:  # read where the walk stands: its scopes know the name
            binding = ctx.binding(dotted, expr)
            if binding is not None and binding.kind == "param" and isinstance(expr, cst.Name):
                return self._parameter(where, expr.value)
        value = binding.value if binding is not None else None
        if binding is None:  # a call site elsewhere in the file: its own function's assignments and parameters
            value = self._assigned_elsewhere(expr, dotted)
            if value is None and isinstance(expr, cst.Name) and where is not None and \
                    parameter(where, expr.value) is not None:
                return self._parameter(where, expr.value)
        if value is not None:
            return self.origin(value)
        if dotted is not None and dotted.count(".") == 1 and dotted.startswith("self."):
            cls = self._enclosing(expr, cst.ClassDef)  # kept by another method: what any method of the class sets it to
            if cls is not None:
                found = self._first(*attribute_values(cls, dotted[len("self."):]))
                if found is not None:
                    return found
        if isinstance(expr, cst.Attribute):
            return self.origin(expr.value)  # a field of a parsed namespace or configuration
        return None

    def _enclosing(self, node: cst.CSTNode, kind: type) -> Optional[cst.CSTNode]:
        """The innermost ``kind`` (a function or a class) around ``node``, by the whole file's parents: a call site
        may lie past the walk."""
        parents = self.ctx.facts(ModuleNodes).parents
        current = parents.get(id(node))
        while current is not None and not isinstance(current, kind):
            current = parents.get(id(current))
        return current

    def _assigned_elsewhere(self, expr: cst.BaseExpression, dotted: Optional[str]) -> Optional[cst.BaseExpression]:
        if dotted is None:
            return None
        return assignment_before(self.ctx, expr, dotted, unpacked=True)

    def _parameter(self, fn: Optional[cst.FunctionDef], name: str) -> Optional[Outside]:
        if fn is None:
            return None
        for decorator in fn.decorators:
            target = decorator.decorator.func if isinstance(decorator.decorator, cst.Call) else decorator.decorator
            qualified = self.ctx.qualified_name(target)
            if does(qualified, Does.FILLS_PARAMETERS_FROM_OUTSIDE):
                return self._api(qualified)  # Hydra's config, click's options: what the table says it reads
        declared = parameter(fn, name)
        default = declared.default if declared is not None else None
        passed = call_site_values(self.ctx, fn, name)
        if passed is None and default is None:
            return Outside.CALLER
        return self._first(default, *(passed or ()))

    def _returned(self, fn: cst.FunctionDef) -> Optional[Outside]:
        """What a function of this file returns (``args = parse_options()``), by its return statements."""
        returns = self.ctx.facts(FunctionShapes).own_returns(fn)
        return self._first(*(node.value for node in returns if node.value is not None))

    def _local_function(self, func: cst.BaseExpression) -> Optional[cst.FunctionDef]:
        """The function of this file a call calls: a module-level ``def`` by name, a method through ``self.``."""
        if isinstance(func, cst.Name) and self.ctx.qualified_name(func) is None:
            return module_function(self.ctx, func.value)
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
            cls = self._enclosing(func, cst.ClassDef)
            if cls is not None:
                return next((node for node in cls.body.body if isinstance(node, cst.FunctionDef)
                             and node.name.value == func.attr.value), None)
        return None

    def _called(self, call: cst.Call) -> Optional[Outside]:
        ctx = self.ctx
        func = call.func
        arguments = [arg.value for arg in call.args]
        if isinstance(func, cst.Name) and ctx.binding(func.value) is None and func.value in _BUILTINS:
            return Outside.USER_INPUT if func.value == "input" else self._first(*arguments)  # str(args.out)
        qualified = ctx.qualified_name(func)
        found = self._api(qualified)
        if found is not None:
            return found
        if does(qualified, Does.BUILDS_PATH):
            return self._first(*arguments)  # os.path.join(args.out, "best.pt")
        local = self._local_function(func)
        if local is not None:
            return self._returned(local)
        if isinstance(func, cst.Attribute):
            for what, outside in _BY_DOES:
                if method_does(func.attr.value, what):
                    return outside
            # a method of a value gives what that value holds or a string made from it (``cfg.get("weights")``,
            # ``args.out.rstrip("/")``); a path method or ``str.format`` also what it is given
            if method_does(func.attr.value, Does.BUILDS_PATH):
                return self._first(func.value, *arguments)
            return self.origin(func.value)
        # any other call (``range(args.epochs)``, a function of another module) returns a value of its own, except
        # that what it makes of a URL it is given comes from the network (``fetch("https://...")``)
        found = self._first(*arguments)
        return found if found is Outside.DOWNLOAD else None


def path_outside_origin(ctx, path: Optional[cst.BaseExpression]) -> Optional[Outside]:
    """Where from outside the program a file path comes, unless the program spells the folder it is in and the
    outside only picks a name inside it (``"saved_models/%s/G_%d.pth" % (opt.name, opt.epoch)``): a file of the
    program's own folder, whoever picks which."""
    if path is None:
        return None
    origin = ctx.origin(path) or path
    if _in_fixed_directory(path) or _in_fixed_directory(origin):
        return None
    return outside_origin(ctx, path)


def _in_fixed_directory(expr: cst.BaseExpression) -> bool:
    """A path template whose directory the program spells (``"runs/%s.pt" % name``, ``f"ckpt/{tag}.pt"``,
    ``"out/{}.pt".format(n)``, ``os.path.join("weights", name)``): the options fill in only names inside it."""
    prefix = None
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Modulo) and \
            isinstance(expr.left, cst.SimpleString):
        prefix = (expr.left.evaluated_value or "").split("%", 1)[0] if isinstance(expr.left.evaluated_value, str) \
            else None
    elif isinstance(expr, cst.FormattedString) and expr.parts and isinstance(expr.parts[0], cst.FormattedStringText):
        prefix = expr.parts[0].value
    elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "format" \
            and isinstance(expr.func.value, cst.SimpleString) and isinstance(expr.func.value.evaluated_value, str):
        prefix = expr.func.value.evaluated_value.split("{", 1)[0]
    elif isinstance(expr, cst.Call) and dotted_name(expr.func) == "os.path.join" and len(expr.args) > 1 and \
            isinstance(expr.args[0].value, cst.SimpleString) and isinstance(expr.args[0].value.evaluated_value, str):
        prefix = expr.args[0].value.evaluated_value.rstrip("/") + "/"
    return bool(prefix) and "/" in prefix and prefix.strip("./") != ""

