"""Which nn.Module classes a change touches, found with ``ast`` alone (no torch: this runs in the worker).

A class is a module when one of its bases resolves, through the file's imports, to a class in
``torch.nn`` (``nn.Module``, ``torch.nn.Module``, ``th.nn.Sequential``, ``from torch.nn import Module``...),
to a Lightning ``LightningModule``, or to another module class defined in the same file or in another
file of ``sources`` (``from .layers import Block``).
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Iterator, Optional

_TORCH_NN_NON_MODULES = {"Parameter", "UninitializedParameter", "UninitializedBuffer", "Buffer"}
_TORCH_NN_NON_MODULE_PACKAGES = ("torch.nn.functional", "torch.nn.init", "torch.nn.utils", "torch.nn.parameter")
_LIGHTNING_PACKAGES = ("pytorch_lightning", "lightning")
_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class Target:
    path: str  # "models/net.py"
    name: str  # "Net", or "Outer.Inner" for a nested class
    line: int  # first line (decorators included)
    end_line: int
    kind: str = "class"

    @property
    def spec(self) -> str:
        return f"{self.path}:{self.name}"


@dataclass(frozen=True)
class TargetSpec:
    """A configured or command-line target: a file, optionally with a class or factory in it."""

    path: str  # "models/net.py"
    name: Optional[str] = None  # "Net", "build_model"; None: pick the model the file defines

    def __str__(self) -> str:
        return f"{self.path}:{self.name}" if self.name else self.path


def parse_target_spec(spec: str) -> Optional[TargetSpec]:
    """``"models/net.py:build_model"``, ``"models/net.py:Net"``, ``"models/net.py"`` or the module form
    ``"models.net:Net"``; None when ``spec`` is none of these."""
    text = str(spec).strip()
    path, name = text, None
    if ":" in text:
        path, _, name = text.rpartition(":")
        if not _DOTTED_NAME.fullmatch(name):
            return None
    path = path.strip()
    if not path:
        return None
    if not path.endswith(".py"):
        if not _DOTTED_NAME.fullmatch(path):
            return None
        path = path.replace(".", "/") + ".py"
    return TargetSpec(path=path.removeprefix("./"), name=name)


def module_name_for_path(path: str) -> str:
    """``"models/net.py"`` -> ``"models.net"``; ``"models/__init__.py"`` -> ``"models"``."""
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(p for p in parts if p not in ("", "."))


def find_targets(sources: dict[str, str], changed_lines: dict[str, Optional[set[int]]]) -> list[Target]:
    """Every nn.Module subclass in ``changed_lines``' files whose lines overlap a changed line
    (``None``: the whole file is new). ``sources`` may hold more files than changed, for resolving
    base classes imported from them. Files that do not parse are left out."""
    files = {path: _FileInfo.parse(path, source) for path, source in sources.items()}
    files = {path: info for path, info in files.items() if info is not None}
    module_classes = _resolve_module_classes(files.values())
    found = []
    for path, changed in changed_lines.items():
        info = files.get(path)
        if info is None:
            continue
        for cls in info.classes:
            if f"{info.module}.{cls.name}" not in module_classes:
                continue
            if changed is None or any(cls.line <= n <= cls.end_line for n in changed):
                found.append(Target(path=path, name=cls.name, line=cls.line, end_line=cls.end_line))
    return sorted(found, key=lambda t: (t.path, t.line))


# ---- per-file facts ------------------------------------------------------------------------------


@dataclass
class _ClassInfo:
    name: str
    line: int
    end_line: int
    bases: list[str]  # dotted base names as written, resolved through imports when they were imported


@dataclass
class _FileInfo:
    module: str
    classes: list[_ClassInfo]

    @classmethod
    def parse(cls, path: str, source: str) -> Optional["_FileInfo"]:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # hostile nesting too
            return None
        module = module_name_for_path(path)
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        aliases = _import_aliases(tree, package)
        classes = [
            _ClassInfo(name=qualname, line=min([node.lineno] + [d.lineno for d in node.decorator_list]),
                       end_line=node.end_lineno or node.lineno,
                       bases=[_resolve(base, aliases) for base in node.bases if _dotted(base)])
            for qualname, node in _classes(tree)
        ]
        local_names = {c.name for c in classes}
        for info in classes:  # a base defined in this file refers to this file's class
            info.bases = [f"{module}.{b}" if b in local_names else b for b in info.bases]
        return cls(module=module, classes=classes)


def _classes(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.ClassDef]]:
    """Class definitions with their qualified names, not descending into functions."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef):
            qualname = prefix + node.name
            yield qualname, node
            yield from _classes(node, qualname + ".")
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _classes(node, prefix)


def _import_aliases(tree: ast.AST, package: str) -> dict[str, str]:
    """Local name -> the dotted name it was imported as (``nn`` -> ``torch.nn``)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    aliases.setdefault(head, head)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                source = ".".join(base + ([source] if source else []))
            for alias in node.names:
                if alias.name != "*":
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}" if source else alias.name
    return aliases


def _dotted(node: ast.expr) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def _resolve(base: ast.expr, aliases: dict[str, str]) -> str:
    dotted = _dotted(base) or ""
    head, _, rest = dotted.partition(".")
    if head in aliases:
        return aliases[head] + (f".{rest}" if rest else "")
    return dotted


# ---- which classes are modules -------------------------------------------------------------------


def _is_library_module(dotted: str) -> bool:
    parts = dotted.split(".")
    last = parts[-1]
    if dotted.startswith("torch.nn.") and not dotted.startswith(_TORCH_NN_NON_MODULE_PACKAGES):
        return last.lstrip("_")[:1].isupper() and last not in _TORCH_NN_NON_MODULES
    return last == "LightningModule" and parts[0] in _LIGHTNING_PACKAGES


def _resolve_module_classes(files) -> set[str]:
    """Fully qualified names (``models.layers.Block``) of every module class in ``files``. A class is
    also known by the suffixes of its module path, so that ``src/pkg/a.py`` answers ``pkg.a.X``."""
    known: set[str] = set()
    pending = [(info.module, cls) for info in files for cls in info.classes]
    changed = True
    while changed:
        changed = False
        for module, cls in pending:
            qualified = f"{module}.{cls.name}"
            if qualified in known:
                continue
            if any(_is_library_module(b) or b in known for b in cls.bases):
                parts = module.split(".")
                known.update(".".join(parts[i:] + [cls.name]) for i in range(len(parts)))
                known.add(qualified)
                changed = True
    return known


# ---- training steps ------------------------------------------------------------------------------

STEP_FUNCTION_NAMES = re.compile(r"train_one_epoch|train_epoch|train_step|training_step|train_batch|train_on_batch|"
                                 r"train_loop|train|fit|fit_epoch|run_epoch|train_model|train_iter|train_iteration")
STEP_MODEL_ARGUMENTS = re.compile(r"model|net|network|module|classifier")
STEP_LOADER_ARGUMENTS = re.compile(r"(train_?|training_|data_?)?(loader|dataloader|data_loader|iterator)|train_data|"
                                   r"train_dataset|dataset|batches")
STEP_BATCH_ARGUMENTS = re.compile(r"batch|minibatch|mini_batch|batch_data|data_batch|sample")


def find_step_targets(sources: dict[str, str], changed_lines: dict[str, Optional[set[int]]]) -> list[Target]:
    """Training steps in ``changed_lines``' files whose lines overlap a changed line (``None``: the whole file):
    a Lightning-style class (``training_step`` and ``configure_optimizers``; Lightning need not be installed),
    named ``Class.training_step``; a function named like a training step (``train_one_epoch``, ``train``,
    ``train_step``...) that takes the model and calls ``.backward()`` (or hands its loss and optimizer to an update
    helper); and such a method of a plain class (a trainer taking the model in its constructor, making its model
    and optimizer there, or making the optimizer in the method over the model it holds), named ``Class.method``.
    Found with ``ast`` alone."""
    found = []
    for path, changed in changed_lines.items():
        try:
            tree = ast.parse(sources.get(path, ""))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        script_names = module_level_names(tree)
        candidates = [c for node in tree.body for c in _step_candidates(node, script_names)]
        chain = training_loop_chain(tree.body)
        if chain:  # the script's own loop (``while True: ... loss.backward() ... optimizer.step()`` at module level)
            loop = chain[-1]
            candidates.append((SCRIPT_STEP, (loop.lineno, loop.end_lineno or loop.lineno), loop))
        for name, span, candidate in candidates:
            if changed is None or any(span[0] <= n <= span[1] for n in changed):
                found.append(Target(path=path, name=name, line=span[0], end_line=span[1], kind="step"))
    return sorted(found, key=lambda t: (t.path, t.line))


SCRIPT_STEP = "__main__"  # the step name of a script's module-level training loop (``train.py:__main__``)


def training_loop_chain(statements: list, calling: Optional[str] = None) -> list:
    """The statements leading to the first training loop of a block (a ``for`` / ``while`` whose body calls
    ``.backward()``, outside nested functions and classes; with ``calling``, instead one whose body calls the
    function of that name: ``for epoch in ...: train(epoch)``): the ``if`` / ``with`` / ``try`` statements that
    hold it, outermost first, then the loop; empty when there is none. A loop inside another (batches inside
    epochs) is part of the outer one."""
    for statement in statements:
        if isinstance(statement, (ast.For, ast.AsyncFor, ast.While)):
            if _calls_backward_outside_definitions(statement) if calling is None \
                    else _calls_function_outside_definitions(statement, calling):
                return [statement]
        elif isinstance(statement, (ast.If, ast.With, ast.AsyncWith, ast.Try)):
            for block in _blocks(statement):
                inner = training_loop_chain(block, calling)
                if inner:
                    return [statement] + inner
    return []


def _calls_function_outside_definitions(node: ast.AST, name: str) -> bool:
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, ast.Call) and isinstance(item.func, ast.Name) and item.func.id == name:
            return True
        stack.extend(child for child in ast.iter_child_nodes(item)
                     if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)))
    return False


def _blocks(statement: ast.stmt) -> list:
    """The statement lists an ``if`` / ``with`` / ``try`` runs (a ``try``'s handlers and ``else`` are left out:
    the loop that runs is the one in its body)."""
    if isinstance(statement, ast.If):
        return [statement.body, statement.orelse]
    return [statement.body]


def _calls_backward_outside_definitions(node: ast.AST) -> bool:
    stack = [node]
    while stack:
        item = stack.pop()
        if _calls_method(item, "backward"):
            return True
        stack.extend(child for child in ast.iter_child_nodes(item)
                     if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)))
    return False


def builds_its_own_model(function: ast.AST, script_names: frozenset = frozenset()) -> bool:
    """A function (``main()``, ``train_mnist(n_epoch=100)``) that holds a training loop and takes no model, as a
    parameter or as a global its file's script part assigns: it builds what it trains itself."""
    names = [a.arg for a in function.args.posonlyargs + function.args.args + function.args.kwonlyargs]
    names += sorted(global_reads(function) & script_names)
    if any(STEP_MODEL_ARGUMENTS.fullmatch(n.lower()) for n in names):
        return False
    chain = training_loop_chain(function.body)
    if not chain:
        return False
    # its setup builds something to train: an optimizer over parameters, or a model-named variable
    stack = [s for s in function.body]
    while stack:
        node = stack.pop()
        if node is chain[-1] or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if _calls_method(node, "parameters") or isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and STEP_MODEL_ARGUMENTS.fullmatch(t.id.lower()) for t in node.targets):
            return True
        stack.extend(ast.iter_child_nodes(node))
    return False


def _step_candidates(node: ast.stmt, script_names: frozenset = frozenset()) -> Iterator[tuple[str, tuple[int, int],
                                                                                             ast.AST]]:
    def span(item) -> tuple[int, int]:
        return min([item.lineno] + [d.lineno for d in item.decorator_list]), item.end_lineno or item.lineno

    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        # the model as a parameter, or as a global the file's script part assigns (``def train(epoch)`` reading
        # ``net``, ``optimizer``, ``trainloader`` set at module level or under ``if __name__ == "__main__"``)
        names = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        names += sorted(global_reads(node) & script_names)
        if _is_step_function(node) and any(STEP_MODEL_ARGUMENTS.fullmatch(n.lower()) for n in names):
            yield node.name, span(node), node
        elif builds_its_own_model(node, script_names):  # run as a script: its setup, then its loop
            yield node.name, span(node), node
    elif isinstance(node, ast.ClassDef):
        methods = {m.name: m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if "training_step" in methods and "configure_optimizers" in methods:
            yield f"{node.name}.training_step", span(node), node
            return
        if "__init__" not in methods:
            return
        init_names = {a.arg for a in methods["__init__"].args.args}
        if not any(STEP_MODEL_ARGUMENTS.fullmatch(n.lower()) for n in init_names) \
                and not trainer_builds_its_own_model(node) and not trainer_optimizes_what_it_holds(node):
            return
        for method in methods.values():
            # a trainer's method under any name (``run``, ``fit_model``) that holds the training loop
            if method.name != "__init__" and (_is_step_function(method) or _holds_training_loop(method)):
                yield f"{node.name}.{method.name}", span(method), method


def trainer_builds_its_own_model(node: ast.ClassDef) -> bool:
    """A plain class (no ``forward``: not a module) whose constructor builds what it trains: ``__init__``, or a
    method it calls on ``self`` (``self.build_model()``), makes an optimizer over ``.parameters()`` (an experiment,
    solver or agent class built from its config)."""
    methods = {m.name: m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if "forward" in methods or "__init__" not in methods:
        return False
    return any(_calls_method(item, "parameters") or _makes_torch_optimizer(item)
               for item in _reached_from(methods, "__init__"))


def _reached_from(methods: dict[str, ast.AST], start: str):
    """The nodes of method ``start`` and of every method of the class it calls on ``self``, transitively; lazily, so
    a caller that finds what it looks for stops the walk."""
    reached, pending = set(), [start]
    while pending:
        name = pending.pop()
        if name in reached or name not in methods:
            continue
        reached.add(name)
        for item in ast.walk(methods[name]):
            yield item
            if isinstance(item, ast.Call) and isinstance(item.func, ast.Attribute) \
                    and isinstance(item.func.value, ast.Name) and item.func.value.id == "self":
                pending.append(item.func.attr)


def _makes_torch_optimizer(node: ast.AST) -> bool:
    """``torch.optim.SGD(groups, ...)`` / ``optim.Adam(...)``: an optimizer made from ``torch.optim`` (over parameter
    groups the code lists, ``[{"params": model.get_1x_lr_params()}, ...]``, not only ``.parameters()``)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr[:1].isupper()):
        return False
    owner = node.func.value
    return isinstance(owner, ast.Name) and owner.id == "optim" or isinstance(owner, ast.Attribute) \
        and owner.attr == "optim" and isinstance(owner.value, ast.Name) and owner.value.id == "torch"


def trainer_optimizes_what_it_holds(node: ast.ClassDef) -> bool:
    """A plain class (no ``forward``: not a module) with a constructor and a method holding a training loop that
    makes its optimizer itself over a model the instance holds: the method, or a method it calls on ``self``
    (``self._select_optimizer()``), calls ``self.<model>.parameters()``. The model is then made by the
    constructor, or by a base class's constructor the runner does not read here (an experiment class whose base
    builds ``self.model`` through ``self._build_model()``); which one the instance holds is read once it is built."""
    methods = {m.name: m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if "forward" in methods or "__init__" not in methods:
        return False

    return any(name != "__init__" and _holds_training_loop(method) and any(
        _calls_method(item, "parameters") and _is_self_attribute(item.func.value)
        for item in _reached_from(methods, name)) for name, method in methods.items())


def _is_self_attribute(node: ast.AST) -> bool:
    """``self.model`` (``self.model.module`` too): an attribute the instance holds."""
    while isinstance(node, ast.Attribute):
        node = node.value
        if isinstance(node, ast.Name):
            return node.id == "self"
    return False


def _is_step_function(node: ast.AST) -> bool:
    """Named like a training step and calling ``.backward()``; or, under any name, a training loop over a loader
    it is given (``for x, y in loader: ... loss.backward(); optimizer.step()``)."""
    if STEP_FUNCTION_NAMES.fullmatch(node.name):
        return any(_calls_method(n, "backward") for n in ast.walk(node)) or _hands_loss_to_an_update(node)
    arguments = [a.arg.lower() for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
    if not any(STEP_LOADER_ARGUMENTS.fullmatch(a) for a in arguments):
        return False
    return _holds_training_loop(node)


_OPTIMIZER_ARGUMENTS = re.compile(r"(\w+_)?(optimi[sz]er|optim)")


def _hands_loss_to_an_update(node: ast.AST) -> bool:
    """A loop that hands a loss and the optimizer the function takes to a helper that backpropagates and steps
    (``loss_scaler(loss, optimizer, parameters=model.parameters())``, ``backward_and_step(loss, optimizer)``): the
    update is the helper's, the loop is the step's."""
    arguments = {a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                 if _OPTIMIZER_ARGUMENTS.fullmatch(a.arg.lower())}
    if not arguments:
        return False
    for loop in ast.walk(node):
        if not isinstance(loop, (ast.For, ast.While)):
            continue
        for call in ast.walk(loop):
            if not isinstance(call, ast.Call):
                continue
            given = [*call.args, *(k.value for k in call.keywords)]
            names = {g.id for g in given if isinstance(g, ast.Name)}
            if names & arguments and any("loss" in n.lower() for n in names - arguments):
                return True
    return False


def _holds_training_loop(node: ast.AST) -> bool:
    """A loop (``for`` or ``while``) whose body calls ``.backward()`` and steps an optimizer: ``.step()``, or an
    optimizer wrapper's own stepping method (``schedule.step_and_update_lr()``) beside a ``.zero_grad()``. A loop
    that only zeroes and backpropagates (gradients for saliency, a gradient norm) updates nothing: not a step."""
    def steps(loop: ast.AST) -> bool:
        calls = [n.func.attr for n in ast.walk(loop) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
        return "step" in calls or "zero_grad" in calls and any(c.startswith("step_") for c in calls)

    return any(isinstance(loop, (ast.For, ast.While)) and any(_calls_method(n, "backward") for n in ast.walk(loop))
               and steps(loop) for loop in ast.walk(node))


def _calls_method(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name


def global_reads(function: ast.AST) -> set[str]:
    """The names ``function`` reads that it neither takes nor assigns: the module's globals (and builtins) it uses."""
    arguments = function.args
    local = {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs}
    local |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
    declared_global: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Global):
            declared_global.update(node.names)
        elif isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else local).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not function:
            local.add(node.name)
        elif isinstance(node, ast.arg) and node not in arguments.args:
            local.add(node.arg)  # a lambda's or nested function's parameter
        elif isinstance(node, ast.alias):
            local.add((node.asname or node.name).split(".")[0])
    return read - (local - declared_global)


def module_level_names(tree: ast.Module) -> frozenset:
    """Names the module's own statements bind outside functions and classes (the script part included: a
    ``net = Net()`` under ``if __name__ == "__main__":``)."""
    names: set[str] = set()
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        stack.extend(ast.iter_child_nodes(node))
    return frozenset(names)
