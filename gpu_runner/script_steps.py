"""A training loop written as a script: ``while True: ... loss.backward(); optimizer.step()`` at module
level, under ``if __name__ == "__main__":``, or in a ``main()`` that builds its own model. The runner runs the
script's own setup (the statements before the loop: settings, data, model, optimizer), then the loop, bounded to a
few optimizer steps, inside the sandbox, with the step checks of ``gpu_runner.steps`` on what the loop trains.

What changes from running ``python train.py``:

- settings are shrunk the way the runner shrinks a model's constructor arguments (``n_layer = 12`` -> 2, widths,
  heads' widths), and batch sizes, sequence lengths, evaluation batches, accumulation steps and data-loader workers
  too, as each is assigned (a plain assignment, an argparse default, a parameter default); a device setting that
  names CUDA on a runner without it is the runner's device;
- ``parse_args()`` reads no command line (the defaults; an argument without one gets a value the code declares,
  see ``required_argument_value``), ``sys.argv`` is the script alone, ``torch.compile`` is the identity (the checks
  are about the model's code, not the compiler), data loaders load in the process;
- a raw data file mapped or read with ``np.memmap`` / ``np.fromfile`` that is missing is stand-in data of the
  dtype and shape the code passes (``_RawDataStandIns``), said in the notes; so are the shards of such data that
  a file which maps them lists with ``glob`` in a folder that is missing (a few stand-in names);
- the script runs in a scratch folder that mirrors its own (links to its files), so that what it writes (a
  checkpoint folder) does not need the read-only code tree;
- the loop stops at the runner's bound (``iterations`` optimizer steps), and what follows it (saving, plotting)
  does not run.

The model is what the loop trains: when the loop starts, every ``nn.Module`` in its scope whose parameters an
optimizer in scope holds (several: a GAN's generator and discriminator); without an optimizer, the modules named
like a model. A setup that needs what the sandbox does not have (a data file, the network, a package, command-line
arguments, a distributed launch) is skipped, naming it; the loop's own code raising on the shrunk settings is
skipped too, never failed.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import copy
import functools
import glob
import inspect
import linecache
import os
import re
import shutil
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from gpu_runner import absent, training_apis, vision_data
from gpu_runner.build import SEQUENCE_LENGTH, _shrunk
from gpu_runner.guess import CONFIG_NAMES
from gpu_runner.steps import STEP_BATCH, StepSkip, _Plan, _UserCodeFailed, _one_line, _user_frames, role_of
from gpu_runner.targets import SCRIPT_STEP, training_loop_chain

LOOP_HOOK = "__torchreview_loop_starts__"
SETTING_HOOK = "__torchreview_setting__"
MISSING = "__torchreview_missing__"  # absent.MissingPackageError, for the statements _UnusedReports wraps
UNUSED_REPORT = "__torchreview_unused_report__"
DROPPED = "__torchreview_dropped__"  # what an object of a missing package that is only called for effect becomes
SHRUNK_LENGTH = 4 * SEQUENCE_LENGTH  # a script's own data is cut to its sequence length: 64 tokens or steps
EVALUATION_BATCHES = 2

_BATCH_SETTINGS = re.compile(r"(\w+_)?(batch_size|batchsize|bs|bsz|minibatch_size|micro_batch_size)", re.I)
_LENGTH_SETTINGS = re.compile(r"(\w+_)?(block_size|seq_len|seq_length|sequence_length|max_len|max_length|"
                              r"max_seq_len|context_length|context_size|ctx_len|bptt)", re.I)
_EVALUATION_COUNTS = re.compile(r"(eval|val|valid|test)_?(iters|iterations|steps|batches|samples)|"
                                r"num_(eval|val)_(batches|steps)", re.I)
_WORKER_SETTINGS = re.compile(r"(num_|n_)?workers|n_cpu", re.I)


def shrunk_setting(name: str, value: Any, others: dict, device: Any, notes: list) -> Any:
    """The value a script's setting ``name`` gets on the runner (see the module's docstring); anything else is
    left as the script has it."""
    if isinstance(value, str) and role_of(name) == "device" and value.startswith("cuda") \
            and not str(device).startswith("cuda"):
        new = str(device)
    elif isinstance(value, bool) or not isinstance(value, int):
        new = _shrunk(name, value, others) if isinstance(value, (tuple, list)) else value
    elif _BATCH_SETTINGS.fullmatch(name):
        new = min(value, STEP_BATCH)
    elif _LENGTH_SETTINGS.fullmatch(name):
        new = min(value, SHRUNK_LENGTH)
    elif _EVALUATION_COUNTS.fullmatch(name):
        new = min(value, EVALUATION_BATCHES)
    elif role_of(name) == "accumulation":
        new = min(value, 2)
    elif _WORKER_SETTINGS.fullmatch(name):
        new = 0
    else:
        new = _shrunk(name, value, others)
    if new is not value and new != value:
        notes.append(f"{name} = {new!r} (the script's {value!r})")
    return new


# ---- rewriting the script -------------------------------------------------------------------------------

def _setting_call(name: str, value: ast.expr) -> ast.Call:
    return ast.Call(ast.Name(SETTING_HOOK, ast.Load()), [ast.Constant(name), value, _scope()], [])


def _scope() -> ast.Call:
    """``{**globals(), **locals()}``: what the settings assigned so far are, for a width that keeps its heads."""
    return ast.Dict(keys=[None, None], values=[ast.Call(ast.Name("globals", ast.Load()), [], []),
                                                ast.Call(ast.Name("locals", ast.Load()), [], [])])


class _Settings(ast.NodeTransformer):
    """Wraps each plain assignment of a name (``n_layer = 12``, ``batch_size: int = 64``) in the setting hook; the
    bodies of functions and classes are left alone."""

    def visit_FunctionDef(self, node):
        return node

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign):
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            node.value = ast.copy_location(_setting_call(node.targets[0].id, node.value), node.value)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign):
        if isinstance(node.target, ast.Name) and node.value is not None:
            node.value = ast.copy_location(_setting_call(node.target.id, node.value), node.value)
        return node


class _UnusedReports(ast.NodeTransformer):
    """A statement that only calls a package the runner lacks and drops the result (``wandb.log(...)``,
    ``matplotlib.use("Agg")``) cannot feed the training: it is skipped, with a note, rather than skipping the step.
    So is an object made by such a package (``logger = tb_logger.Logger(...)``) that the code only ever calls
    methods of, dropping what they return (``logger.log_value(...)``): it is bound to one whose methods do
    nothing. ``packages``: local name -> the installed-or-not package it is bound to by an import of the file (not
    the repository's own modules). ``scope``: where the names' uses are read (the file, or the step's function).
    ``function``: the step's function (a ``main()``), whose body is read too (other functions are not: they run as
    the file defines them)."""

    def __init__(self, packages: dict, scope: ast.AST, function: Optional[ast.AST] = None):
        self.packages, self.function = packages, function
        self.dropped = _only_called_for_effect(scope)

    def visit_FunctionDef(self, node):
        return self.generic_visit(node) if node is self.function else node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        return node

    visit_Lambda = visit_ClassDef

    def _package(self, call: ast.AST) -> Optional[str]:
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == SETTING_HOOK \
                and len(call.args) > 1:
            call = call.args[1]  # a setting the script assigns, wrapped in its hook (_Settings)
        root = call.func if isinstance(call, ast.Call) else None
        while isinstance(root, (ast.Attribute, ast.Call)):
            root = root.value if isinstance(root, ast.Attribute) else root.func
        return self.packages.get(root.id) if isinstance(root, ast.Name) else None

    def _guarded(self, node: ast.stmt, package: str, fallback: list) -> ast.Try:
        error = "__torchreview_error"
        report = ast.Expr(ast.Call(ast.Name(UNUSED_REPORT, ast.Load()),
                                   [ast.Name(error, ast.Load()), ast.Constant(package),
                                    ast.Constant(node.lineno)], []))
        handler = ast.ExceptHandler(type=ast.Name(MISSING, ast.Load()), name=error, body=[report, *fallback])
        return ast.copy_location(ast.Try(body=[node], handlers=[handler], orelse=[], finalbody=[]), node)

    def visit_Expr(self, node: ast.Expr):
        package = self._package(node.value)
        return node if package is None else self._guarded(node, package, [])

    def visit_Assign(self, node: ast.Assign):
        package = self._package(node.value)
        if package is None or len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name) \
                or node.targets[0].id not in self.dropped:
            return node
        stand_in = ast.Assign([ast.Name(node.targets[0].id, ast.Store())], ast.Name(DROPPED, ast.Load()))
        return self._guarded(node, package, [ast.copy_location(stand_in, node)])


def _only_called_for_effect(function: ast.AST) -> set:
    """The names a function assigns and reads, only ever as ``name.method(...)`` statements that drop what they
    return (a name never read is not one: nothing says what it is for)."""
    parents = {child: parent for parent in ast.walk(function) for child in ast.iter_child_nodes(parent)}
    assigned, called, other = set(), set(), set()
    for node in ast.walk(function):
        if not isinstance(node, ast.Name):
            continue
        if isinstance(node.ctx, ast.Store):
            assigned.add(node.id)
            continue
        attribute = parents.get(node)
        call = parents.get(attribute)
        if isinstance(attribute, ast.Attribute) and isinstance(call, ast.Call) and call.func is attribute \
                and isinstance(parents.get(call), ast.Expr):
            called.add(node.id)
        else:
            other.add(node.id)
    return (assigned & called) - other


def _imported_packages(tree: ast.Module, code_root: Path) -> dict:
    """Local name -> top-level package, for the file's imports of packages that are not the repository's."""
    packages = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            pairs = [(a.asname or a.name.split(".")[0], a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            pairs = [(a.asname or a.name, node.module.split(".")[0]) for a in node.names if a.name != "*"]
        else:
            continue
        for local, top in pairs:
            if not (code_root / top).exists() and not (code_root / f"{top}.py").exists():
                packages[local] = top
    return packages


def _hook_statement(like: ast.stmt) -> ast.stmt:
    call = ast.Call(ast.Name(LOOP_HOOK, ast.Load()), [ast.Call(ast.Name("globals", ast.Load()), [], []),
                                                      ast.Call(ast.Name("locals", ast.Load()), [], [])], [])
    return ast.copy_location(ast.Expr(call), like)


def _up_to_the_loop(statements: list, chain: list, *, already_defined: bool) -> list:
    """``statements`` as far as the training loop: the setup before it (settings wrapped), the hook, the loop; what
    follows is dropped. At module level the imports, functions and classes already ran (the file was imported as
    its definitions), so only the rest runs again; a ``__main__`` guard on the way is entered."""
    head = chain[0]
    index = next(i for i, s in enumerate(statements) if s is head)
    kept = []
    for statement in statements[:index]:
        if already_defined and isinstance(statement, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                                      ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        kept.append(_Settings().visit(statement))
    if len(chain) == 1:
        return kept + [_hook_statement(head), head]
    inner = chain[1]
    if isinstance(head, ast.If):
        block = head.body if any(s is inner for s in head.body) else head.orelse
        rest = _up_to_the_loop(block, chain[1:], already_defined=False)
        if _is_main_guard(head) and block is head.body:
            return kept + rest
        branch = copy.copy(head)
        branch.body, branch.orelse = (rest, []) if block is head.body else ([ast.Pass()], rest)
        return kept + [branch]
    changed = copy.copy(head)  # with / try: the loop inside its body
    changed.body = _up_to_the_loop(head.body, chain[1:], already_defined=False)
    if isinstance(changed, ast.Try):
        changed.orelse, changed.finalbody = [], []
    return kept + [changed]


def _is_main_guard(node: ast.If) -> bool:
    test = node.test
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"


def script_part(tree: ast.Module, calling: Optional[str] = None) -> Optional[ast.Module]:
    """The module's statements up to its training loop (see _up_to_the_loop; with ``calling``, the loop that calls
    that function of the file), or None without a loop."""
    chain = training_loop_chain(tree.body, calling)
    if not chain:
        return None
    return ast.Module(body=_up_to_the_loop(tree.body, chain, already_defined=True), type_ignores=[])


def function_up_to_the_loop(node: ast.FunctionDef, calling: Optional[str] = None) -> Optional[ast.FunctionDef]:
    """The function cut after its training loop (with ``calling``, its loop calling that function of the file)."""
    chain = training_loop_chain(node.body, calling)
    if not chain:
        return None
    changed = copy.copy(node)
    changed.body = _up_to_the_loop(node.body, chain, already_defined=False)
    changed.decorator_list = []
    return changed


# ---- the plan ------------------------------------------------------------------------------------------

class _Models(nn.ModuleDict):
    """Several modules trained by one loop (a generator and a discriminator), instrumented as one model."""

    def torchreview_roots(self) -> list:
        return list(self.values())


class _SetupSkip(BaseException):
    """The script's setup cannot run in the sandbox (raised through the script's own ``except Exception``);
    ``need`` (``needs command-line arguments...``) is said of the setup."""

    def __init__(self, message: str, need: bool = False):
        super().__init__(message)
        self.need = need


class ScriptPlan(_Plan):
    """Runs the script's setup, then its training loop, the model found when the loop starts."""

    kind = "script"
    unchanged_fails = False

    def __init__(self, code_root: Path, target: str, path: str, module: types.ModuleType,
                 function: Optional[Callable], device: Any, calling: Optional[str] = None):
        source_path = (code_root / path).resolve()
        tree = ast.parse(source_path.read_text(errors="replace"), str(source_path))
        if function is None:
            part = script_part(tree, calling)
            if part is None:
                raise StepSkip(f"{path} has no training loop at module level (a loop calling "
                               + (f"{calling}())" if calling else ".backward())"))
            loop = training_loop_chain(tree.body, calling)[-1]
        else:
            node = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                         and n.name == function.__name__ and n.lineno == function.__code__.co_firstlineno), None)
            node = node or next((n for n in tree.body if isinstance(n, ast.FunctionDef)
                                 and n.name == function.__name__), None)
            changed = function_up_to_the_loop(node, calling) if node is not None else None
            if changed is None:
                raise StepSkip(f"{target} holds no training loop (a loop calling "
                               + (f"{calling}())" if calling else ".backward())"))
            part = ast.Module(body=[changed], type_ignores=[])
            loop = training_loop_chain(node.body, calling)[-1]
        function_node = changed if function is not None else None
        part = _UnusedReports(_imported_packages(tree, code_root), function_node or tree, function_node).visit(part)
        super().__init__(code_root, target, None, (path, loop.lineno, loop.end_lineno or loop.lineno), device=device)
        self.module, self.function, self.source_path, self.tree = module, function, source_path, tree
        self.code = compile(ast.fix_missing_locations(part), str(source_path), "exec")
        self.shrunk: list[str] = []
        self.reached_loop = False

    # -- running --

    def execute(self, iterations: int) -> None:
        namespace = self.module.__dict__
        saved = {name: namespace.get(name, _ABSENT)
                 for name in (LOOP_HOOK, SETTING_HOOK, MISSING, UNUSED_REPORT, DROPPED)}
        namespace[LOOP_HOOK] = self._loop_starts
        namespace[MISSING] = absent.MissingPackageError
        namespace[UNUSED_REPORT] = self._unused_report
        namespace[DROPPED] = training_apis.DisabledWriter()
        namespace[SETTING_HOOK] = lambda name, value, scope: shrunk_setting(name, value, scope, self.device,
                                                                            self.shrunk)
        writers = training_apis.unset_writers(self.tree, namespace)
        if writers:
            self.notes.append("tensorboard is not installed: the script's SummaryWriter wrote nothing "
                              "(gpu_runner.training_apis)")
        try:
            with _script_environment(self.source_path, self.device, self.shrunk, self.notes):
                if self.function is None:
                    self._run_user(lambda: exec(self.code, namespace))
                else:
                    self._run_user(self._call_function)
        finally:
            for name in writers:
                namespace.pop(name, None)
            for name, old in saved.items():
                if old is _ABSENT:
                    namespace.pop(name, None)
                else:
                    namespace[name] = old
            if self.shrunk:
                self.notes.append("settings shrunk as the runner shrinks models: " + "; ".join(self.shrunk[:12])
                                  + (f" and {len(self.shrunk) - 12} more" if len(self.shrunk) > 12 else ""))

    def _unused_report(self, error: BaseException, package: str, line: int) -> None:
        if absent.missing_package(error) != package:
            raise error
        note = f"statements that only call '{package}', which the runner lacks, were skipped (line {line}"
        if not any(n.startswith(note.split(" (line")[0]) for n in self.notes):
            self.notes.append(note + ")")

    def _call_function(self) -> None:
        namespace = self.module.__dict__
        name = self.function.__name__
        original = namespace.get(name, _ABSENT)
        exec(self.code, namespace)  # the function cut after its loop, with its settings wrapped
        truncated = namespace[name]
        if original is _ABSENT:
            namespace.pop(name, None)
        else:
            namespace[name] = original
        truncated(**self._function_arguments(truncated))

    def _function_arguments(self, function: Callable) -> dict:
        """Its defaults (shrunk like settings), the runner's device, options from the file's argparse defaults."""
        from gpu_runner.steps import _config_namespace

        arguments = {}
        for parameter in inspect.signature(function).parameters.values():
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            if parameter.default is not parameter.empty:
                arguments[parameter.name] = shrunk_setting(parameter.name, parameter.default, {}, self.device,
                                                           self.shrunk)
            elif role_of(parameter.name) == "device":
                arguments[parameter.name] = self.device
            elif parameter.name.lower() in CONFIG_NAMES:
                from gpu_runner.steps import _repository_options

                # the script's options as its run hands them over (required ones valued, those set after parsing)
                options = _repository_options(self.code_root, [self.path], self.path, self.notes)
                defaults = {k: shrunk_setting(k, v, {}, self.device, self.shrunk) for k, v in options.items()}
                try:
                    arguments[parameter.name] = _config_namespace(function, parameter.name, {"device": self.device},
                                                                  None, defaults)
                except StepSkip as exc:
                    raise _SetupSkip(str(exc)) from None
            else:
                raise _SetupSkip(f"cannot build the argument '{parameter.name}' of {self.target}: it has no default "
                                 "and is not a device or options; give the step its value in smoke.steps "
                                 f"({{step = ..., args = {{{parameter.name} = ...}}}})")
        return arguments

    def _run_user(self, run: Callable[[], None]) -> None:
        try:
            run()
        except _SetupSkip as exc:
            raise StepSkip(f"{self._setup()} {exc}" if exc.need else str(exc)) from None
        except (Exception, SystemExit) as exc:
            if self.reached_loop:
                raise _UserCodeFailed() from exc
            raise StepSkip(self._setup_failure(exc)) from None

    def _setup(self) -> str:
        return f"the setup of {self.target} (before its training loop at line {self.first_line})"

    def _setup_failure(self, exc: BaseException) -> str:
        frames = _user_frames(exc.__traceback__, self.code_root)
        at = f" at {Path(frames[-1].filename).resolve().relative_to(self.code_root)}:{frames[-1].lineno}" \
            if frames else ""
        before = self._setup()
        missing = absent.missing_package(exc) or (exc.name.split(".")[0] if isinstance(exc, ModuleNotFoundError)
                                                  and exc.name else None)
        if missing:
            return (f"{before} needs '{missing}'{at}, which is not installed on the smoke runner; install it in the "
                    "runner image")
        if isinstance(exc, FileNotFoundError) or (isinstance(exc, OSError) and exc.filename):
            return (f"{before} needs the file '{exc.filename}'{at}, which is not in the repository (data the "
                    "script expects to be downloaded or prepared first)")
        if _is_network_error(exc):
            return f"{before} needs the network{at} ({type(exc).__name__}: {_one_line(exc, 120)}), which the sandbox has none of"
        if _is_distributed_error(exc):
            return (f"{before} needs a distributed launch{at} ({type(exc).__name__}: {_one_line(exc, 120)}); run "
                    "it as a single process or configure smoke.steps with a step function")
        if isinstance(exc, NameError) and getattr(exc, "name", None):
            from gpu_runner.steps import failed_import

            failed = failed_import(self.code_root, self.path, exc.name, self.module.__dict__)
            if failed:
                return f"{before} uses '{exc.name}'{at}, which {failed}"
        if isinstance(exc, SystemExit):
            code = linecache.getline(frames[-1].filename, frames[-1].lineno).strip() if frames else ""
            return f"{before} exited{at}" + (f" (`{code}`)" if code else f" (SystemExit: {exc.code})")
        return f"{before} raised {type(exc).__name__}{at}: {_one_line(exc, 200)}"

    def _loop_starts(self, global_scope: dict, local_scope: dict) -> None:
        """Called just before the training loop: the model and optimizers in scope are what it trains."""
        if self.reached_loop:
            return
        scope = {**global_scope, **local_scope}
        optimizers = _values_of(scope, torch.optim.Optimizer)
        optimized = {id(p) for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]}
        modules = {name: m for name, m in _named_values_of(scope, nn.Module)
                   if any(p.requires_grad for p in m.parameters())}
        if optimizers:
            chosen = {name: m for name, m in modules.items() if any(id(p) in optimized for p in m.parameters())}
        else:
            chosen = {name: m for name, m in modules.items() if role_of(name) == "model"} or modules
        chosen = _outermost(chosen)
        if not chosen:
            raise _SetupSkip(f"{self.target}: no nn.Module with trainable parameters is in scope when the training "
                             f"loop at line {self.first_line} starts (the loop builds its model itself, or trains "
                             "no module)")
        model = next(iter(chosen.values())) if len(chosen) == 1 else _Models(chosen)
        names = ", ".join(f"{name} ({type(m).__name__}, {sum(p.numel() for p in m.parameters()):,} parameters)"
                          for name, m in chosen.items())
        self.notes.append(f"the script's setup ran; its loop at line {self.first_line} trains {names}")
        in_eval = [name for name, m in chosen.items() if not m.training]
        if in_eval:
            self.eval_before_the_loop = f"{', '.join(in_eval)} in eval mode when the loop starts"
        # a loss reaching any tensor an optimizer holds, or any module in scope, is connected to what trains
        module_ids = {id(p) for p in model.parameters()}
        in_scope = {id(p) for m in modules.values() for p in m.parameters()}
        self.begin(model, None, step_limit=self.iterations, backward_limit=3 * self.iterations,
                   extra_parameter_ids=frozenset((optimized | in_scope) - module_ids))
        self.reached_loop = True


_ABSENT = object()


def _named_values_of(scope: dict, kind: type) -> list:
    """(name, value) of ``kind`` in ``scope``, also one level inside lists, tuples and dicts; each object once."""
    found, seen = [], set()
    for name, value in scope.items():
        if name.startswith("__"):
            continue
        items = [(name, value)]
        if isinstance(value, (list, tuple)):
            items = [(f"{name}_{i}", v) for i, v in enumerate(value[:16])]
        elif isinstance(value, dict) and not isinstance(value, nn.Module):
            items = [(f"{name}_{k}", v) for k, v in list(value.items())[:16] if isinstance(k, str)]
        for item_name, item in items:
            if isinstance(item, kind) and id(item) not in seen and not isinstance(item, types.ModuleType):
                seen.add(id(item))
                found.append((re.sub(r"\W", "_", item_name), item))
    return found


def _values_of(scope: dict, kind: type) -> list:
    return [value for _, value in _named_values_of(scope, kind)]


def _outermost(modules: dict) -> dict:
    """The modules that are no other one's submodule (``model`` and not ``model.head``)."""
    inside = {id(sub) for m in modules.values() for sub in m.modules() if sub is not m}
    return {name: m for name, m in modules.items() if id(m) not in inside}


_NETWORK_ERRORS = ("URLError", "HTTPError", "ConnectionError", "gaierror", "Timeout", "ConnectTimeout",
                   "NewConnectionError", "MaxRetryError", "SSLError")


def _is_network_error(exc: BaseException) -> bool:
    chain, seen = exc, set()
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        if type(chain).__name__ in _NETWORK_ERRORS or isinstance(chain, (ConnectionError,)) \
                or "Name or service not known" in str(chain) or "Temporary failure in name resolution" in str(chain):
            return True
        chain = chain.__cause__ or chain.__context__
    return False


def _is_distributed_error(exc: BaseException) -> bool:
    text = str(exc)
    return any(word in text for word in ("init_process_group", "environment variable RANK", "MASTER_ADDR",
                                         "LOCAL_RANK", "WORLD_SIZE", "process group", "NCCL", "torchrun"))


# ---- the script's environment ----------------------------------------------------------------------------

class _NotDownloaded(dict):
    """What a pretrained-weights download the sandbox cannot make returns: no weights (the model keeps those it
    was initialized with); loading it into a module changes nothing."""


@contextlib.contextmanager
def weights_not_downloaded(notes: list):
    """While a step runs: ``torch.hub.load_state_dict_from_url`` (``torch.utils.model_zoo.load_url``) that fails
    for want of the network (the sandbox has none) returns no weights instead of raising, and ``load_state_dict``
    of those loads nothing: the step trains the model as initialized, said in the notes. A weights file that is
    there (the hub's cache), or any other error, is as it was."""
    import torch.hub
    import torch.utils.model_zoo

    original, original_load = torch.hub.load_state_dict_from_url, nn.Module.load_state_dict
    missed: list = []

    def load_or_nothing(url, *args, **kwargs):
        try:
            return original(url, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - only the network's absence is answered; the rest re-raised
            if not _is_network_error(exc):
                raise
            if url not in missed:
                missed.append(url)
            return _NotDownloaded()

    def load_state_dict(module, state_dict, *args, **kwargs):
        if isinstance(state_dict, _NotDownloaded):
            return original_load(module, module.state_dict(), *args, **kwargs)
        return original_load(module, state_dict, *args, **kwargs)

    saved_zoo = getattr(torch.utils.model_zoo, "load_url", None)
    torch.hub.load_state_dict_from_url = load_or_nothing
    torch.utils.model_zoo.load_url = load_or_nothing
    nn.Module.load_state_dict = load_state_dict
    try:
        yield
    finally:
        torch.hub.load_state_dict_from_url = original
        if saved_zoo is not None:
            torch.utils.model_zoo.load_url = saved_zoo
        nn.Module.load_state_dict = original_load
        if missed:
            notes.append(f"pretrained weights the code downloads ({', '.join(missed[:2])}) cannot be fetched in the "
                         "sandbox (no network): the model kept the weights it was initialized with")


@contextlib.contextmanager
def loaders_in_process(notes: list):
    """While a step runs: its data loaders load in the process (``num_workers=0``: no worker processes in the
    sandbox), and those over the runner's synthetic images load batches of the runner's size. Said in the notes."""
    loader_init = torch.utils.data.DataLoader.__init__
    used: dict = {}

    def loader_in_process(self, *args, **kwargs):
        dataset = args[0] if args else kwargs.get("dataset")
        if isinstance(dataset, vision_data.SyntheticImages):
            # the runner's own images: batches of the runner's size (the script's sizes are shrunk likewise)
            if len(args) > 1 and isinstance(args[1], int) and args[1] > STEP_BATCH:
                args = (args[0], STEP_BATCH, *args[2:])
                used["synthetic batch"] = True
            elif isinstance(kwargs.get("batch_size"), int) and kwargs["batch_size"] > STEP_BATCH:
                kwargs["batch_size"] = STEP_BATCH
                used["synthetic batch"] = True
        if kwargs.get("num_workers"):
            used["workers"] = True
            kwargs["num_workers"] = 0
            kwargs.pop("prefetch_factor", None)
            kwargs.pop("persistent_workers", None)
        return loader_init(self, *args, **kwargs)

    torch.utils.data.DataLoader.__init__ = loader_in_process
    try:
        yield
    finally:
        torch.utils.data.DataLoader.__init__ = loader_init
        if used.get("synthetic batch"):
            notes.append(f"data loaders over the synthetic images load batches of {STEP_BATCH}")
        if used.get("workers"):
            notes.append("data loaders loaded in the process (num_workers=0)")


@contextlib.contextmanager
def scratch_working_folder(folder: Path):
    """The working folder a scratch mirror of ``folder`` (a link to each of its entries) for the time of the block:
    what the PR's code reads relative to it is there, and what it writes (a checkpoint or experiment folder it makes
    in a constructor) lands in the scratch folder, not in the read-only code tree. Every step kind runs in one."""
    saved_cwd = os.getcwd()
    scratch = Path(tempfile.mkdtemp(prefix="torchreview_script_"))
    for entry in folder.iterdir():
        with contextlib.suppress(OSError):
            (scratch / entry.name).symlink_to(entry)
    os.chdir(scratch)
    try:
        yield scratch
    finally:
        os.chdir(saved_cwd)
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def _script_environment(script: Path, device: Any, shrunk: list, notes: list):
    """``sys.argv`` of the script alone; ``parse_args()`` on no command line, its values shrunk; ``torch.compile``
    the identity; data loaders without worker processes; the working folder a scratch mirror of the script's."""
    saved_argv = sys.argv
    parse_known_args = argparse.ArgumentParser.parse_known_args
    compile_ = torch.compile
    used: dict = {}

    def parse_without_command_line(parser, args=None, namespace=None):
        command_line = []
        if args is None:
            required = [a for a in parser._actions if a.required or (not a.option_strings
                                                                       and a.nargs not in ("?", "*"))]
            values = {a.dest: required_argument_value(a, script) for a in required}
            lacking = [a.option_strings[0] if a.option_strings else a.dest for a in required if values[a.dest] is None]
            if lacking:
                raise _SetupSkip(f"needs command-line arguments ({', '.join(lacking[:4])}), which have no default "
                                 "and no value the code declares; configure smoke.steps with a step function",
                                 need=True)
            for action in required:
                value, source = values[action.dest]
                words = [str(v) for v in (value if isinstance(value, list) else [value])]
                command_line += [action.option_strings[0], *words] if action.option_strings else words
                given = f"{action.option_strings[0] if action.option_strings else action.dest} {' '.join(words)}"
                used.setdefault("arguments", []).append(f"{given} ({source})")
        parsed, rest = parse_known_args(parser, command_line if args is None else args, namespace)
        values = vars(parsed)
        for key, value in list(values.items()):
            setattr(parsed, key, shrunk_setting(key, value, values, device, shrunk))
        return parsed, rest

    def identity_compile(model=None, *args, **kwargs):
        used["compile"] = True
        return model if model is not None else (lambda fn: fn)

    stand_ins = _RawDataStandIns(notes)
    sys.argv = [str(script)]
    argparse.ArgumentParser.parse_known_args = parse_without_command_line
    torch.compile = identity_compile
    try:
        with scratch_working_folder(script.parent), stand_ins, loaders_in_process(notes), \
                vision_data.synthetic_vision_data(notes), training_apis.single_process_apis(device, notes), \
                weights_not_downloaded(notes):
            yield
    finally:
        sys.argv = saved_argv
        argparse.ArgumentParser.parse_known_args = parse_known_args
        torch.compile = compile_
        if used.get("compile"):
            notes.append("torch.compile was the identity: the checks are about the model's code")
        if used.get("arguments"):
            notes.append("command-line arguments without a default were given values the code declares: "
                         + "; ".join(dict.fromkeys(used["arguments"])))


def required_argument_value(action: argparse.Action, script: Path,
                            also: tuple = ()) -> Optional[tuple[Any, str]]:
    """(value, where it comes from) for a command-line argument without a default: its first choice; else the
    default it declares although ``required=True`` makes argparse ignore it (``required=True, default='informer'``);
    else a value the code compares it with (``args.net == "vgg16"``, ``self.args.mode in ("train", "test")``) in
    the script, the files beside it or ``also`` (the class that reads the options); else, for a number, a small one
    by its name (as constructor arguments are guessed) or its type. None for a string nothing declares (a path, a
    name): the step stays skipped, naming it."""
    from gpu_runner.build import guess_argument

    many = action.nargs in ("+", "*") or isinstance(action.nargs, int)
    if action.choices:
        value, source = list(action.choices)[0], "its first choice"
    elif action.default is not None and action.default is not argparse.SUPPRESS and not isinstance(action.default,
                                                                                                   bool):
        value, source = action.default, "the default it declares, which argparse ignores for a required option"
    else:
        compared = _compared_constants(action.dest, script, also)
        if compared is not None and (action.type in (None, str) or isinstance(compared, action.type)):
            value, source = compared, "a value the code compares it with"
        elif action.type in (int, float):
            found, guessed = guess_argument(action.dest, action.type)
            by_name = found and isinstance(guessed, (int, float)) and not isinstance(guessed, bool)
            value = action.type(guessed) if by_name else action.type(2 if action.type is int else 0.1)
            source = f"a small {action.type.__name__}" + (" by its name" if by_name else "")
        else:
            return None
    if many:
        value = [value] * (action.nargs if isinstance(action.nargs, int) else 1)
    return value, source


def required_options(script: Path, also: tuple = ()) -> dict:
    """Read without running ``script``: ``{dest: (value, where it comes from)}`` for each of its command-line
    options that the command line must give (``required=True``, or a positional without ``nargs='?'``/``'*'``),
    valued by ``required_argument_value`` (``also``: further files that compare the options with constants). An
    option nothing values is left out (it stays unknown, and the code reading it says so)."""
    try:
        tree = ast.parse(script.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return {}
    kinds = {"int": int, "float": float, "str": str}
    found: dict = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        keywords = {k.arg: k.value for k in node.keywords if k.arg}

        def literal(key: str, otherwise: Any = None) -> Any:
            try:
                return ast.literal_eval(keywords[key]) if key in keywords else otherwise
            except (ValueError, TypeError, SyntaxError, RecursionError):
                return otherwise

        if not flags:
            continue
        options = [f for f in flags if f.startswith("-")]
        nargs = literal("nargs")
        if not (literal("required") is True or not options and nargs not in ("?", "*")):
            continue
        dest = literal("dest") or (next((f for f in options if f.startswith("--")), options[0] if options else
                                        flags[0]).lstrip("-").replace("-", "_"))
        kind = keywords.get("type")
        kind = kinds.get(kind.id) if isinstance(kind, ast.Name) else None
        choices = literal("choices")
        try:
            action = argparse.Action(options, dest, nargs=nargs, default=literal("default"), type=kind,
                                     choices=choices if isinstance(choices, (list, tuple, set)) else None,
                                     required=True)
        except (TypeError, ValueError):
            continue
        valued = required_argument_value(action, script, also)
        if valued is not None:
            found.setdefault(dest, valued)
    return found


def _parsed_options_block(tree: ast.Module) -> Optional[tuple[str, list]]:
    """(the name ``parse_args()`` is assigned to, the statements after it in its block): the first such
    assignment at module level, under ``__main__`` or in a function."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for index, statement in enumerate(body):
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                    and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Call) \
                    and isinstance(statement.value.func, ast.Attribute) and statement.value.func.attr == "parse_args":
                return statement.targets[0].id, body[index + 1:]
    return None


def _only_sets_options(statement: ast.stmt, options: str) -> bool:
    """``statement`` assigns only ``<options>.X`` or plain names (``args.use_gpu = torch.cuda.is_available() and
    args.use_gpu``, ``info = table[args.data]``, the ``if`` blocks made of such), and calls no function of the
    repository (a call of a plain name is a builtin's): what a script does to its options after parsing them."""
    if not isinstance(statement, (ast.Assign, ast.AugAssign, ast.If)):
        return False
    for node in ast.walk(statement):
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.Assign, ast.AugAssign, ast.If, ast.Pass)):
            return False
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                if not all(isinstance(t, ast.Name) or isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                           and t.value.id == options for t in names):
                    return False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not hasattr(builtins, node.func.id):
            return False
    return True


def options_set_after_parsing(script: Path, options: dict, notes: list) -> dict:
    """``options`` (a script's argparse values) with what the script itself sets on them after ``parse_args()``
    (``args.use_gpu = True if torch.cuda.is_available() and args.use_gpu else False``, ``args.cuda = not
    args.no_cuda and torch.cuda.is_available()``, sizes looked up in a table by the data set's name), run here as
    the script runs them: the statements of ``parse_args()``'s block that only set options or plain names, in
    order, with the script's imports; a statement that raises is left out. Runs inside the sandbox, as the step
    does. The options changed are said in ``notes``."""
    try:
        tree = ast.parse(script.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return options
    found = _parsed_options_block(tree)
    if found is None:
        return options
    name, statements = found
    namespace = argparse.Namespace(**options)
    scope: dict = {"__name__": "__torchreview_options__", name: namespace}
    for statement in tree.body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            with contextlib.suppress(Exception):
                exec(compile(ast.Module([statement], []), str(script), "exec"), scope)  # noqa: S102 - sandboxed
    candidates = [st for st in statements if _only_sets_options(st, name)]

    def sets_options(statement: ast.stmt) -> bool:
        return any(isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
                   and n.value.id == name for n in ast.walk(statement))

    # a plain name is set only where a statement setting options reads it (``info = table[args.data]``)
    read = {n.id for st in candidates if sets_options(st) for n in ast.walk(st)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for statement in candidates:
        if not sets_options(statement) and not any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                                                   and n.id in read for n in ast.walk(statement)):
            continue
        with contextlib.suppress(Exception):
            exec(compile(ast.Module([statement], []), str(script), "exec"), scope)  # noqa: S102 - sandboxed
    changed = {k: v for k, v in vars(namespace).items() if k not in options or options[k] is not v
               and not _same(options[k], v)}
    if changed:
        notes.append(f"options {script.name} sets after parsing them, as it runs: "
                     + ", ".join(f"{k}={v!r}" for k, v in list(changed.items())[:8])
                     + (f" and {len(changed) - 8} more" if len(changed) > 8 else ""))
    return vars(namespace)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - tensors, arrays: not the same object, so changed
        return False


def _compared_constants(name: str, script: Path, also: tuple = ()) -> Any:
    """The first constant that ``<options>.name`` (``args.name``, or ``self.args.name`` where a class keeps its
    options) is compared with (``==``, ``!=``, ``in``) in ``script``, else in the Python files beside it, else in
    ``also``; None when none is."""
    files = [script] + sorted(p for p in script.parent.glob("*.py") if p != script)
    files += [p for p in also if p not in files]
    for path in files:
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except (OSError, SyntaxError, ValueError, RecursionError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare) or len(node.comparators) != 1 \
                    or not isinstance(node.ops[0], (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                continue
            sides = [node.left, node.comparators[0]]
            for mine, other in (sides, sides[::-1]):
                if not (isinstance(mine, ast.Attribute) and mine.attr == name
                        and (isinstance(mine.value, ast.Name) or isinstance(mine.value, ast.Attribute)
                             and mine.value.attr.lower() in CONFIG_NAMES)):
                    continue
                items = other.elts if isinstance(other, (ast.Tuple, ast.List, ast.Set)) else [other]
                constant = next((i.value for i in items if isinstance(i, ast.Constant) and i.value is not None
                                 and not isinstance(i.value, bool)), None)
                if constant is not None:
                    return constant
    return None


RAW_DATA_LENGTH = 1 << 15  # elements of a raw data file's stand-in when the code gives no shape
RAW_TOKEN_BOUND = 64  # integer stand-in values are below it: any vocabulary, class count or index range fits
# names a listing of raw shards in a missing folder gets: a few, so that a split keeping one shard apart (a
# validation shard, ``shards[1:]`` for training) still leaves the other split some
RAW_SHARD_NAMES = 4
_RAW_READERS = ("memmap", "fromfile")


@functools.lru_cache(maxsize=256)
def _reads_raw_files(filename: str) -> bool:
    """The source file calls ``np.memmap`` / ``np.fromfile`` (any receiver): it maps or reads raw data files."""
    try:
        tree = ast.parse(Path(filename).read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _RAW_READERS
               for n in ast.walk(tree))


class _RawDataStandIns:
    """Raw binary data files that are missing (``np.memmap(path, dtype=np.uint16, mode="r")``, ``np.fromfile``):
    such a file has no header, so its dtype and shape are the code's own (the ``dtype`` and ``shape`` it passes,
    else one dimension); the runner gives the code an array of that dtype and shape, integers below
    ``RAW_TOKEN_BOUND`` (token ids, labels) or floats from a normal distribution, and says so in the step's notes.
    A file that exists is read as the code asks; a file opened for writing is the code's own business.

    The files such code lists first (``glob.glob(os.path.join(folder, "*.bin"))``, ``Path(folder).glob("*.bin")``
    over shards a preparation step writes) are listed the same way: where the folder is missing and the file
    calling ``glob`` itself maps or reads raw files, the listing is ``RAW_SHARD_NAMES`` names in that folder matching
    the pattern, which the readers above then give stand-in data for; said in the notes. A folder that exists is
    listed as it is, and a file that reads no raw data (a listing of checkpoints to resume from) gets the real,
    empty, listing."""

    def __init__(self, notes: list):
        self.notes = notes
        self.saved: dict = {}
        self.rebound: list = []

    def __enter__(self):
        import numpy

        self.numpy = numpy
        self.saved = {"memmap": numpy.memmap, "fromfile": numpy.fromfile}
        memmap, fromfile = self.saved["memmap"], self.saved["fromfile"]
        stand_in = self.stand_in

        class _MemmapOrStandIn(memmap):
            def __new__(cls, filename, dtype=numpy.uint8, mode="r+", offset=0, shape=None, order="C"):
                if isinstance(filename, (str, os.PathLike)) and str(mode) in ("r", "r+", "c", "readonly",
                                                                              "readwrite", "copyonwrite") \
                        and not os.path.exists(filename):
                    return stand_in(filename, dtype, shape, "np.memmap")
                return memmap.__new__(memmap, filename, dtype=dtype, mode=mode, offset=offset, shape=shape,
                                      order=order)

        def fromfile_or_stand_in(file, dtype=float, count=-1, *args, **kwargs):
            if isinstance(file, (str, os.PathLike)) and not os.path.exists(file):
                return stand_in(file, dtype, None if count in (-1, None) else (count,), "np.fromfile")
            return fromfile(file, dtype, count, *args, **kwargs)

        numpy.memmap, numpy.fromfile = _MemmapOrStandIn, fromfile_or_stand_in
        listing = self.saved_glob = glob.glob
        notes = self.notes

        def shard_names(folder: str, pattern: str, caller: str) -> Optional[list]:
            """Stand-in names for a listing of ``pattern`` in ``folder`` that found nothing, or None."""
            if not pattern or not glob.has_magic(pattern) or glob.has_magic(folder) or os.path.isdir(folder or ".") \
                    or not _reads_raw_files(caller):
                return None
            note = (f"the folder '{folder}' is missing: the runner listed {RAW_SHARD_NAMES} stand-in files for "
                    f"'{pattern}' in it, whose raw data it then stands in for")
            if note not in notes:
                notes.append(note)
            return list(dict.fromkeys(os.path.join(folder, _shard_name(pattern, index))
                                      for index in range(RAW_SHARD_NAMES)))

        def glob_or_stand_in(pathname, *args, **kwargs):
            found = listing(pathname, *args, **kwargs)
            if found or not isinstance(pathname, (str, os.PathLike)) or kwargs.get("recursive"):
                return found
            folder, pattern = os.path.split(os.fspath(pathname))
            names = shard_names(folder, pattern, sys._getframe(1).f_code.co_filename)
            return found if names is None else names

        path_listing = self.saved_path_glob = Path.glob

        def path_glob_or_stand_in(folder, pattern, *args, **kwargs):
            found = list(path_listing(folder, pattern, *args, **kwargs))
            names = None if found or "/" in str(pattern) or os.sep in str(pattern) \
                else shard_names(str(folder), str(pattern), sys._getframe(1).f_code.co_filename)
            return iter(found if names is None else [type(folder)(name) for name in names])

        Path.glob = path_glob_or_stand_in
        glob.glob = glob_or_stand_in
        # ``from glob import glob`` in the repository's modules bound the function before the step ran
        self.rebound = [(module, name) for module in list(sys.modules.values()) if _is_user_module(module)
                        for name, value in list(vars(module).items()) if value is listing]
        for module, name in self.rebound:
            setattr(module, name, glob_or_stand_in)
        return self

    def __exit__(self, *exc_info):
        for name, value in self.saved.items():
            setattr(self.numpy, name, value)
        glob.glob = self.saved_glob
        Path.glob = self.saved_path_glob
        for module, name in self.rebound:
            setattr(module, name, self.saved_glob)
        return False

    def stand_in(self, filename: Any, dtype: Any, shape: Any, reader: str):
        numpy = self.numpy
        dtype = numpy.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape) if shape is not None else (RAW_DATA_LENGTH,)
        generator = numpy.random.default_rng(0)
        if dtype.kind in "iub":
            values = generator.integers(0, 2 if dtype.kind == "b" else RAW_TOKEN_BOUND, size=shape).astype(dtype)
        elif dtype.kind in "fc":
            values = generator.standard_normal(size=shape).astype(dtype)
        else:
            raise FileNotFoundError(2, "No such file or directory", str(filename))
        note = (f"the data file '{filename}' is missing: the runner gave {reader} synthetic data of the dtype and "
                f"shape the code asks for ({dtype.name}, {shape}" + (f", values below {RAW_TOKEN_BOUND}" if
                                                                     dtype.kind in "iu" else "") + ")")
        if note not in self.notes:
            self.notes.append(note)
        return values


def _is_user_module(module: Any) -> bool:
    """A module imported from outside the Python installation and the runner's own package (the repository's)."""
    where = getattr(module, "__file__", None)
    if not isinstance(where, str) or not isinstance(module, types.ModuleType):
        return False
    installed = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(__file__).resolve().parent)}
    return not any(where.startswith(prefix.rstrip("/") + "/") for prefix in installed)


def _shard_name(pattern: str, index: int) -> str:
    """A file name ``pattern`` matches: each ``*`` a stand-in word, each ``?`` a digit of the index, a ``[...]`` set
    its first member."""
    name = re.sub(r"\[(!?)([^\]]+)\]", lambda m: "_" if m.group(1) else m.group(2)[0], pattern)
    name = name.replace("*", f"standin{index:04d}", 1).replace("*", "")
    digits = iter(str(index).zfill(name.count("?"))[-name.count("?"):] if "?" in name else "")
    return re.sub(r"\?", lambda m: next(digits), name)


def script_plan(code_root: Path, target: str, path: str, name: str, module: types.ModuleType,
                device: Any) -> ScriptPlan:
    """The plan for ``path:__main__`` (the module-level loop) or ``path:function`` (a function that builds its own
    model and loops)."""
    function = None if name == SCRIPT_STEP else getattr(module, name, None)
    if name != SCRIPT_STEP and not callable(function):
        raise StepSkip(f"{path} defines no function '{name}'")
    return ScriptPlan(code_root, target, path, module, function, device)


def calling_script_plan(code_root: Path, target: str, path: str, name: str, module: types.ModuleType,
                        device: Any) -> Optional[ScriptPlan]:
    """For a step function of a script whose own plan the runner skips: the script's setup as the script runs it,
    then its loop that calls the step, bounded like a script's loop. Either the step reads what the script's
    setup assigns (``def train(epoch)`` using the ``net``, ``optimizer`` and loader built under ``__main__``, the
    model made by a factory such as ``net = get_network(args)``) and the loop is the script's own; or the step
    takes its model as a parameter and a function of the file that the script calls (``main()``) makes what it
    passes (its model, loader, criterion, options) and loops calling it. None when the file has neither."""
    from gpu_runner.targets import _calls_function_outside_definitions, global_reads, module_level_names

    try:
        tree = ast.parse((code_root / path).read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return None
    functions = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    node = next((n for n in functions if n.name == name), None)
    if node is None:
        return None
    if training_loop_chain(tree.body, name) \
            and any(role_of(g) == "model" for g in global_reads(node) & module_level_names(tree)):
        plan = ScriptPlan(code_root, target, path, module, None, device, calling=name)
        plan.notes.append(f"{name} reads the model its script's setup assigns: the setup ran as the script runs "
                          f"it, then the script's loop calling {name}() at line {plan.first_line}")
        return plan
    parameters = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
    if not any(role_of(p) == "model" for p in parameters):
        return None
    script = [s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    caller = next((f for f in functions if f is not node and not _parameters_without_defaults(f)
                   and training_loop_chain(f.body, name)
                   and any(_calls_function_outside_definitions(s, f.name) for s in script)), None)
    function = getattr(module, caller.name, None) if caller is not None else None
    if not callable(function):
        return None
    plan = ScriptPlan(code_root, target, path, module, function, device, calling=name)
    plan.notes.append(f"{name} takes what {caller.name}(), which the script calls, makes: {caller.name}() ran as "
                      f"the script runs it, up to its loop calling {name}() at line {plan.first_line}")
    return plan


def _parameters_without_defaults(function: ast.AST) -> list:
    arguments = function.args
    positional = arguments.posonlyargs + arguments.args
    required = positional[:len(positional) - len(arguments.defaults)]
    required += [a for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is None]
    return [a.arg for a in required]
