"""Build a Subject from a smoke target: import the PR's module, construct the model, infer an input that
its forward accepts, and pick a task and loss from what it returns. Runs inside the sandboxed child.

Everything guessed is verified by running the model and recorded in ``Subject.notes``; when a target
cannot be built with confidence the answer is a ``Skip`` that says how to configure it, never a failure.
An explicit configuration is honoured as given: a configured input that the forward rejects still
builds a Subject, so that the checks report the failure.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import itertools
import math
import re
import socket
import sys
import time
import types
import typing
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from gpu_runner import absent, forward_body, parents, sites
from gpu_runner.forward_body import describe_layer
from gpu_runner.subject import OUT_OF_MEMORY_REASON, Batch, Subject, out_of_memory
from gpu_runner.targets import TargetSpec, find_targets, module_name_for_path, parse_target_spec

SEQUENCE_LENGTH = 16  # tokens / time steps in inferred inputs; the guessed max_len/block_size is the same
PROBE_BATCH = 4
SECOND_PROBE_BATCH = 2  # a second forward tells which output axis is the batch
MAX_PROBES = 40
MAX_PROBES_AFTER_BROADCAST = 12  # other inputs tried after one that worked only by broadcasting
FACTORY_NAMES = ("build_model", "create_model", "make_model", "get_model", "model_fn")
CONFIGURE_HINT = "configure smoke.targets with a factory and an input shape"


@dataclass
class Skip:
    reason: str  # what could not be inferred and how to configure it


@dataclass
class BuiltWithBug:
    """The model was built and shows a bug before any check can run (its layers all in a plain list: no
    registered parameter to train), reported as that check's failure rather than a skip."""

    name: str
    check: Any  # gpu_runner.subject.CheckResult


class BuildError(Exception):
    """The PR's module cannot be imported, or an explicit configuration cannot be honoured."""


# Errors whose cause a static rule already names: say that, not "configure smoke.targets".
_KNOWN_BUGS = (
    (re.compile(r"cannot assign \w+ before Module\.__init__\(\) call|"
                r"object has no attribute '_(?:parameters|modules|buffers)'"),
     "its `__init__` does not call `super().__init__()` before using the module (TR301 missing-super-init): "
     "call it first"),
)


def known_bug(exc: BaseException) -> Optional[str]:
    """What is wrong with the PR's code when ``exc`` is the symptom of a bug torchreview knows."""
    text = str(exc)
    return next((explanation for pattern, explanation in _KNOWN_BUGS if pattern.search(text)), None)


def build_subject(code_root: Path, target: str, *, device: str, config: Optional[dict] = None,
                  seed: int = 0) -> Union[Subject, Skip, BuiltWithBug]:
    """Build ``target`` (``"models/net.py:Net"``, ``"models/net.py:build_model"`` or ``"models/net.py"``)
    from the code under ``code_root``. ``config`` is the repo's smoke entry for it: ``factory``,
    ``input`` (``{"shape", "dtype", "low", "high"}`` or a list of them, ``name`` for a keyword input),
    ``output`` (``{"batch_axis": 1 | None, "select": index or key}``), ``task``, ``loss``
    (``"module.path:callable"`` called with (model output, target): the selected tensor when ``output.select``
    is set, else the whole output), ``num_classes`` and ``loss_target`` (a tensor description like ``input``,
    for a configured loss). docs/runner.md ("Configuring smoke targets") documents the same keys."""
    config = dict(config or {})
    code_root = Path(code_root).resolve()
    _add_to_sys_path(code_root)
    notes: list[str] = []
    torch.manual_seed(seed)
    _IMPORT_NOTES.clear()
    _LAST_ARGUMENTS.clear()
    _CODE_ROOT[:] = [code_root]
    _BUILD_DEVICE[:] = [device]
    _SITE_INPUTS.clear()
    _PARENT_INPUTS.clear()
    built = _construct(code_root, target, config, notes)
    notes[:0] = _IMPORT_NOTES
    if isinstance(built, Skip):
        return built
    model, resolved_name = built
    requested = parse_target_spec(target)
    name = str(requested) if requested is not None and requested.name else resolved_name
    inside_parent = bool(_PARENT_INPUTS)
    subject = subject_of_model(model, name, resolved_name, config, code_root, device, list(notes))
    if not isinstance(subject, Skip) or inside_parent or config.get("input") is not None or config.get("factory") \
            or not subject.reason.startswith("could not infer an input"):
        return subject
    resolved = parse_target_spec(resolved_name)
    if resolved is None or not resolved.name or not inspect.isclass(type(model)) \
            or resolved.name != type(model).__name__:
        return subject
    parent_notes: list[str] = []  # no input fits the class as built alone: the one a parent feeds it, as it builds it
    _PARENT_INPUTS.clear()
    rebuilt = _build_inside_parent(code_root, resolved, type(model), parent_notes)
    if rebuilt is None or not _PARENT_INPUTS or _PARENT_INPUTS[0][1] is None:
        return subject
    again = subject_of_model(rebuilt, name, resolved_name, config, code_root, device, _IMPORT_NOTES + parent_notes)
    return subject if isinstance(again, Skip) else again


def subject_of_model(model: Any, name: str, resolved_name: str, config: dict, code_root: Path, device: str,
                     notes: list) -> Union[Subject, Skip, BuiltWithBug]:
    """The subject (input, task, loss) for ``model``, already built: by ``build_subject`` from its target, or by a
    training step from the instance a trainer class built for itself."""
    if not isinstance(model, nn.Module):
        raise BuildError(f"{resolved_name} returned {type(model).__name__}, not an nn.Module")
    if type(model).forward is nn.Module.forward:
        return Skip(f"{name} does not define forward (a base class?); name a concrete model or {CONFIGURE_HINT}")
    if not any(p.requires_grad for p in model.parameters()):
        from gpu_runner.checks import registration_result

        registration = registration_result(model)  # layers in a plain list look like "no parameters": say which
        if registration.status == "fail":
            return BuiltWithBug(name, registration)
        return Skip(f"{name} has no trainable parameters (an activation, a fixed encoding): there is nothing to "
                    "train, so the smoke checks do not apply; its users are checked where they are models")
    model.to(device)
    model.train()
    float_dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    prober = _Prober(model, device, float_dtype)

    if config.get("input") is not None:
        plan = _plan_from_config(config["input"])
        notes.append(f"input: configured {plan.describe()}")
        output = prober.try_plan(plan)
        if output is _FAILED:
            notes.append(f"forward failed on the configured input {plan.describe()}: {prober.last_error}")
    else:
        plan, output = _input_from_parent(prober, notes)
        if plan is None:
            plan, output = _input_from_sites(prober, notes)
        if plan is None:
            plan, output = _infer_input(model, prober, notes, _input_hints(model))
        if plan is None:
            plan, output = _input_from_children(model, prober, notes)
        if plan is None and prober.missing_package:
            return Skip(f"the forward of {name} needs '{prober.missing_package}', which is not installed on the smoke "
                        "runner; install it in the runner image")
        if plan is None and prober.needs_cuda:
            return Skip(f"the forward of {name} needs CUDA, which the smoke runner's machine lacks: it moves tensors "
                        f"to the GPU itself ({prober.needs_cuda}); run it on a GPU runner")
        if plan is None:
            return Skip(f"could not infer an input for {name}: tried {prober.tried} shapes "
                        f"(first error: {prober.first_error}); {CONFIGURE_HINT}")
        grown = _grow_small_image(model, prober, plan, notes)
        if grown is not None:
            plan, output = grown

    task = _choose_task(plan, output, prober, config, code_root, notes)
    if isinstance(task, Skip):
        return task
    return Subject(name=name, model=model, make_batch=_BatchMaker(plan, task, device, float_dtype),
                   loss_fn=task.loss_fn, task=task.name, device=device, num_classes=task.num_classes,
                   objective_guessed=not (config.get("task") or config.get("loss")),
                   integer_inputs=plan.has_token_inputs(), graph=plan.is_graph(), notes=notes,
                   output_batch_axis=task.batch_axis, output_select=task.select, inputs_batch_first=plan.batch_first(),
                   inputs_guessed=plan.source not in ("configured", "example_input_array"),
                   smaller=_SmallerInput(plan, prober, config, code_root, device, float_dtype))


IMAGE_SIDE_FLOOR = 8  # an image input is halved for the time budget down to this side, never below
SEQUENCE_LENGTH_FLOOR = 4


def _halved_plan(plan: InputPlan) -> Optional[tuple[InputPlan, str]]:
    """``plan`` with its images' height and width (the last two axes of a float input of 3 or more axes) or its
    sequences' length (a token input's only axis, a float [L, D] input's first) halved, in every input that has
    that size on such an axis (a mask [L, L] too); None at the floor, for graphs and for inputs of neither kind."""
    specs = [spec for spec in plan.all_specs() if not spec.is_target]
    first = next((spec for spec in specs if spec.fill is None), None)
    if first is None or plan.is_graph() or any(isinstance(spec, TupleSpec) for spec in plan.args) \
            or any(spec.lengths or spec.columns or spec.batchless for spec in specs):
        # lengths are tied to the sequence length; a tensor for the whole batch was made for the sizes it came with
        return None
    if first.dtype not in ("long", "int", "int64", "int32") and len(first.shape) >= 3:
        sizes, floor, what = set(first.shape[-2:]), IMAGE_SIDE_FLOOR, "resolution"
        axes = lambda spec: range(max(len(spec.shape) - 2, 0), len(spec.shape))  # noqa: E731 - the spatial axes
    elif (first.dtype in ("long", "int", "int64", "int32") and len(first.shape) == 1) or len(first.shape) == 2:
        sizes, floor, what = {first.shape[0]}, SEQUENCE_LENGTH_FLOOR, "sequence length"
        axes = lambda spec: range(len(spec.shape))  # noqa: E731 - a mask [L] or [L, L]: every axis of that size
    else:
        return None
    if min(sizes) // 2 < floor:
        return None
    halved = {size: size // 2 for size in sizes}

    def smaller(spec: Union[TensorSpec, TupleSpec]) -> Union[TensorSpec, TupleSpec]:
        if isinstance(spec, TupleSpec) or spec.adjacency:
            return spec
        shape = tuple(halved.get(d, d) if i in axes(spec) else d for i, d in enumerate(spec.shape))
        return dataclasses.replace(spec, shape=shape)

    new = InputPlan(tuple(smaller(s) for s in plan.args), tuple((k, smaller(s)) for k, s in plan.kwargs),
                    source=plan.source)
    shown = " x ".join(str(halved[d]) for d in (first.shape[-2:] if what == "resolution" else first.shape[:1]))
    return new, f"{what} halved to {shown}"


class _SmallerInput:
    """``Subject.smaller``: the subject on its input at half the resolution or sequence length, when the forward
    takes it; the loss's targets are remade for the new output shape."""

    def __init__(self, plan: InputPlan, prober: "_Prober", config: dict, code_root: Path, device: str,
                 float_dtype: torch.dtype):
        self.plan, self.prober, self.config, self.code_root = plan, prober, config, code_root
        self.device, self.float_dtype = device, float_dtype

    def __call__(self, subject: Subject) -> Optional[Subject]:
        plan = self.plan
        while True:
            halved = _halved_plan(plan)
            if halved is None:
                return None
            plan, how = halved
            output = self.prober.try_plan(plan)
            if output is not _FAILED:
                break  # a size the forward rejects (a patch grid): the next halving may still fit
        notes: list[str] = []
        task = _choose_task(plan, output, self.prober, self.config, self.code_root, notes)
        if isinstance(task, Skip):
            return None
        return dataclasses.replace(
            subject, make_batch=_BatchMaker(plan, task, self.device, self.float_dtype), loss_fn=task.loss_fn,
            task=task.name, num_classes=task.num_classes, output_batch_axis=task.batch_axis, output_select=task.select,
            notes=[*subject.notes, f"for the time budget: {how} ({plan.describe()})"],
            smaller=_SmallerInput(plan, self.prober, self.config, self.code_root, self.device, self.float_dtype))


# ---- importing the PR's code ---------------------------------------------------------------------


def _add_to_sys_path(code_root: Path) -> None:
    for folder in (code_root / "src", code_root):  # code_root ends first on sys.path
        if folder.is_dir():
            if str(folder) in sys.path:
                sys.path.remove(str(folder))
            sys.path.insert(0, str(folder))


def _forget_modules_from_elsewhere(package: str, code_root: Path) -> None:
    """A package of the same name imported from another tree (another revision, a test) would shadow ours."""
    loaded = sys.modules.get(package)
    if loaded is None:
        return
    locations = [getattr(loaded, "__file__", None) or ""] + list(getattr(loaded, "__path__", []) or [])
    if any(Path(location).resolve().is_relative_to(code_root) for location in locations if location):
        return
    for key in [k for k in sys.modules if k == package or k.startswith(package + ".")]:
        del sys.modules[key]


def import_file(code_root: Path, relative_path: str, *, raise_missing: bool = False,
                transform: Optional[Callable[[ast.Module], ast.Module]] = None):
    """Import ``relative_path`` under ``code_root`` as the module its package layout makes it
    (``models/net.py`` -> ``models.net``), so that its absolute and relative imports work. A package
    ``__init__.py`` that cannot be imported is skipped over (its folder registered bare); with ``raise_missing``,
    one that fails on a package that is not installed raises that ModuleNotFoundError instead, so that the
    caller can retry with a stand-in for it (and keep what the ``__init__`` defines). ``transform`` rewrites the
    file's syntax tree before it runs (the module is marked with it, so that a plain import does not reuse it)."""
    file_path = (code_root / relative_path).resolve()
    module_name = module_name_for_path(Path(relative_path).as_posix())
    valid = bool(module_name) and all(part.isidentifier() for part in module_name.split("."))
    top = module_name.split(".")[0]
    if not valid or ("." not in module_name and (top in sys.stdlib_module_names or top in sys.builtin_module_names)):
        module_name = "torchreview_smoke_" + re.sub(r"\W", "_", Path(relative_path).stem)
        sys.path.insert(0, str(file_path.parent))  # a script's sibling imports
    else:
        _forget_modules_from_elsewhere(top, code_root)
        parent = module_name.rpartition(".")[0]
        if parent:
            try:
                importlib.import_module(parent)
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - e.g. a package __init__ importing what the runner lacks
                if raise_missing and _not_installed(exc, code_root):
                    raise
                _bare_packages(code_root, parent)
                failed = f"{type(exc).__name__}: {_one_line_text(exc, 160)}{_where_in(exc, code_root)}"
                _BARE_PACKAGE_ERRORS[parent] = (failed, absent.missing_package(exc))
                _IMPORT_NOTES.append(f"imported {relative_path} without running its package's __init__.py, which "
                                     f"raised {failed}")
    existing = sys.modules.get(module_name)
    if existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() == file_path \
            and getattr(existing, "__torchreview_transform__", None) is transform:
        return existing
    spec = importlib.util.spec_from_file_location(module_name, file_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        if transform is None:
            spec.loader.exec_module(module)
        else:
            module.__torchreview_transform__ = transform
            tree = transform(ast.parse(file_path.read_text(errors="replace"), str(file_path)))
            exec(compile(ast.fix_missing_locations(tree), str(file_path), "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


_IMPORT_NOTES: list[str] = []  # what importing did unusually, for the next Subject's notes
# package -> (what its __init__.py raised, the missing package it used) when it was registered bare
_BARE_PACKAGE_ERRORS: dict[str, tuple[str, Optional[str]]] = {}


def _not_installed(exc: BaseException, code_root: Path) -> Optional[str]:
    """The package ``exc`` says is not installed (a ModuleNotFoundError for a name that is not in the tree, and no
    stand-in's report of a use), else None."""
    if not isinstance(exc, ModuleNotFoundError) or absent.missing_package(exc):
        return None
    name = (exc.name or "").split(".")[0]
    if not name or (code_root / name).exists() or (code_root / f"{name}.py").exists():
        return None
    return name


def _where_in(exc: BaseException, code_root: Path) -> str:
    """`` (at models/types_.py:3)``: the innermost line of the tree's code in ``exc``'s traceback, or ""."""
    import traceback as traceback_module

    root = str(code_root) + "/"
    frames = [f for f in traceback_module.extract_tb(exc.__traceback__) if f.filename.startswith(root)]
    if not frames:
        return ""
    return f" (at {Path(frames[-1].filename).relative_to(code_root).as_posix()}:{frames[-1].lineno})"
_CODE_ROOT: list[Path] = []  # the code tree of the target being built
_BUILD_DEVICE: list[str] = []  # the device the target runs on
_DATA_FILE_CHOICE: list[int] = [0]  # which of the data files' mappings that fit a constructor to use (0: smallest)
_DATA_FILE_OFFERED: list[int] = []  # how many mappings each read of the data files offered since it was cleared
_LAST_ARGUMENTS: dict = {}  # the constructor arguments (defaults included) of the model last built: input hints
_SITE_INPUTS: list = []  # (where, (args, kwargs) of sites.TensorShape): what the repository feeds the model last built
_PARENT_INPUTS: list = []  # (parent, InputPlan or None, instance): what the parent it was built inside fed it


def _bare_packages(code_root: Path, dotted: str) -> None:
    """Registers ``dotted`` and its parents as packages over their folders without executing their
    ``__init__.py``, so that the file and its siblings import as they would inside the package."""
    import importlib.machinery

    parts = dotted.split(".")
    for index in range(1, len(parts) + 1):
        name = ".".join(parts[:index])
        folder = code_root.joinpath(*parts[:index])
        if name in sys.modules and getattr(sys.modules[name], "__path__", None):
            continue
        module = types.ModuleType(name)
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
        module.__spec__, module.__path__, module.__package__ = spec, [str(folder)], name
        sys.modules[name] = module
        if index > 1:
            setattr(sys.modules[".".join(parts[:index - 1])], parts[index - 1], module)


def _load_attribute(code_root: Path, spec: TargetSpec, what: str) -> Union[Any, Skip]:
    file_path = code_root / spec.path
    if not file_path.is_file():
        package_init = spec.path.removesuffix(".py") + "/__init__.py"  # "models:Net" -> models/__init__.py
        if (code_root / package_init).is_file():
            spec = TargetSpec(package_init, spec.name)
        else:
            return Skip(f"{what} {spec}: {spec.path} does not exist in the pull request's code")
    module = import_with_stand_ins(code_root, spec.path)
    if isinstance(module, Skip):
        return module
    if spec.name is None:
        return module
    value: Any = module
    for part in spec.name.split("."):
        if not hasattr(value, part):
            return Skip(f"{what} {spec}: {spec.path} defines no '{spec.name}'")
        value = getattr(value, part)
    return value


MAX_STAND_INS = 8  # packages replaced per file (each one a retried import); more is a skip that names the cap


def import_with_stand_ins(code_root: Path, path: str,
                          transform: Optional[Callable[[ast.Module], ast.Module]] = None) -> Union[types.ModuleType, Skip]:
    """``import_file``; a package that is not installed is replaced by a stand-in (gpu_runner.absent) and the
    import retried, so that a file importing torchvision only for its training functions still builds. A file
    that uses the missing package when imported is a Skip naming the package."""

    missing: list[str] = []
    _BARE_PACKAGE_ERRORS.clear()
    while True:
        try:
            with absent.stand_ins(missing):
                module = import_file(code_root, path, raise_missing=True, transform=transform)
        except ModuleNotFoundError as exc:
            name = absent.missing_package(exc) or absent.absent_module(exc.name or "")
            top = name.split(".")[0]
            local = (code_root / top).exists() or (code_root / f"{top}.py").exists()
            if not name or local:
                raise BuildError(f"importing {path} failed: {exc}{_where_in(exc, code_root)}"
                                 f"{_bare_package_cause(exc)}") from exc
            if absent.missing_package(exc) or name in missing:
                return Skip(f"importing {path} needs '{name}', which is not installed on the smoke runner "
                            f"(used when the file is imported{_where_in(exc, code_root)}); install it in the "
                            "runner image")
            if len(missing) >= MAX_STAND_INS:
                return Skip(f"importing {path} needs more packages the smoke runner lacks than the {MAX_STAND_INS} it "
                            f"replaces with stand-ins ({', '.join(repr(m) for m in [*missing, name])}, perhaps more): "
                            f"the cap on stand-ins stopped it, not a use of '{name}'; install them in the runner "
                            "image or name the model's own file")
            missing.append(name)
            continue
        except (Exception, SystemExit) as exc:
            name = absent.missing_package(exc)
            if name:
                return Skip(f"importing {path} needs '{name}', which is not installed on the smoke runner "
                            f"({_one_line_text(exc, 160)}{_where_in(exc, code_root)}); install it in the runner image")
            package_failure = _bare_package_failure(exc)
            if package_failure is not None and package_failure[2]:
                init, failed, missing_name = package_failure
                return Skip(f"importing {path} needs '{missing_name}', which is not installed on the smoke runner: "
                            f"{init} uses it when imported ({failed}), and {path} imports from that package "
                            f"({_one_line_text(exc, 120)}); install it in the runner image")
            raise BuildError(f"importing {path} failed: {type(exc).__name__}: {exc}{_where_in(exc, code_root)}"
                             f"{_bare_package_cause(exc)}") from exc
        if missing:
            _IMPORT_NOTES.append(f"imported {path} with stand-ins for {', '.join(repr(m) for m in missing)}, which "
                                 "the smoke runner does not have (the model never used them)")
        return module


def _bare_package_failure(exc: BaseException) -> Optional[tuple[str, str, Optional[str]]]:
    """For ``cannot import name 'BaseVAE' from 'models'`` after ``models/__init__.py`` failed: (that __init__'s
    path, what it raised, the missing package it used)."""
    text = str(exc)
    for package, (failed, missing) in _BARE_PACKAGE_ERRORS.items():
        if f"'{package}'" in text or f"'{package}." in text:
            return package.replace(".", "/") + "/__init__.py", failed, missing
    return None


def _bare_package_cause(exc: BaseException) -> str:
    found = _bare_package_failure(exc)
    return f"; {found[0]}, which would have provided it, could not be imported: {found[1]}" if found else ""


def load_callable(code_root: Path, reference: str) -> Any:
    """``"models/losses.py:focal"``, ``"models.losses:focal"`` or an installed ``"torch.nn.functional:l1_loss"``."""
    module_part, _, name = str(reference).rpartition(":")
    if not module_part or not name:
        raise BuildError(f"'{reference}' is not 'module.path:callable'")
    local = parse_target_spec(reference)
    if local is not None and (code_root / local.path).is_file():
        value = _load_attribute(code_root, local, "smoke loss")
        if isinstance(value, Skip):
            raise BuildError(value.reason)
        return value
    try:
        value = importlib.import_module(module_part)
        for part in name.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as exc:
        raise BuildError(f"cannot load '{reference}': {exc}") from exc
    return value


# ---- constructing the model ----------------------------------------------------------------------


def _construct(code_root: Path, target: str, config: dict, notes: list[str]) -> Union[tuple[nn.Module, str], Skip]:
    if config.get("factory"):
        spec = parse_target_spec(config["factory"])
        if spec is None or spec.name is None:
            if spec is None:
                raise BuildError(f"smoke factory '{config['factory']}' is not 'path/to/file.py:name'")
            target = str(spec)  # a bare file: pick its model like an unnamed target
        else:
            factory = _load_attribute(code_root, spec, "smoke factory")
            if isinstance(factory, Skip):
                return factory
            model = _call_with_guessed_arguments(factory, str(spec), notes, explicit=True)
            if isinstance(model, Skip):
                return model
            notes.append(f"built by the configured factory {spec}")
            return model, str(spec)
    spec = parse_target_spec(target)
    if spec is None:
        raise BuildError(f"'{target}' is not a smoke target (path/to/file.py[:ClassOrFactory])")
    if spec.name is None:
        chosen = _choose_model_in_file(code_root, spec.path, notes)
        if isinstance(chosen, Skip):
            return chosen
        spec = chosen
    obj = _load_attribute(code_root, spec, "smoke target")
    if isinstance(obj, Skip):
        return obj
    if isinstance(obj, nn.Module):
        return obj, str(spec)
    if not callable(obj):
        return Skip(f"{spec} is a {type(obj).__name__}, neither a module class nor a factory; {CONFIGURE_HINT}")
    is_class = inspect.isclass(obj)
    if is_class and not issubclass(obj, nn.Module):
        return Skip(f"{spec} is not an nn.Module subclass; {CONFIGURE_HINT}")
    if is_class and inspect.isabstract(obj):
        return Skip(f"{spec} is abstract; name a concrete subclass or {CONFIGURE_HINT}")
    site_failures: list[SiteFailure] = []
    if is_class:
        model = _build_as_the_repository_does(code_root, spec, obj, notes, site_failures)
        if model is not None:
            return model, str(spec)
    model = _call_with_guessed_arguments(obj, str(spec), notes, explicit=False)
    if isinstance(model, Skip):
        if is_class and _NOT_GUESSED in model.reason:
            parameterless = _parameterless_with_stand_ins(obj, str(spec))
            if parameterless is not None:
                return parameterless
        skip = _skip_after_sites(model, site_failures, str(spec))
        if is_class and not _names_missing_package(skip.reason):
            parent_notes: list[str] = []
            inside = _build_inside_parent(code_root, spec, obj, parent_notes)
            if inside is not None:
                notes.extend(parent_notes)
                return inside, str(spec)
            if parent_notes:
                return Skip(f"{skip.reason}; {'; '.join(parent_notes)}")
        return skip
    return model, str(spec)


_NOT_GUESSED = "cannot guess constructor argument"


def _parameterless_with_stand_ins(cls: type, label: str) -> Optional[Skip]:
    """The real reason to skip a class whose constructor needs modules or functions it stores and calls
    (``self.features = features`` then ``self.features(nodes)``), which no guess supplies, when the class has
    nothing of its own to train: built with a stand-in without parameters (``nn.Identity``) for each of those
    arguments and the rest guessed, it holds no trainable parameter. None when it has no such argument, does not
    build that way, or does hold parameters (the constructor-argument skip stands)."""
    from gpu_runner import guess

    module = inspect.getmodule(cls)
    try:
        usages = guess.argument_usage(cls.__init__, module, cls)
    except Exception:  # noqa: BLE001 - reading the constructor is a help for the skip reason only
        return None
    called = sorted(name for name, usage in usages.items() if usage.stored_and_called)
    if not called:
        return None
    arguments = _guess_arguments(cls, label, [], module=module, known={name: nn.Identity() for name in called})
    if isinstance(arguments, Skip):
        return None
    built = _call_with_retries(cls, arguments, [], _none_defaults(cls, arguments))
    if not isinstance(built, nn.Module) or any(p.requires_grad for p in built.parameters()):
        return None
    from gpu_runner.checks import registration_result

    if registration_result(built).status == "fail":
        return None  # layers kept in a plain list: its own parameters exist, unregistered (the guess skip stands)
    shown = ", ".join(f"'{name}'" for name in called)
    return Skip(f"{label} has no trainable parameters of its own: it only calls the module or function its caller "
                f"passes as {shown} (built with a stand-in for {'it' if len(called) == 1 else 'them'}, it holds none), "
                "so the smoke checks do not apply; its users are checked where they are models")


@dataclass
class SiteFailure:
    """Why one of the repository's calls of the class did not build it."""

    text: str
    missing_package: Optional[str] = None  # the call raised because this package is not installed


def _skip_after_sites(guessed: Skip, failures: list[SiteFailure], label: str) -> Skip:
    """One cause per skip: a package missing where the repository's own call needs it outranks what guessing
    could not do (installing the package builds the class the repository's way); otherwise the guess's reason,
    with why each of the repository's calls did not build it either."""
    if not failures or _names_missing_package(guessed.reason):
        return guessed
    missing = next((f for f in failures if f.missing_package), None)
    if missing is not None:
        return Skip(f"constructing {label} as the repository does needs '{missing.missing_package}', which is not "
                    f"installed on the smoke runner ({missing.text}); install it in the runner image")
    return Skip(f"{guessed.reason}; the repository's call{'s' * (len(failures) > 1)} did not build it either: "
                f"{'; '.join(f.text for f in failures)}")


def _names_missing_package(reason: str) -> bool:
    return "which is not installed on the smoke runner" in reason


MAX_SITES_TRIED = 3


def _build_as_the_repository_does(code_root: Path, spec: TargetSpec, cls: type, notes: list[str],
                                  failures: list[SiteFailure]) -> Optional[nn.Module]:
    """The class built with the arguments of a call the repository makes (gpu_runner.sites: a training script's
    argparse defaults, a YAML config, a factory's callers), sizes shrunk as for defaults and what no call gives
    guessed. None when no call of the tree can be evaluated or none builds (why, per call, in ``failures``): the
    caller guesses instead."""
    if "." in (spec.name or ""):
        return None
    try:
        found = sites.constructions(code_root, spec.path, spec.name)
    except Exception as exc:  # noqa: BLE001 - reading the tree for call sites is a help, never a reason to skip
        notes.append(f"looking for the repository's calls of {spec.name} failed ({type(exc).__name__}: "
                     f"{_one_line_text(exc, 120)}); its arguments are guessed")
        return None
    module = inspect.getmodule(cls)
    usages: dict = {}
    if found:
        from gpu_runner import guess

        try:
            usages = guess.argument_usage(cls.__init__, module, cls)
        except Exception:  # noqa: BLE001 - sizes are then shrunk by their names only
            usages = {}
    for construction in found[:MAX_SITES_TRIED]:
        site_notes: list[str] = []
        _WIDTHS_SHRUNK.clear()
        given = _materialized(code_root, _bind_site(cls, construction), site_notes)
        if not given:
            continue
        given = {key: _options_compared(value, code_root / spec.path, key, site_notes, usages.get(key))
                 for key, value in given.items()}
        shrunk = {}
        for key, value in given.items():
            smaller = _shrunk_value(key, value, given)
            if smaller != value and _matches(_WIDTH_NAMES, key) and value in _WIDTHS_SHRUNK:
                smaller = _WIDTHS_SHRUNK[value]  # the width a module built in the same call was given
            if smaller == value:
                smaller = _shrunk_free_size(value, usages.get(key))
            shrunk[key] = smaller
            if smaller != value:
                site_notes.append(f"constructor: {key}={_short_repr(smaller)} (the repository's {_short_repr(value)}, "
                                  "shrunk)")
        arguments = _guess_arguments(cls, str(spec), site_notes, module=module, known=shrunk)
        shown = ", ".join(f"{k}={_short_repr(v)}" for k, v in given.items())
        if isinstance(arguments, Skip):
            failures.append(SiteFailure(f"at {construction.where} it gives {shown}, and the rest "
                                        f"{arguments.reason.split(';')[0]}"))
            continue
        marked = {k: Shrunk(v, given[k]) if k in given and shrunk.get(k) is v and v is not given[k] else v
                  for k, v in arguments.items()}
        built = _call_with_retries(cls, marked, site_notes, _none_defaults(cls, arguments))
        if isinstance(built, BaseException):
            failure = f"at {construction.where} ({shown}) it raised {type(built).__name__}: {_one_line_text(built, 160)}"
            failures.append(SiteFailure(failure, absent.missing_package(built)))
            notes.append(f"the repository's call {failure}")
            continue
        origin = f" (values from {', '.join(construction.origins)})" if construction.origins else ""
        notes.append(f"constructor: the arguments of the repository's call at {construction.where}{origin}: {shown}")
        notes.extend(site_notes)
        try:
            defaults = {k: p.default for k, p in inspect.signature(cls).parameters.items() if p.default is not p.empty}
        except (TypeError, ValueError):
            defaults = {}
        _LAST_ARGUMENTS.update({**defaults, **arguments})
        _SITE_INPUTS[:] = [(construction.where, site_input) for site_input in construction.inputs]
        return built
    return None


def _options_compared(value: Any, defining: Path, key: str, notes: list[str], usage: Any = None) -> Any:
    """A namespace a call site passes (a script's argparse options) whose options without a default the class's file
    compares with a constant (``if opt.Stage == "conv":``, the option ``required=True``): each such option set to
    that constant, as a run that passes it gets it (``script_steps._compared_constants``); a number the script
    computes after parsing (``opt.vocab = len(words)``, a ``sites.Typed``) by its name, else as any count; an
    attribute the constructor reads that the script sets only later (``opt.num_class = ...``) guessed by its name.
    Anything else as it is."""
    read = [a for a in (usage.attributes if usage is not None else []) if a not in value] \
        if isinstance(value, sites.AttrDict) else []
    if not isinstance(value, sites.AttrDict) or not (read or any(v is sites.UNKNOWN or isinstance(v, sites.Typed)
                                                                 for v in value.values())):
        return value
    from gpu_runner.script_steps import _compared_constants

    filled = sites.AttrDict(value)
    chosen = []
    for option, given in value.items():
        if given is sites.UNKNOWN and isinstance(option, str):
            constant = _compared_constants(option, defining)
            if constant is not None:
                filled[option] = constant
                chosen.append(f"{option}={constant!r} (the constant its class compares it with)")
        elif isinstance(given, sites.Typed) and isinstance(option, str):
            # ``args.embed_num = len(vocab)`` after parsing: a count the script takes from its data
            made = _typed_value(option, given, [])
            if made is not _NOT_MADE:
                filled[option] = made
                chosen.append(f"{option}={made!r} (the script computes it when it runs)")
    for attribute in read:
        found, guessed = guess_argument(attribute)
        if found:
            filled[attribute] = guessed
            chosen.append(f"{attribute}={guessed!r} (by its name: the script sets it later)")
    if chosen:
        notes.append(f"constructor: {key}'s options without a value: {', '.join(chosen)}")
    return filled


MAX_GRANDPARENTS = 2  # classes building a parent whose own input was not found, tried as parents
MAX_PARENT_DEPTH = 2  # a class built inside a parent built inside its own parent, no deeper
MAX_DATA_FILE_CHOICES = 4  # a parent built from a settings file that holds no instance: the next files, this many in all
PARENTS_TIME_S = 30.0  # no further parent is tried once the ones tried took this long: the target's timeout stays far


def _build_inside_parent(code_root: Path, spec: TargetSpec, cls: type, notes: list[str]) -> Optional[nn.Module]:
    """An instance of ``cls`` as a class of the repository that builds it does (gpu_runner.parents: a ResNet's
    ``_make_layer(Bottleneck, ...)`` with the width it expands to, an encoder's ``EncoderLayer(d_model, heads)``):
    the parent built with the usual machinery (its call sites, guesses, shrinking), the instance taken from its
    modules, and what the parent's forward feeds it recorded in ``_PARENT_INPUTS``. None when no parent builds one
    (why, for each parent tried, in ``notes``; nothing when the repository has no such parent)."""
    if len(_PARENT_CHAIN) >= MAX_PARENT_DEPTH or cls in _PARENT_CHAIN or "." in (spec.name or ""):
        return None
    try:
        candidates = parents.builders(code_root, spec.path, spec.name)
    except Exception:  # noqa: BLE001 - reading the tree for parents is a help, never a reason to skip
        return None
    tried: list[str] = []
    started = time.monotonic()
    fallback: Optional[tuple] = None  # an instance a parent built whose own input was not found
    extended = False
    index = 0
    while index < len(candidates):
        path, name = candidates[index]
        index += 1
        if time.monotonic() - started > PARENTS_TIME_S:
            tried.append(f"{path}:{name} (not tried: the parents before it took over {PARENTS_TIME_S:.0f}s)")
            break
        saved = (dict(_LAST_ARGUMENTS), list(_SITE_INPUTS), list(_PARENT_INPUTS))
        _PARENT_CHAIN.append(cls)
        try:
            found = _capture_in_parent(code_root, TargetSpec(path, name), cls)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the repository's parent code: this parent does not help
            found = f"{type(exc).__name__}: {_one_line_text(exc, 120)}"
        finally:
            _PARENT_CHAIN.pop()
            _LAST_ARGUMENTS.clear()
            _LAST_ARGUMENTS.update(saved[0])
            _SITE_INPUTS[:], _PARENT_INPUTS[:] = saved[1], saved[2]
        if isinstance(found, str):
            tried.append(f"{path}:{name} ({found})")
            continue
        if found[2] is None and not extended:
            # the parent holds one but its own input was not found (a block whose forward takes what its model
            # computes): the classes that build the parent build this one too, and their forward feeds it
            extended = True
            fallback = (path, name, found)
            try:
                grand = [g for g in parents.builders(code_root, path, name) if g not in candidates
                         and g != (spec.path, spec.name)]
            except Exception:  # noqa: BLE001 - reading the tree is a help: the instance without input stands
                grand = []
            if grand:
                candidates = list(candidates) + grand[:MAX_GRANDPARENTS]
                tried.append(f"{path}:{name} ({found[3]})")
                continue
        if found[2] is None and fallback is not None and fallback[2] is not found:
            path, name, found = fallback
        return _taken_from_parent(spec, path, name, found, notes)
    if fallback is not None:  # no grandparent fed it either: the instance its parent built, input inferred alone
        return _taken_from_parent(spec, *fallback, notes)
    if tried:
        notes.append(f"the repository's classes that build {spec.name} did not give one here: {'; '.join(tried)}")
    return None


def _taken_from_parent(spec: TargetSpec, path: str, name: str, found: tuple, notes: list[str]) -> nn.Module:
    """The instance ``found`` (``_capture_in_parent``'s answer for the parent ``path:name``), its constructor
    arguments and the input its parent feeds it recorded for the subject."""
    instance, arguments, plan, how = found
    shown = ", ".join(f"{k}={_short_repr(v)}" for k, v in arguments.items())
    notes.append(f"built inside {name} ({path}) as the repository builds it: {spec.name}({shown}); {how}")
    _LAST_ARGUMENTS.clear()
    _LAST_ARGUMENTS.update(arguments)
    _SITE_INPUTS.clear()
    _PARENT_INPUTS[:] = [(f"{path}:{name}", plan, instance)]
    return instance


_PARENT_CHAIN: list = []  # the classes being built inside parents, outermost first


def _capture_in_parent(code_root: Path, parent: TargetSpec, cls: type) -> Union[str, tuple]:
    """``(instance of cls, its constructor arguments, InputPlan or None, how the input was found)`` from the
    parent built as usual, or why not (a short text)."""
    records: dict[int, dict] = {}
    own_init = cls.__dict__.get("__init__")
    original = cls.__init__

    @functools.wraps(original)  # its signature stays the class's: the parent's own sites may bind to it
    def recording_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if type(self) is cls:
            try:
                bound = inspect.signature(original).bind(self, *args, **kwargs)
                records[id(self)] = dict(list(bound.arguments.items())[1:])
            except TypeError:
                records[id(self)] = {}

    cls.__init__ = recording_init
    saved_choice = _DATA_FILE_CHOICE[0]
    try:
        # a parent built from a settings file may choose another of its classes with the smallest file
        # (``Block = BlockA if h.block == "1" else BlockB``): the next files that fit are tried, in size order
        for choice in range(MAX_DATA_FILE_CHOICES):
            _DATA_FILE_CHOICE[0] = choice
            _DATA_FILE_OFFERED.clear()
            records.clear()
            built = _construct(code_root, str(parent), {}, [])
            if isinstance(built, Skip):
                return built.reason.split(";")[0]
            model = built[0]
            if not isinstance(model, nn.Module):
                return f"it made a {type(model).__name__}"
            instances = [m for m in model.modules() if type(m) is cls and id(m) in records]
            if instances or choice + 1 >= max(_DATA_FILE_OFFERED, default=0):
                break
    finally:
        _DATA_FILE_CHOICE[0] = saved_choice
        if own_init is not None:
            cls.__init__ = own_init
        else:
            del cls.__init__
    if not instances:
        return f"the {parent.name} built here holds no {cls.__name__}"
    plan, how, called = _input_inside_parent(model, instances)
    instance = called or instances[0]
    return instance, records[id(instance)], plan, how


def _input_inside_parent(parent: nn.Module, instances: list) -> tuple[Optional[InputPlan], str, Optional[nn.Module]]:
    """What the parent's forward, on the input inferred for it, feeds the first of ``instances`` it calls: at two
    batch sizes, so that the batch axis of each tensor is the one that follows the parent's batch. (None, why,
    the instance or None) when there is no such input."""
    float_dtype = next((p.dtype for p in parent.parameters() if p.is_floating_point()), torch.float32)
    prober = _Prober(parent, "cpu", float_dtype)
    plan, _ = _input_from_sites(prober, [])
    if plan is None:
        plan, _ = _infer_input(parent, prober, [], _input_hints(parent))
    if plan is None:
        return None, "no input was found for the parent, so its own input is inferred", None
    calls: dict[int, list] = {}

    def recording(module: nn.Module) -> Callable:
        # the instance's own forward wrapped, not a pre-hook: a parent may call ``self.block.forward(x)``
        # directly, which runs no hook
        original = module.forward

        def forward(*args, **kwargs):
            calls.setdefault(id(module), []).append((args, kwargs))
            return original(*args, **kwargs)
        return forward

    own = {id(m): m.__dict__["forward"] for m in instances if "forward" in m.__dict__}
    for m in instances:
        m.forward = recording(m)
    seen: list[tuple] = []
    try:
        for batch in (PROBE_BATCH, SECOND_PROBE_BATCH):
            calls.clear()
            if prober.try_plan(plan, batch) is _FAILED:
                return None, f"the parent's forward failed at batch {batch}, so its own input is inferred", None
            first = next((m for m in instances if id(m) in calls), None)
            if first is None:
                return None, "the parent's forward does not call it, so its own input is inferred", None
            seen.append((first, calls[id(first)][0]))
    finally:
        for m in instances:
            m.__dict__.pop("forward", None)
            if id(m) in own:
                m.forward = own[id(m)]
    (module, (args_a, kwargs_a)), (_, (args_b, kwargs_b)) = seen
    captured = _plan_from_two_calls(module, (args_a, kwargs_a), (args_b, kwargs_b))
    if isinstance(captured, str):
        return None, f"what the parent feeds it is not usable here ({captured}), so its own input is inferred", module
    return captured, f"input: what the parent's forward feeds it ({captured.describe()})", module


BATCH_LIKE_SIZES = (PROBE_BATCH, SECOND_PROBE_BATCH, 1, 8)  # the probes' and the checks' batches (run_checks: 8)


def _plan_from_two_calls(module: nn.Module, first: tuple, second: tuple) -> Union[InputPlan, str]:
    """The InputPlan of one module's inputs seen at batch PROBE_BATCH (``first``) and SECOND_PROBE_BATCH
    (``second``); why not when an input is no tensor, or its batch axis is not the only one that follows the batch."""
    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        parameters = {}

    def spec(a: Any, b: Any, label: str) -> Union[TensorSpec, TupleSpec, str]:
        if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and a and len(a) == len(b):
            items = [spec(x, y, label) for x, y in zip(a, b)]
            bad = next((i for i in items if isinstance(i, str)), None)
            return bad if bad else TupleSpec(tuple(items))
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            return f"{label} is a {type(a).__name__}"
        if a.dim() != b.dim():
            return f"{label} changes rank with the batch"
        moved = [d for d in range(a.dim()) if a.shape[d] != b.shape[d]]
        if not moved and (a.is_floating_point() or a.dtype in (torch.long, torch.bool)):
            # the same shape at both batch sizes: one tensor for the whole batch (a rotary or position table the
            # parent hands every block), fed as captured; not when its first axis could pass for a checks' batch
            # (the checks slice and perturb inputs whose dim 0 is the batch size)
            if a.dim() and a.shape[0] in BATCH_LIKE_SIZES:
                return f"{label} {list(a.shape)} stays the same with the batch, its first axis a batch size"
            return TensorSpec(tuple(a.shape), "float" if a.is_floating_point() else str(a.dtype).replace("torch.", ""),
                              batchless=True, value=a.detach().cpu())
        if len(moved) != 1 or a.shape[moved[0]] != PROBE_BATCH or b.shape[moved[0]] != SECOND_PROBE_BATCH:
            return f"{label} {list(a.shape)} does not follow the batch on one axis"
        axis = moved[0]
        shape = tuple(a.shape[:axis]) + tuple(a.shape[axis + 1:])
        if a.is_floating_point():
            return TensorSpec(shape, batch_axis=axis)
        if a.dtype == torch.bool:
            return TensorSpec(shape, "bool", batch_axis=axis)
        if a.dtype != torch.long or (a.numel() and int(a.min()) < 0):
            return f"{label} is a {a.dtype} tensor"
        high = max(2, int(a.max()) + 1 if a.numel() else 2)
        return TensorSpec(shape, "long", 0, high, batch_axis=axis)

    (args_a, kwargs_a), (args_b, kwargs_b) = first, second
    while args_a and args_a[-1] is None and len(args_a) == len(args_b):  # trailing defaults passed as None
        args_a, args_b = args_a[:-1], args_b[:-1]
    if len(args_a) != len(args_b) or set(kwargs_a) != set(kwargs_b):
        return "the calls differ"
    specs = [spec(a, b, f"argument {i + 1}") for i, (a, b) in enumerate(zip(args_a, args_b))]
    named = []
    for key in kwargs_a:
        if kwargs_a[key] is None and kwargs_b[key] is None and key in parameters \
                and parameters[key].default is None:
            continue
        named.append((key, spec(kwargs_a[key], kwargs_b[key], key)))
    bad = next((s for s in specs + [s for _, s in named] if isinstance(s, str)), None)
    if bad:
        return bad
    if not specs and not named:
        return "it takes no tensor"
    if all(isinstance(s, TensorSpec) and s.batchless for s in specs + [s for _, s in named]):
        return "none of its tensors follows the batch"
    return InputPlan(tuple(specs), tuple(named), source="from the parent's forward")


def _bind_site(cls: type, construction: "sites.Construction") -> dict:
    """The evaluated arguments of ``construction`` by parameter name; {} when the call does not fit the
    signature (another class of the same name)."""
    try:
        parameters = [p for p in inspect.signature(cls).parameters.values()]
    except (TypeError, ValueError):
        return {}
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    accepts_any_keyword = any(p.kind == p.VAR_KEYWORD for p in parameters)
    named = {p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY)}
    if len(construction.positional) > len(positional) and not any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return {}
    given: dict = {}
    for parameter, value in zip(positional, construction.positional):
        if value is not sites.UNKNOWN and not (value is None and parameter.default is parameter.empty):
            given[parameter.name] = value
    for key, value in construction.keywords.items():
        if key not in named and not accepts_any_keyword:
            return {}
        if value is not sites.UNKNOWN and value is not None:
            given[key] = value
    return given


MAX_NESTED_INSTANCES = 3  # DDPM(eps_model=UNet(...)) built inside a site's arguments, this deep


def _materialized(code_root: Path, given: dict, notes: list[str], depth: int = 0) -> dict:
    """``given`` with the repository's own classes and objects made real: a ``sites.ClassRef`` imported, a
    ``sites.Instance`` (a module or a dataclass config the repository builds to pass on) constructed with its
    evaluated arguments, shrunk, the rest guessed. A value that cannot be made is left out (then guessed)."""
    made = {}
    for key, value in given.items():
        real = _made_value(code_root, key, value, notes, depth)
        if real is not _NOT_MADE:
            made[key] = real
    return made


_NOT_MADE = object()


def library_object(ref: "sites.LibraryRef") -> Any:
    """The object a ``sites.LibraryRef`` names (``torch.nn.BatchNorm2d``), imported from the longest importable
    module prefix; _NOT_MADE when a part is missing or the library is not one the builder may import."""
    parts = ref.dotted.split(".")
    if parts[0] not in sites.IMPORTABLE_LIBRARIES:
        return _NOT_MADE
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                found = getattr(found, attribute)
        except AttributeError:
            return _NOT_MADE
        return found
    return _NOT_MADE
_WIDTHS_SHRUNK: dict = {}  # in the call being built: a repository width -> what it was shrunk to, the first time


def _made_value(code_root: Path, key: str, value: Any, notes: list[str], depth: int) -> Any:
    if isinstance(value, (list, tuple)):
        items = [_made_value(code_root, key, v, notes, depth) for v in value]
        return _NOT_MADE if any(i is _NOT_MADE for i in items) else type(value)(items)
    if isinstance(value, sites.Typed):  # a count the name says: as a value the site does not give, guessed with
        # the rest; one whose name the guess table does not know: any count builds (the number of classes of the
        # labels a script loads, ``nb_classes = labels.shape[1]``)
        return _typed_value(key, value, notes) if value.kind != "count" or not guess_argument(key)[0] else _NOT_MADE
    if isinstance(value, sites.ClassRef):
        loaded = _load_attribute(code_root, TargetSpec(value.path, value.name), "class")
        return _NOT_MADE if isinstance(loaded, Skip) else loaded
    if isinstance(value, sites.LibraryRef):
        return library_object(value)
    if not isinstance(value, sites.Instance):
        return value
    cls = _made_value(code_root, key, value.cls, notes, depth)
    if depth >= MAX_NESTED_INSTANCES or not inspect.isclass(cls) \
            or not (issubclass(cls, nn.Module) or dataclasses.is_dataclass(cls)):
        return _NOT_MADE
    label = f"{value.cls.path}:{value.cls.name}"
    inner_notes: list[str] = []
    given = _materialized(code_root, _bind_site(cls, value), inner_notes, depth + 1)
    known = {k: _shrunk_value(k, v, given) for k, v in given.items()}
    for k, v in given.items():  # one repository width, one shrunk width across the call (d_model of a layer and
        if known[k] != v and _matches(_WIDTH_NAMES, k) and isinstance(v, int):  # of the attention it is handed)
            known[k] = _WIDTHS_SHRUNK.setdefault(v, known[k])
    arguments = _guess_arguments(cls, label, inner_notes, module=inspect.getmodule(cls), known=known)
    if isinstance(arguments, Skip):
        notes.append(f"constructor: {key} is the repository's {value.cls.name}(...), which could not be built here "
                     f"({arguments.reason.split(';')[0]})")
        return _NOT_MADE
    built = _call_with_retries(cls, arguments, inner_notes, _none_defaults(cls, arguments))
    if isinstance(built, BaseException):
        notes.append(f"constructor: {key} is the repository's {value.cls.name}(...), which raised "
                     f"{type(built).__name__}: {_one_line_text(built, 120)}")
        return _NOT_MADE
    shown = ", ".join(f"{k}={_short_repr(v)}" for k, v in arguments.items())
    notes.append(f"constructor: {key}={value.cls.name}({shown}), as the repository builds it")
    return built


COUNT_GUESS = 10  # a count the repository takes from its data when it runs (``len(vocab)``) and the name does not say


def _typed_value(key: str, value: "sites.Typed", notes: list[str]) -> Any:
    """A number the repository computes when it runs, of the type its code says: by the name when the guess table
    knows it with that type; a float 1.0; a count (``len(labels)``, positive: any size builds) COUNT_GUESS."""
    found, guessed = guess_argument(key)
    if found and (type(guessed).__name__ == value.kind or (value.kind == "count" and type(guessed) is int
                                                         and guessed > 0)):
        return guessed
    if value.kind == "float":
        notes.append(f"constructor: {key}=1.0 guessed (the repository passes a float it computes when it runs)")
        return 1.0
    if value.kind == "count":
        notes.append(f"constructor: {key}={COUNT_GUESS} guessed (the repository passes the length of something it "
                     "loads when it runs)")
        return COUNT_GUESS
    return _NOT_MADE


def _shrunk_value(name: str, value: Any, others: dict) -> Any:
    """``_shrunk`` for a value the repository passes; a configuration read from a file is shrunk field by
    field (a copy: the repository's own object is not changed)."""
    if isinstance(value, sites.AttrDict):
        return sites.AttrDict({k: _shrunk_value(str(k), v, value) for k, v in value.items()})
    return _shrunk(name, value, others)


def _choose_model_in_file(code_root: Path, path: str, notes: list[str]) -> Union[TargetSpec, Skip]:
    """For a target naming only a file: its factory function, its only module class, or the one module
    class that no other module class of the file uses."""
    file_path = code_root / path
    if not file_path.is_file():
        return Skip(f"smoke target {path} does not exist in the pull request's code")
    source = file_path.read_text(errors="replace")
    tree = ast.parse(source)
    functions = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for factory in FACTORY_NAMES:
        if factory in functions:
            notes.append(f"used the factory {factory}() that {path} defines")
            return TargetSpec(path, factory)
    classes = [t.name for t in find_targets({path: source}, {path: None}) if "." not in t.name]
    if not classes:
        return Skip(f"{path} defines no nn.Module subclass and no {FACTORY_NAMES[0]}(); name one with {path}:Name")
    if len(classes) == 1:
        return TargetSpec(path, classes[0])
    used = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in classes:
            used |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id != node.name}
    roots = [c for c in classes if c not in used]
    if len(roots) == 1:
        notes.append(f"picked {roots[0]}, the module class of {path} that no other one uses")
        return TargetSpec(path, roots[0])
    candidates = roots or classes
    return Skip(f"{path} defines several models ({', '.join(candidates)}); name one, e.g. {path}:{candidates[0]}")


_ARGUMENT_GUESSES: list[tuple[str, Any]] = [
    (r"in_channels|in_chans|in_ch|input_channels|num_channels|n_channels|channels|channel|image_channels|"
     r"img_channels|in_c|input_nc|nc", 3),
    (r"in_planes|inplanes|planes|out_planes|mid_channels|inner_channels|ngf|ndf|nf|base_filters|init_features", 16),
    (r"out_channels|out_ch|base_channels|base_width|num_filters|n_filters|filters|out_c|dim_out|oup", 16),
    (r"in_features|in_dim|input_dim|input_size|input_features|d_in|n_inputs|num_inputs|in_size|n_in|num_features|"
     r"n_features|feature_dim|features|obs_dim|state_dim|nfeat|n_feat|in_feats|nz|ninput|dim_in|inp", 16),
    (r"hidden_dims|hidden_sizes|hidden_layers|layer_sizes|widths", [32, 32]),
    (r"dim_feedforward|d_ff|ff_dim|ffn_dim|mlp_dim|intermediate_size|d_inner|ffn_hidden", 64),
    (r"hidden|hidden_dim|hidden_size|hidden_features|hidden_channels|hidden_units|n_hidden|num_hidden|nhid|hid_dim|"
     r"d_hidden|d_model|embed_dim|emb_dim|embedding_dim|embedding_size|n_embd|n_embed|dim|width|latent_dim|"
     r"latent_size|model_dim|z_dim|noise_dim|ninp|ndim|dims|d_embed|embed_size|emb_size|n_hid|nhidden|"
     r"decoder_embed_dim|out_dim_hidden|bottleneck_dim|hidden_feats", 32),
    (r"num_classes|n_classes|nclasses|out_features|output_dim|output_size|out_dim|out_size|num_labels|n_labels|"
     r"n_outputs|num_outputs|d_out|n_out|action_dim|num_actions|n_actions|nclass|n_class|out_feats", 10),
    (r"vocab_size|num_embeddings|n_tokens|ntoken|ntokens|n_vocab|num_tokens|vocab|vocab_len", 100),
    (r"num_layers|n_layers|n_layer|nlayers|depth|depths|num_blocks|n_blocks|num_hidden_layers|num_encoder_layers|"
     r"num_decoder_layers|cls_depth|encoder_depth|decoder_depth|layers", 2),
    (r"num_heads|nhead|nheads|n_heads|n_head|heads|num_attention_heads|attention_heads|layer_heads|"
     r"decoder_num_heads", 4),
    (r"num_kv_heads|n_kv_heads|num_key_value_heads", 2),
    (r"head_dim|head_size|d_head|d_k|d_v|dim_head", 8),
    (r"dropout|p|drop|drop_rate|dropout_rate|dropout_p|p_drop|attn_dropout|attn_drop|proj_drop|drop_prob|"
     r"embd_pdrop|resid_pdrop|attn_pdrop|emb_dropout|dropout_prob|drop_path|drop_path_rate|ff_dropout|"
     r"attn_dropout_rate|embed_dropout|dropout_rate_attn", 0.1),
    (r"max_len|seq_len|block_size|context_length|max_seq_len|max_length|max_position_embeddings|n_positions|"
     r"seq_length|n_ctx|context_size|max_seq_length|max_positions", SEQUENCE_LENGTH),
    (r"kernel_size|kernel|ksize", 3),
    (r"stride", 1),
    (r"padding", 1),
    (r"image_size|img_size|input_resolution|resolution", 32),
    (r"patch_size|patch", 4),
    (r"num_experts|n_experts", 4),
    (r"num_hierarchies|num_stages|n_stages|num_levels|n_levels|num_scales|n_scales", 2),
    (r"block_repeats|repeats|num_repeats|n_repeats", 2),
    (r"top_k|topk", 2),
    (r"eps|layer_norm_eps|norm_eps|epsilon", 1e-5),
    (r"groups|num_groups", 1),
    (r"expansion|expand_ratio|mlp_ratio|expansion_factor|mlp_mult|ff_mult|mult", 4),
    (r"upscale_factor|scale_factor|upscale|scale|upsample_factor|downsample|downsample_factor|reduction_factor", 2),
    (r"growth_rate|growth", 12),
    (r"reduction|compression|split_ratio|ratio", 0.5),
    (r"fmap_size|feature_map_size|feature_size|map_size", 8),  # the side of a feature map a block is built for
    (r"pool|pooling", "cls"),
    (r"rnn_type|cell_type|rnn_cell", "LSTM"),
    (r"activation|act|nonlinearity", "relu"),
    (r"window_size", 4),
    (r"bias|batch_first", True),
]
_NAMES_TO_GUESS = [(re.compile(f"(?:{pattern})", re.IGNORECASE), value) for pattern, value in _ARGUMENT_GUESSES]


def _name_suffixes(name: str) -> list[str]:
    """``name`` and its shorter ``_``-separated tails, longest first: ``sm_enc_mlp_dim`` -> ``enc_mlp_dim``,
    ``mlp_dim``, ``dim`` (a prefixed argument means what its tail means: CrossViT's ``sm_dim``, ``lg_dim``); a count
    named thing-first is also tried count-first (``layer_num`` as ``num_layers``)."""
    parts = name.split("_")
    tails = ["_".join(parts[i:]) for i in range(len(parts)) if parts[i]]
    named = []
    for tail in tails:
        named.append(tail)
        counted = _COUNT_LAST.fullmatch(tail)
        if counted:  # a count named thing-first means what its count-first name means: class_num as num_classes
            named += [f"num_{counted.group(1)}{plural}" for plural in ("s", "es", "")]
        elif _COUNT_FIRST_SINGULAR.fullmatch(tail):  # and one named in the singular its plural: num_class
            named += [f"{tail}{plural}" for plural in ("s", "es")]
    return named


_COUNT_LAST = re.compile(r"([a-z][a-z0-9]*)_(?:num|number|count|cnt)", re.I)
_COUNT_FIRST_SINGULAR = re.compile(r"(?:num|number|n)_[a-z][a-z0-9]*", re.I)


def _matches(pattern: "re.Pattern", name: str) -> bool:
    """Whether ``name``'s most specific known tail (see _name_suffixes) is one ``pattern`` names."""
    for suffix in _name_suffixes(name):
        if any(p.fullmatch(suffix) for p, _ in _NAMES_TO_GUESS) or pattern.fullmatch(suffix):
            return bool(pattern.fullmatch(suffix))
    return False


def guess_argument(name: str, annotation: Any = inspect.Parameter.empty) -> tuple[bool, Any]:
    """(found, value) for a required constructor argument, by its name, else by its most specific known tail
    (``sm_dim`` as ``dim``; ``action_num`` as ``num_actions``), and its annotation for lists/bools."""
    for suffix in _name_suffixes(name):
        found, value = _guess_by_name(suffix, annotation)
        if found:
            return found, value
    if annotation is bool:
        return True, False
    return False, None


def _guess_by_name(name: str, annotation: Any) -> tuple[bool, Any]:
    for pattern, value in _NAMES_TO_GUESS:
        if pattern.fullmatch(name):
            origin = typing.get_origin(annotation)
            if isinstance(value, list) and annotation is int:
                value = value[0]
            elif not isinstance(value, list) and (annotation in (list, tuple) or origin in (list, tuple)):
                value = [value, value]
            elif annotation is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            return True, value
    return False, None


_DEPTH_NAMES = re.compile(r"num_layers|n_layers?|nlayers|depths?|layers|num_blocks|n_blocks|num_hidden_layers|"
                          r"num_encoder_layers|num_decoder_layers|cls_depth|encoder_depth|decoder_depth|"
                          r"block_repeats|repeats|num_repeats|n_repeats", re.I)
_WIDTH_NAMES = re.compile(r"embed_dim|d_model|n_embd|hidden_size|hidden_dim|dim|width|model_dim|emb_dim|"
                          r"decoder_embed_dim|embedding_dim", re.I)
_HEADS_NAMES = re.compile(r"num_heads|nhead|nheads|n_heads?|heads|num_attention_heads|decoder_num_heads", re.I)
_FF_NAMES = re.compile(r"dim_feedforward|d_ff|ff_dim|ffn_dim|mlp_dim|intermediate_size|d_inner", re.I)
_HEAD_WIDTH_NAMES = re.compile(r"head_dim|head_size|d_head|dim_head|d_k|d_v", re.I)
_IMAGE_NAMES = re.compile(r"image_size|img_size", re.I)
# attention windows (Swin, CrossFormer, Twins' local_patch_size and global_k): every stage's map must be a multiple
# of its window, so windows of 7 force 224x224 images; windows of 4 let 128x128 do
_WINDOW_NAMES = re.compile(r"window_size|window|win_size|local_window_size|global_window_size|local_patch_size|"
                           r"global_k|wsz", re.I)
SHRUNK_WINDOW = 4
_PATCH_NAMES = re.compile(r"patch_size|patch", re.I)
WIDTH_WITHOUT_HEADS = 96  # divisible by 1, 2, 3, 4, 6, 8, 12, 16, 24, 32: whatever head count a default has
SHRUNK_IMAGE_SIDE = 64
MAX_CONFIG_RETRIES = 30


def _shrunk(name: str, value: Any, others: dict) -> Any:
    """A smaller value for a size argument left at a large default: depth 2 (per stage for a tuple); widths of 8
    per head (the heads keep dividing the width); feed-forward widths 64; 16 per attention head; attention windows
    4; images 64 pixels wide when the patch sizes divide 64. A prefixed name counts as its tail (``lg_enc_depth`` as ``depth``). Anything else
    unchanged."""
    if isinstance(value, (tuple, list)) and value and _matches(_DEPTH_NAMES, name) \
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return type(value)(min(v, 2) for v in value)  # blocks per stage: (2, 2, 8, 2) -> (2, 2, 2, 2)
    if isinstance(value, (tuple, list)) and value and _matches(_WINDOW_NAMES, name) \
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return type(value)(min(v, SHRUNK_WINDOW) for v in value)
    if isinstance(value, bool) or not isinstance(value, int):
        return value
    if _matches(_DEPTH_NAMES, name) and value > 2:
        return 2
    if _matches(_WIDTH_NAMES, name) and value > 128:
        heads = next((v for k, v in others.items() if _matches(_HEADS_NAMES, k) and isinstance(v, int)
                      and not isinstance(v, bool) and v > 0), None)
        return heads * 8 if heads else WIDTH_WITHOUT_HEADS
    if _matches(_WINDOW_NAMES, name) and value > SHRUNK_WINDOW:
        return SHRUNK_WINDOW
    if _matches(_FF_NAMES, name) and value > 256:
        return 64
    if _matches(_HEAD_WIDTH_NAMES, name) and value > 16:
        return 16
    if _IMAGE_NAMES.fullmatch(name) and value > SHRUNK_IMAGE_SIDE:
        patches = [v for k, v in others.items() if _matches(_PATCH_NAMES, k) and isinstance(v, int)
                   and not isinstance(v, bool) and v > 0]
        if all(SHRUNK_IMAGE_SIDE % patch == 0 for patch in patches):
            return SHRUNK_IMAGE_SIDE
    return value


FREE_SIZE_LIMIT = 2048
SHRUNK_FREE_SIZE = 256


def _shrunk_free_size(value: Any, usage: Any) -> Any:
    """A smaller value for a size the constructor only gives a layer as a free size (a Linear's or a
    convolution's output width, an Embedding's number of rows; ``guess.Usage.free_size``), whatever its name:
    a head of 65,536 outputs, a vocabulary of 50,000 tokens, shrunk to 256 (nothing else's shape depends on
    it). Anything else unchanged."""
    if usage is not None and usage.free_size and isinstance(value, int) and not isinstance(value, bool) \
            and value > FREE_SIZE_LIMIT:
        return SHRUNK_FREE_SIZE
    return _shrunk_loop_count(value, usage)


def _shrunk_loop_count(value: Any, usage: Any) -> Any:
    """A count that only sets how many times a forward loops (``guess.Usage.loop_floor``: a recurrence run ``t``
    times, a number of refinement iterations), whatever its name, at the smallest value that keeps the loop's
    body running: the model's shapes and parameters stay, its forward costs a fraction. Anything else unchanged."""
    floor = getattr(usage, "loop_floor", None)
    if floor is not None and isinstance(value, int) and not isinstance(value, bool) and value > floor:
        return floor
    return value


def _image_side_for_patches(side: int, others: dict) -> int:
    """The smallest multiple of every patch size among ``others`` that is at least ``side`` (CrossViT's
    patches of 12 and 16 pixels: 48)."""
    patches = [v for k, v in others.items() if _matches(_PATCH_NAMES, k) and isinstance(v, int)
               and not isinstance(v, bool) and v > 0]
    step = math.lcm(*patches) if patches else 1
    return step * math.ceil(side / step)


def _call_with_guessed_arguments(fn: Callable, label: str, notes: list[str], *, explicit: bool):
    """Call ``fn`` with its defaults and its required arguments guessed (by name, then from how the constructor
    uses them: gpu_runner.guess). A config object missing an attribute gets it guessed and the call is retried;
    a constructor that rejects the guesses gets its sequence arguments at other lengths; a class that still
    cannot be built is made by the module's own factory (``ResNet18()``) when it has one. A factory that raises
    with no guessed arguments is a real error (BuildError); a guess that fails is a Skip."""
    from gpu_runner import guess

    module = inspect.getmodule(fn)
    guessed_notes: list[str] = []
    arguments = _guess_arguments(fn, label, guessed_notes, module=module)
    failure: Optional[str] = None
    if isinstance(arguments, Skip):
        failure = arguments.reason
    else:
        forwarded = _forwarded_shrinks(fn, module, arguments, guessed_notes)
        built = _call_with_retries(fn, {**_marked_shrunk_defaults(fn, arguments), **forwarded}, guessed_notes,
                                   _none_defaults(fn, arguments))
        if isinstance(built, BaseException) and forwarded:  # the callee did not take them after all
            retried = _call_with_retries(fn, arguments, guessed_notes, _none_defaults(fn, arguments))
            if not isinstance(retried, BaseException):
                built = retried
                guessed_notes[:] = [n for n in guessed_notes if "handed on through **kwargs" not in n]
            forwarded = {}
        arguments = {**arguments, **forwarded}
        if not isinstance(built, BaseException):
            notes.extend(guessed_notes)
            try:
                defaults = {k: p.default for k, p in inspect.signature(fn).parameters.items()
                            if p.default is not p.empty}
            except (TypeError, ValueError):
                defaults = {}
            _LAST_ARGUMENTS.update({**defaults, **arguments})
            return built
        exc = built
        detail = f"{type(exc).__name__}: {exc}"
        if absent.missing_package(exc):
            return Skip(f"constructing {label} needs '{absent.missing_package(exc)}', which is not installed on the "
                        f"smoke runner ({_one_line_text(exc, 160)}); install it in the runner image")
        if out_of_memory(exc):
            return Skip(f"constructing {label} {OUT_OF_MEMORY_REASON}: {_one_line_text(exc, 160)}")
        bug = known_bug(exc)
        if bug is not None:
            return Skip(f"{label} cannot be built: {bug} ({detail})")
        if explicit and not arguments:
            raise BuildError(f"the smoke factory {label}() raised {detail}") from exc
        shown = ", ".join(f"{k}={_short_repr(v)}" for k, v in arguments.items())
        failure = f"constructing {label}({shown}) raised {detail}; configure smoke.targets with a factory"
    if inspect.isclass(fn) and module is not None:
        for factory in guess.module_factories(module, fn):
            try:
                model = factory()
            except (Exception, SystemExit):  # noqa: BLE001 - the next factory, or the skip
                continue
            notes.append(f"built by {factory.__name__}(), the module's own factory of {fn.__name__} "
                         f"({failure.split(';')[0]})")
            return model
    return Skip(failure)


def _forwarded_shrinks(fn: Callable, module: Any, arguments: dict, notes: list[str]) -> dict:
    """Smaller values for the large defaults of what ``fn`` hands its ``**kwargs`` on to (CCT passes them to
    its TransformerClassifier, whose ``num_layers=12`` no argument of CCT names): depth 2, narrow widths, as for
    ``fn``'s own defaults."""
    from gpu_runner import guess

    init = fn.__init__ if inspect.isclass(fn) else fn
    try:
        own = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}
    shrunk: dict[str, Any] = {}
    for target, explicit in guess.forwarded_keyword_targets(init, module):
        try:
            parameters = inspect.signature(target).parameters.values()
        except (TypeError, ValueError):
            continue
        defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
        for key, value in defaults.items():
            if key in own or key in explicit or key in shrunk or key in arguments:
                continue
            smaller = _shrunk(key, value, {**defaults, **arguments, **shrunk})
            if smaller is not value and smaller != value:
                shrunk[key] = smaller
    if shrunk:
        notes.append("constructor: " + ", ".join(f"{k}={v!r}" for k, v in shrunk.items())
                     + " (defaults of what it hands on through **kwargs, shrunk)")
    return shrunk


def _one_line_text(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _short_repr(value: Any) -> str:
    if inspect.isclass(value):
        return value.__name__
    if isinstance(value, types.SimpleNamespace) or dataclasses.is_dataclass(value) or hasattr(value, "__dict__") \
            and not isinstance(value, (int, float, str, list, tuple, dict)):
        return f"{type(value).__name__}(...)"
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


_MISSING_ATTRIBUTE = re.compile(r"object has no attribute '(\w+)'")


def _none_defaults(fn: Callable, arguments: dict) -> dict:
    """Guesses for the arguments that default to None (``depth=None`` that the constructor then asserts on)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return {}
    found = {}
    for parameter in parameters:
        if parameter.default is None and parameter.name not in arguments:
            known, value = guess_argument(parameter.name)
            if known:
                found[parameter.name] = value
    return found


def _call_with_retries(fn: Callable, arguments: dict, notes: list[str], none_defaults: Optional[dict] = None) -> Any:
    """``fn(**arguments)``; a config object we made that lacks an attribute gets it (guessed by name) and the
    call is retried; then, on any other error, variants: string fields of a config set to None (a preset name
    next to explicit sizes), sequence arguments at lengths 2 and 4, and the sizes we shrank at their own values
    (a depth the constructor wants of the form 6n+2). Returns the model or the first exception."""
    configs = {name: value for name, value in arguments.items() if getattr(value, "_torchreview_made", False)
               or isinstance(value, types.SimpleNamespace)}
    first_error: Optional[BaseException] = None
    unshrunk = {k: v.original for k, v in arguments.items() if isinstance(v, Shrunk)}
    arguments = {k: v.value if isinstance(v, Shrunk) else v for k, v in arguments.items()}

    def variants() -> Iterator[dict]:  # lazily: a config variant holds only while it is being tried
        yield from _variants(arguments, configs)
        if none_defaults:
            yield {**arguments, **none_defaults}
        if unshrunk:
            yield {**arguments, **unshrunk}
        if _network_unreachable(first_error):
            yield from _offline_variants(fn, arguments)

    for variant in variants():
        for _ in range(MAX_CONFIG_RETRIES):
            try:
                model = fn(**variant)
                if variant is not arguments and none_defaults and all(variant.get(k) is v for k, v in none_defaults.items()):
                    notes.append("constructor: " + ", ".join(f"{k}={v!r}" for k, v in none_defaults.items())
                                 + " guessed for arguments that default to None")
                offline = [k for k, v in variant.items()
                           if v is False and arguments.get(k, _flag_default(fn, k)) is True]
                if offline:
                    notes.append(f"constructor: {offline[0]}=False (with True the constructor reached for the network, "
                                 "which the runner does not have: pretrained weights, a download)")
                if unshrunk and all(variant.get(k) is v for k, v in unshrunk.items()):
                    notes.append("constructor: " + ", ".join(f"{k}={_short_repr(v)}" for k, v in unshrunk.items())
                                 + " not shrunk: the constructor rejected the smaller values")
                return model
            except AttributeError as exc:
                missing = _MISSING_ATTRIBUTE.search(str(exc))
                config = next((c for c in variant.values() if any(c is m for m in configs.values())
                               and missing and type(c).__name__ in str(exc)), None)
                if config is None or missing is None:
                    first_error = first_error or exc
                    break
                found, value = guess_argument(missing.group(1))
                if not found:
                    first_error = first_error or exc
                    break
                setattr(config, missing.group(1), value)
                notes.append(f"constructor: config.{missing.group(1)}={value!r} guessed")
            except Exception as exc:  # noqa: BLE001 - the PR's constructor can raise anything
                first_error = first_error or exc
                break
            except SystemExit as exc:  # a factory that exits on a value it does not know (``sys.exit()``)
                first_error = first_error or RuntimeError(f"{fn.__name__} exited (SystemExit: {exc.code})")
                break
    return first_error


def _network_unreachable(exc: Optional[BaseException]) -> bool:
    """``exc`` (or what caused it) is the network refusing: no name resolution, no route, a refused connection
    (the sandbox has no network), not a missing file."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, (urllib.error.URLError, ConnectionError, socket.gaierror, socket.timeout)) \
                or any(t.__name__ in ("MaxRetryError", "NewConnectionError", "ConnectTimeout")
                       for t in type(exc).__mro__):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _flag_default(fn: Callable, name: str) -> Any:
    try:
        parameter = inspect.signature(fn).parameters.get(name)
    except (TypeError, ValueError):
        return None
    return None if parameter is None or parameter.default is parameter.empty else parameter.default


def _offline_variants(fn: Callable, arguments: dict) -> Iterator[dict]:
    """After a call failed on the network: the call with one flag that is True (given, or by default) set to
    False, one flag at a time (``pretrained=True`` downloads weights; the flag's name is not looked at)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    for name, parameter in parameters.items():
        if arguments.get(name, parameter.default) is True:
            yield {**arguments, name: False}


def _marked_shrunk_defaults(fn: Callable, arguments: dict) -> dict:
    """``arguments`` with each size shrunk from its default marked ``Shrunk`` (the default restorable)."""
    try:
        defaults = {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}
    except (TypeError, ValueError):
        return arguments
    return {k: Shrunk(v, defaults[k]) if k in defaults and isinstance(v, (int, float, tuple, list))
            and isinstance(defaults[k], type(v)) and v != defaults[k] else v for k, v in arguments.items()}


@dataclass(frozen=True)
class Shrunk:
    """An argument given smaller than its own value, which a retry may restore (``_call_with_retries``)."""

    value: Any
    original: Any


def _variants(arguments: dict, configs: dict) -> Iterator[dict]:
    yield arguments
    for name, config in configs.items():
        strings = {k: v for k, v in guess_config_fields(config).items() if isinstance(v, str)}
        if strings:
            for key in strings:
                setattr(config, key, None)
            yield arguments
            for key, value in strings.items():
                setattr(config, key, value)
    sequences = {k: v for k, v in arguments.items() if isinstance(v, tuple) and v and len(set(map(type, v))) == 1}
    for length in (2, 4):
        if sequences:
            yield {**arguments, **{k: tuple(v[:1]) * length for k, v in sequences.items()}}


def guess_config_fields(config: Any) -> dict:
    from gpu_runner.guess import config_attributes

    return config_attributes(config)


def _make_config(parameter: str, owner: Any, module: Any, usage: Any, label: str, notes: list[str]) -> Union[Any, Skip]:
    """A config object for ``parameter``: ``get_default_config()`` or a config class of the module (its None
    fields guessed by name, its sizes shrunk), else a namespace of the attributes the constructor reads."""
    from gpu_runner import guess

    owner_class = owner if inspect.isclass(owner) else None
    for how, make in (guess.config_candidates(owner_class, module) if owner_class is not None and module else []):
        try:
            config = make()
        except Exception:  # noqa: BLE001
            continue
        fields = guess.config_attributes(config)
        if not fields:
            continue
        changed = []
        for key, value in fields.items():
            if value is None:
                found, guessed = guess_argument(key)
                if found:
                    _set(config, key, guessed)
                    changed.append(f"{key}={guessed!r}")
            else:
                found, guessed = guess_argument(key)
                smaller = _shrunk(key, value, fields)
                if found and isinstance(value, int) and not isinstance(value, bool) and isinstance(guessed, int) \
                        and guessed < value:
                    smaller = guessed  # sizes from the guess table: vocab 100, block_size 16, n_embd 32...
                if smaller != value:
                    _set(config, key, smaller)
                    changed.append(f"{key}={smaller!r}")
        try:
            config._torchreview_made = True
        except Exception:  # noqa: BLE001 - frozen or slotted: no retries on it
            pass
        notes.append(f"constructor: {parameter}={how}" + (f" with {', '.join(changed)}" if changed else ""))
        return config
    attributes = usage.attributes if usage is not None else []
    repository_options = _repository_options(attributes, notes, parameter)
    if repository_options is not None:
        return repository_options
    read_statically = _config_class_fields(module, attributes, notes, parameter)
    if read_statically is not None:
        return read_statically
    from_file = _data_file_section(attributes, notes, f"{parameter}=")
    if from_file is not None:
        return types.SimpleNamespace(**from_file)
    namespace = types.SimpleNamespace()
    for attribute in attributes:
        found, value = guess_argument(attribute)
        if not found:
            return Skip(f"cannot guess constructor argument '{parameter}' of {label}: a config object whose "
                        f"'{attribute}' is not a known name; configure smoke.targets with a factory")
        setattr(namespace, attribute, value)
    notes.append(f"constructor: {parameter}=SimpleNamespace({', '.join(f'{k}={v!r}' for k, v in vars(namespace).items())})"
                 " from the attributes the constructor reads")
    return namespace


def _repository_options(attributes: list[str], notes: list[str], parameter: str) -> Optional[types.SimpleNamespace]:
    """The argparse defaults of the repository's script whose options include every attribute the constructor
    reads of its config (``configs.pred_len``, ``configs.enc_in``: the namespace ``run.py`` hands the model),
    sizes shrunk and options without a default guessed by name; None when no script defines them all."""
    if not attributes or not _CODE_ROOT:
        return None
    try:
        candidates = sites.argparse_namespaces(_CODE_ROOT[0])
    except Exception:  # noqa: BLE001 - reading the tree is a help, never a reason to skip
        return None
    from gpu_runner.script_steps import _compared_constants

    for where, options in sorted(candidates, key=lambda c: -sum(a in c[1] for a in attributes)):
        if not all(a in options for a in attributes):
            break
        values, compared = {}, []
        for key, value in options.items():
            if isinstance(value, sites.LibraryRef):
                value = library_object(value)
                value = sites.UNKNOWN if value is _NOT_MADE else value
            if value is sites.UNKNOWN:
                found, value = guess_argument(key)
                if not found and key in attributes:
                    # an option without a default that the code compares with a constant (``args.net ==
                    # "vgg16"`` in the factory that reads it): that constant, as a script's run gets it
                    value = _compared_constants(key, _CODE_ROOT[0] / where)
                    if value is None:
                        break
                    compared.append(f"{key}={value!r}")
                elif not found:
                    continue
            values[key] = _shrunk_value(key, value, options)
        else:
            notes.append(f"constructor: {parameter}=the argparse defaults of {where} (its options include all "
                         f"{len(attributes)} the constructor reads)"
                         + (f"; without a default, {', '.join(compared)}: a value the code compares it with"
                            if compared else ""))
            return types.SimpleNamespace(**values)
    return None


def _config_class_fields(module: Any, attributes: list[str], notes: list[str],
                         parameter: str) -> Optional[types.SimpleNamespace]:
    """A config object read from a configuration class of the module (or one it imports from the code tree) whose
    constructor needs arguments (a dataset folder, an embedding file): the fields its constructor assigns, evaluated
    statically (``sites.constructor_fields``), None fields and zero sizes set at run time (``n_vocab = 0``) guessed
    by name, sizes shrunk. Only a class that gives every attribute the model's constructor reads, by value or by a
    name the guess table knows; None when there is none."""
    from gpu_runner import guess

    if not attributes or not _CODE_ROOT or module is None:
        return None
    code_root = _CODE_ROOT[0]
    best: Optional[tuple[int, str, dict]] = None
    for value in list(vars(module).values()):
        if not inspect.isclass(value) or not any(w in value.__name__.lower() for w in guess._CONFIG_CLASS_WORDS):
            continue
        try:
            source = Path(inspect.getsourcefile(value) or "").resolve()
            relative = source.relative_to(code_root).as_posix()
            required = [p for p in inspect.signature(value).parameters.values()
                        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        except (TypeError, ValueError, OSError):
            continue
        if not required:
            continue  # made by calling it (guess.config_candidates)
        try:
            fields = sites.constructor_fields(code_root, relative, value.__name__)
        except Exception:  # noqa: BLE001 - reading the tree is a help, never a reason to skip
            continue
        covered = sum(a in fields or guess_argument(a)[0] for a in attributes)
        if covered == len(attributes) and (best is None or len(fields) > len(best[2])):
            best = (covered, f"{relative}:{value.__name__}", fields)
    if best is None:
        return None
    where, fields = best[1], best[2]
    values, guessed = {}, []
    for key, value in fields.items():
        if isinstance(value, sites.LibraryRef):
            value = library_object(value)
            if value is _NOT_MADE:
                continue
        if value is sites.RUN_DEVICE:
            values[key] = torch.device(_BUILD_DEVICE[0] if _BUILD_DEVICE else "cpu")
            continue
        found, by_name = guess_argument(key)
        if found and (value is None or (type(value) is int and value == 0 and type(by_name) is int and by_name > 0)):
            value = by_name
            guessed.append(f"{key}={by_name!r}")
        values[key] = _shrunk_value(key, value, fields)
    for attribute in attributes:
        if attribute not in values:
            values[attribute] = guess_argument(attribute)[1]
            guessed.append(f"{attribute}={values[attribute]!r}")
    notes.append(f"constructor: {parameter}=the fields {where}'s constructor assigns, read statically"
                 + (f"; guessed by name {', '.join(guessed)}" if guessed else ""))
    return types.SimpleNamespace(**values)


def _data_file_section(names: list[str], notes: list[str], what: str) -> Optional[dict]:
    """The values of a mapping of the repository's YAML / JSON files that holds every one of ``names``
    (``sites.data_file_sections``: the configuration a script reads from a file its command line names), sizes
    shrunk; None when no file has one."""
    if not _CODE_ROOT:
        return None
    try:
        sections = sites.data_file_sections(_CODE_ROOT[0], names)
    except Exception:  # noqa: BLE001 - reading the tree is a help, never a reason to skip
        return None
    if not sections:
        return None
    _DATA_FILE_OFFERED.append(len(sections))
    choice = min(_DATA_FILE_CHOICE[0], len(sections) - 1)
    where, section = sections[choice]
    values = {str(k): _shrunk_value(str(k), v, section) for k, v in section.items()}
    others = (f" (the smallest of {len(sections)} that hold them)" if choice == 0 else
              f" (number {choice + 1} by size of {len(sections)} that hold them)") if len(sections) > 1 else ""
    notes.append(f"constructor: {what}the mapping in {where}{others}, which holds all {len(set(names))} names the "
                 "constructor needs (a configuration file the command line names)")
    return values


def _set(config: Any, key: str, value: Any) -> None:
    try:
        setattr(config, key, value)
    except Exception:  # noqa: BLE001 - frozen dataclass
        object.__setattr__(config, key, value)


def _guess_arguments(fn: Callable, label: str, notes: list[str], depth: int = 0,
                     module: Any = None, known: Optional[dict] = None, from_data_file: bool = False
                     ) -> Union[dict, Skip]:
    """Arguments for ``fn``: ``known`` ones as given, defaults (shrunk), the rest guessed; when one cannot be, a
    mapping of the repository's data files that holds every required one (``_data_file_section``)."""
    from gpu_runner import guess

    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return {}
    init = fn.__init__ if inspect.isclass(fn) else fn
    try:
        hints = typing.get_type_hints(init)
    except Exception:
        hints = {}
    usages = guess.argument_usage(init, module, fn if inspect.isclass(fn) else None) if module is not None else {}
    known = known or {}
    arguments: dict[str, Any] = dict(known)
    defaults = {p.name: p.default for p in signature.parameters.values() if p.default is not p.empty}
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) or parameter.name in known:
            continue
        if parameter.default is not parameter.empty:
            smaller = _shrunk(parameter.name, parameter.default, {**defaults, **arguments})
            if smaller == parameter.default:
                smaller = _shrunk_free_size(parameter.default, usages.get(parameter.name))
            if smaller is not parameter.default and smaller != parameter.default:
                arguments[parameter.name] = smaller
                notes.append(f"constructor: {parameter.name}={smaller!r} (default {parameter.default!r}, shrunk)")
            continue
        annotation = hints.get(parameter.name, parameter.annotation)
        usage = usages.get(parameter.name)
        if dataclasses.is_dataclass(annotation) and isinstance(annotation, type) and depth == 0:
            fields = _guess_arguments(annotation, annotation.__name__, notes, depth + 1)
            if isinstance(fields, Skip):
                return fields
            arguments[parameter.name] = annotation(**fields)
            how = "with the guesses above" if fields else "with its defaults"
            notes.append(f"constructor: {parameter.name}={annotation.__name__}(...) {how}")
            continue
        found, value = guess_argument(parameter.name, annotation)
        if found and usage is not None and usage.stored_and_called and not callable(value):
            found = False  # stored and called as a module (`self.features(x)`): a size from its name cannot be
        if found and _IMAGE_NAMES.fullmatch(parameter.name) and isinstance(value, int):
            value = _image_side_for_patches(value, {**defaults, **arguments})
        length = guess.sequence_length(usage) if usage is not None else None
        if found and usage is not None and usage.choices and value not in usage.choices:
            found, value = True, usage.choices[0]
        elif found and length and not isinstance(value, (list, tuple)):
            element = 1 if _matches(_DEPTH_NAMES, parameter.name) else value
            value = tuple([element] * length)
        elif found and length and isinstance(value, list):
            value = tuple((value * length)[:length])
        if not found and parameter.name.lower() == "device":
            # where the model runs, which the code chooses when it runs (``torch.device("cuda" if ... )``): the runner's
            found, value = True, torch.device(_BUILD_DEVICE[0] if _BUILD_DEVICE else "cpu")
        if not found and usage is not None and module is not None:
            if usage.called and inspect.isclass(fn):
                sibling = guess.sibling_class(usage, module, nn.Module, fn)
                if sibling is not None:
                    found, value = True, sibling
            elif usage.dict_keys:
                found, value = True, usage.dict_keys[0]
            elif usage.choices:
                found, value = True, usage.choices[0]
            elif (usage.attributes or parameter.name.lower() in guess.CONFIG_NAMES) and not usage.called:
                config = _make_config(parameter.name, fn, module, usage, label, notes)
                if isinstance(config, Skip):
                    return config
                arguments[parameter.name] = config
                continue
        if not found and not from_data_file:
            # ``Net(**cfg["net"])`` with the file the command line names: a mapping of the repository's data files
            # that holds every required argument gives them all, so that they fit one another
            required = [p.name for p in signature.parameters.values() if p.default is p.empty
                        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in known]
            section = _data_file_section(required, notes, "")
            if section is not None:
                return _guess_arguments(fn, label, notes, depth, module,
                                        {**known, **{k: section[k] for k in required}}, from_data_file=True)
        if not found:
            return Skip(f"{_NOT_GUESSED} '{parameter.name}' of {label}; "
                        "configure smoke.targets with a factory")
        arguments[parameter.name] = value
        notes.append(f"constructor: {parameter.name}={_short_repr(value)} guessed")
    return arguments


# ---- tensors and inputs --------------------------------------------------------------------------

_DTYPES = {"float": torch.float32, "float32": torch.float32, "float16": torch.float16, "half": torch.float16,
           "bfloat16": torch.bfloat16, "float64": torch.float64, "double": torch.float64,
           "long": torch.long, "int64": torch.long, "int": torch.long, "int32": torch.int32, "bool": torch.bool}


@dataclass(frozen=True)
class TensorSpec:
    """One input tensor, described without its batch axis."""

    shape: tuple[int, ...]
    dtype: str = "float"  # float (the model's parameter dtype), long, bool, or an explicit torch dtype name
    low: int = 0  # integer tensors: values in [low, high)
    high: int = 2
    fill: Optional[float] = None  # a constant tensor (masks) instead of random values
    batch_axis: int = 0  # 1 for sequence-first RNN / Transformer inputs
    is_target: bool = False  # fed to a forward(x, targets) parameter, not an input of the model
    adjacency: bool = False  # [B, B]: the rows of the batch are the nodes of one graph
    lengths: bool = False  # [B] sequence lengths for pack_padded_sequence: sorted, longest first, on the CPU
    columns: bool = False  # ids of categorical features, one per column into its own table: not a sequence
    # the same tensor whatever the batch (a rotary table, positions a parent hands every block): ``value`` as it was
    # captured, ``shape`` its whole shape; never compared or hashed (plans stay comparable)
    batchless: bool = False
    value: Any = dataclasses.field(default=None, compare=False, hash=False, repr=False)

    def batched_shape(self, batch_size: int) -> list[int]:
        if self.batchless:
            return list(self.shape)
        if self.adjacency:
            return [batch_size, batch_size]
        if self.lengths:
            return [batch_size, *self.shape]  # [B], or [B, 1] where the forward squeezes it
        shape = list(self.shape)
        shape.insert(self.batch_axis, batch_size)
        return shape

    def make(self, batch_size: int, generator: torch.Generator, float_dtype: torch.dtype, device: str) -> torch.Tensor:
        shape = self.batched_shape(batch_size)
        dtype = float_dtype if self.dtype == "float" else _DTYPES[self.dtype]
        if self.batchless and self.value is not None:
            return self.value.detach().clone().to(device=device, dtype=dtype)
        if self.adjacency:  # a random symmetric graph with self-loops, rows normalised (as GCNs expect)
            edges = torch.rand(shape, generator=generator) < 0.3
            edges = edges | edges.T | torch.eye(shape[0], dtype=torch.bool)
            tensor = (edges.float() / edges.sum(dim=1, keepdim=True)).to(dtype)
        elif self.lengths:  # pack_padded_sequence takes lengths on the CPU, longest first by default
            lengths = torch.randint(1, SEQUENCE_LENGTH + 1, shape, generator=generator)
            lengths[0] = SEQUENCE_LENGTH
            return lengths.sort(dim=0, descending=True).values
        elif self.fill is not None:
            tensor = torch.full(shape, self.fill, dtype=dtype)
        elif dtype.is_floating_point:
            tensor = torch.randn(shape, generator=generator).to(dtype)
        elif dtype == torch.bool:
            tensor = torch.rand(shape, generator=generator) < 0.5
        else:
            tensor = torch.randint(self.low, self.high, shape, generator=generator, dtype=dtype)
        return tensor.to(device)

    def describe(self) -> str:
        if self.adjacency:
            return "float [B, B] adjacency (the batch rows are one graph's nodes)"
        if self.lengths:
            return (f"long [{', '.join(['B', *map(str, self.shape)])}] sequence lengths in [1, {SEQUENCE_LENGTH}], "
                    "longest first, on the CPU")
        dims = [str(d) for d in self.shape]
        if not self.batchless:
            dims.insert(self.batch_axis, "B")
        text = f"{self.dtype} [{', '.join(dims)}]" + (" (one for the whole batch)" if self.batchless else "")
        if self.fill is not None:
            return text + f" filled with {self.fill:g}"
        if self.dtype in ("long", "int64", "int", "int32"):
            return text + f" in [{self.low}, {self.high})"
        return text


@dataclass(frozen=True)
class TupleSpec:
    """A tuple of tensors passed as one argument: an RNN's hidden state ``(h, c)``."""

    items: tuple[TensorSpec, ...]
    dtype: str = "tuple"  # never token ids, a target or a graph: the attributes plans look at
    shape: tuple = ()
    fill: Optional[float] = None
    is_target: bool = False
    adjacency: bool = False
    lengths: bool = False

    def make(self, batch_size: int, generator: torch.Generator, float_dtype: torch.dtype, device: str) -> tuple:
        return tuple(item.make(batch_size, generator, float_dtype, device) for item in self.items)

    def describe(self) -> str:
        return "(" + ", ".join(item.describe() for item in self.items) + ")"


@dataclass(frozen=True)
class InputPlan:
    """How to call the model: positional and keyword input tensors."""

    args: tuple[Union[TensorSpec, TupleSpec], ...]
    kwargs: tuple[tuple[str, Union[TensorSpec, TupleSpec]], ...] = ()
    source: str = ""  # how it was found, for the notes

    def make(self, batch_size: int, generator: torch.Generator, float_dtype: torch.dtype, device: str):
        args = tuple(spec.make(batch_size, generator, float_dtype, device) for spec in self.args)
        kwargs = {name: spec.make(batch_size, generator, float_dtype, device) for name, spec in self.kwargs}
        return args, kwargs

    def all_specs(self) -> list[TensorSpec]:
        specs = list(self.args) + [spec for _, spec in self.kwargs]
        return [item for spec in specs for item in (spec.items if isinstance(spec, TupleSpec) else (spec,))]

    def batch_first(self) -> bool:
        return all(spec.batch_axis == 0 or spec.adjacency for spec in self.all_specs())

    def is_graph(self) -> bool:
        return any(s.adjacency for s in self.all_specs())

    def has_token_inputs(self) -> bool:
        return any(s.dtype == "long" and s.fill is None and not s.is_target and s.shape and not s.batchless
                   for s in self.all_specs())

    def describe(self) -> str:
        parts = [spec.describe() for spec in self.args] + [f"{name}={spec.describe()}" for name, spec in self.kwargs]
        return ", ".join(parts)

    def key(self) -> tuple:
        return self.args, self.kwargs


def _spec_from_config(entry: dict) -> Union[TensorSpec, TupleSpec]:
    if entry.get("tuple") is not None:
        return TupleSpec(tuple(_spec_from_config(item) for item in entry["tuple"]))
    dtype = str(entry.get("dtype", "float32")).replace("torch.", "")
    if dtype not in _DTYPES:
        raise BuildError(f"smoke input dtype '{dtype}' is not one of {', '.join(sorted(_DTYPES))}")
    dtype = "float" if dtype in ("float", "float32") else ("long" if dtype in ("long", "int64", "int") else dtype)
    shape = tuple(int(d) for d in entry.get("shape") or ())
    return TensorSpec(shape=shape, dtype=dtype, low=int(entry.get("low", 0)), high=int(entry.get("high", 2)),
                      fill=entry.get("fill"), batch_axis=int(entry.get("batch_axis", 0)))


def _plan_from_config(entry: Union[dict, list]) -> InputPlan:
    entries = entry if isinstance(entry, list) else [entry]
    args, kwargs = [], []
    for item in entries:
        if not isinstance(item, dict):
            raise BuildError(f"smoke input entries are mappings with a shape, got {item!r}")
        spec = _spec_from_config(item)
        if item.get("name"):
            kwargs.append((str(item["name"]), spec))
        else:
            args.append(spec)
    return InputPlan(tuple(args), tuple(kwargs), source="configured")


def _plan_from_example(example: Any) -> Optional[InputPlan]:
    """A Lightning-style ``example_input_array``: its first axis is the batch."""

    def spec_of(tensor: torch.Tensor) -> Optional[TensorSpec]:
        if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
            return None
        if tensor.is_floating_point():
            return TensorSpec(tuple(tensor.shape[1:]))
        if tensor.dtype == torch.bool:
            return TensorSpec(tuple(tensor.shape[1:]), "bool")
        high = int(tensor.max().item()) + 1 if tensor.numel() else 2
        return TensorSpec(tuple(tensor.shape[1:]), "long", 0, max(high, 2))

    if isinstance(example, dict):
        kwargs = tuple((str(k), spec_of(v)) for k, v in example.items())
        return InputPlan((), kwargs, "example_input_array") if all(s for _, s in kwargs) else None
    items = example if isinstance(example, (tuple, list)) else (example,)
    specs = tuple(spec_of(t) for t in items)
    return InputPlan(specs, (), "example_input_array") if specs and all(specs) else None


# ---- inferring the input -------------------------------------------------------------------------

_TOKEN_NAMES = re.compile(r"input_ids|ids|x_ids|idx|tokens?|token_ids|src_tokens|tgt_tokens|src_ids|text|words")
_MASK_NAMES = re.compile(r"(attention_|attn_)?mask|\w*_mask")
_PADDING_MASK_NAMES = re.compile(r"\w*padding_mask")
_NON_TOKEN_EMBEDDINGS = re.compile(r"pos|wpe|type|segment|time", re.IGNORECASE)
_TARGET_NAMES = re.compile(r"targets?|labels?|y_true|gold")
_HIDDEN_NAMES = re.compile(r"hidden|hx|h0|h_0|hc|hidden_state|hidden_states|state|states|hiddens")
_ADJACENCY_NAMES = re.compile(r"adj|adj_mat|adj_matrix|adjacency|adjacency_matrix|a_hat|adj_norm|norm_adj|graph")
_SEQUENCE_LAYERS = (nn.RNNBase, nn.TransformerEncoder, nn.TransformerEncoderLayer, nn.TransformerDecoder,
                    nn.TransformerDecoderLayer, nn.MultiheadAttention)
_ENTRY_LAYERS = (nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd, nn.Embedding, nn.EmbeddingBag, nn.LayerNorm,
                 nn.modules.batchnorm._BatchNorm) + _SEQUENCE_LAYERS


def _common_shapes(token_high: int) -> list[TensorSpec]:
    """The last resort. Token ids stay below every embedding's size: an out-of-range id on a GPU is a
    device-side assert that ruins the whole process, not an exception."""
    return [TensorSpec((3, 32, 32)), TensorSpec((1, 28, 28)), TensorSpec((16,)), TensorSpec((784,)),
            TensorSpec((SEQUENCE_LENGTH,), "long", 0, token_high), TensorSpec((SEQUENCE_LENGTH, 16)),
            TensorSpec((3, 64, 64)), TensorSpec((1, 32, 32)), TensorSpec((32,)), TensorSpec((3, 128, 128)),
            TensorSpec((3, 224, 224)),
            TensorSpec((1, 64)), TensorSpec((10,)), TensorSpec((8,), "long", 0, token_high)]


@dataclass
class _ForwardParameter:
    name: str
    role: str  # input | tokens | mask | padding_mask | target | adjacency | hidden
    keyword: bool  # passed by keyword (optional or keyword-only)


def _forward_parameters(model: nn.Module) -> list[_ForwardParameter]:
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return [_ForwardParameter("input", "input", False)]
    found = []
    for p in parameters:
        if p.kind == p.VAR_KEYWORD:
            continue
        if p.kind == p.VAR_POSITIONAL:
            if not found:
                found.append(_ForwardParameter(p.name, "input", False))
            continue
        name = p.name.lower()
        optional = p.default is not p.empty
        if _PADDING_MASK_NAMES.fullmatch(name):
            role = "padding_mask"
        elif _MASK_NAMES.fullmatch(name):
            role = "mask"
        elif _TARGET_NAMES.fullmatch(name):
            role = "target"
        elif _ADJACENCY_NAMES.fullmatch(name):
            role = "adjacency"
        elif _TOKEN_NAMES.fullmatch(name):
            role = "tokens"
        elif _HIDDEN_NAMES.fullmatch(name) and found:
            role = "hidden"
        else:
            role = "input"
        if optional and role not in ("mask", "padding_mask"):
            continue  # optional extras (labels=None, cache=None...) keep their defaults
        found.append(_ForwardParameter(p.name, role, optional or p.kind == p.KEYWORD_ONLY))
    return found


def _entry_layers(model: nn.Module) -> list[nn.Module]:
    """Layers that could consume an input, in registration order, not descending into one found."""
    found: list[nn.Module] = []
    inside: set[str] = set()
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in inside):
            continue
        if isinstance(module, _ENTRY_LAYERS):
            found.append(module)
            inside.add(name)
            if name == "":
                break
    return found


def _sequence_layer_width(layer: nn.Module) -> tuple[int, bool]:
    """(feature width, batch_first) of a recurrent or attention layer."""
    if isinstance(layer, nn.RNNBase):
        return layer.input_size, layer.batch_first
    attention = layer
    if isinstance(layer, (nn.TransformerEncoder, nn.TransformerDecoder)):
        attention = layer.layers[0].self_attn
    elif isinstance(layer, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
        attention = layer.self_attn
    return attention.embed_dim, attention.batch_first


def specs_for_layer(layer: nn.Module, as_tokens: bool = False) -> list[TensorSpec]:
    """Inputs the layer would accept as the first thing it sees, most likely first."""
    T = SEQUENCE_LENGTH
    if isinstance(layer, (nn.Embedding, nn.EmbeddingBag)):
        return [TensorSpec((T,), "long", 0, layer.num_embeddings)]
    if isinstance(layer, _SEQUENCE_LAYERS):
        width, batch_first = _sequence_layer_width(layer)
        return [TensorSpec((T, width), batch_axis=0 if batch_first else 1)]
    if as_tokens:
        return []
    if isinstance(layer, (nn.Linear, nn.Bilinear)):
        width = layer.in_features if isinstance(layer, nn.Linear) else layer.in1_features
        if not width:  # a Lazy layer
            return []
        specs = [TensorSpec((width,)), TensorSpec((T, width))]
        for channels in (1, 3):  # an image flattened by the forward: 784 = 1x28x28, 3072 = 3x32x32
            side = math.isqrt(width // channels) if width % channels == 0 else 0
            if side > 1 and channels * side * side == width:
                specs.append(TensorSpec((channels, side, side)))
        return specs
    if isinstance(layer, nn.modules.conv._ConvNd):
        c = layer.in_channels
        if not c:
            return []
        spatial = {1: [(32,), (64,), (128,)], 2: [(32, 32), (28, 28), (64, 64), (128, 128), (224, 224)],
                   3: [(8, 16, 16), (16, 32, 32)]}[len(layer.kernel_size)]
        return [TensorSpec((c,) + size) for size in spatial]
    if isinstance(layer, nn.LayerNorm):
        shape = tuple(layer.normalized_shape)
        return [TensorSpec((T,) + shape), TensorSpec(shape)]
    if isinstance(layer, nn.modules.batchnorm._BatchNorm):
        c = layer.num_features
        if isinstance(layer, nn.BatchNorm1d):
            return [TensorSpec((c,)), TensorSpec((c, 32))]
        return [TensorSpec((c, 32, 32))] if isinstance(layer, nn.BatchNorm2d) else [TensorSpec((c, 8, 16, 16))]
    return []


def _specs_from_fx(model: nn.Module) -> dict[str, list[TensorSpec]]:
    """Per forward parameter, specs from the first layer its value reaches in a ``torch.fx`` trace."""
    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception:
        return {}
    modules = dict(model.named_modules())
    found: dict[str, list[TensorSpec]] = {}
    for placeholder in (n for n in graph.nodes if n.op == "placeholder"):
        queue, seen = list(placeholder.users), set()
        while queue:
            node = queue.pop(0)
            if node in seen:
                continue
            seen.add(node)
            module = modules.get(node.target) if node.op == "call_module" else None
            specs = specs_for_layer(module) if module is not None else []
            if specs:
                found[placeholder.target.lstrip("*")] = specs
                break
            queue.extend(node.users)
    return found


class _Failed:
    pass


_FAILED = _Failed()


_ELEMENTWISE = frozenset({"add", "sub", "mul", "div", "true_divide", "addcmul", "addcdiv", "where", "maximum",
                          "minimum", "pow", "sub_", "add_", "mul_", "div_", "truediv", "radd", "rsub", "rmul",
                          "rtruediv", "iadd", "isub", "imul", "itruediv"})


class _BroadcastWatch(torch.overrides.TorchFunctionMode):
    """Notices an elementwise operation in which a parameter makes a tensor computed from the input bigger
    (``x * self.g`` with x [B, 1, H, W] and g [1, 32, 1, 1] gives [B, 32, H, W]): an input that "works" only
    because the parameters broadcast it, not because it has the shape the model was written for."""

    def __init__(self, inputs: list, parameter_names: dict):
        super().__init__()
        self.parameter_names = parameter_names  # id(parameter) -> name
        self.derived: dict[int, Any] = {}  # id -> weak reference: tensors computed from the input
        self.found: Optional[str] = None
        self.broadcast_shape: Optional[tuple] = None  # the shape the parameter broadcast it to
        for tensor in inputs:
            self._mark(tensor)

    def _mark(self, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self.derived[id(value)] = _weak(value)
        elif isinstance(value, (tuple, list)):
            for item in value:
                self._mark(item)

    def _is_derived(self, value: Any) -> bool:
        ref = self.derived.get(id(value)) if isinstance(value, torch.Tensor) else None
        return ref is not None and ref() is value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        operands = list(args) + list((kwargs or {}).values())
        if any(self._is_derived(a) for a in _flat(operands)):
            self._mark(result)
            name = getattr(func, "__name__", "").strip("_")
            if self.found is None and name in _ELEMENTWISE and isinstance(result, torch.Tensor):
                self._look(operands, result)
        return result

    def _look(self, operands: list, result: torch.Tensor) -> None:
        parameters = [a for a in operands if isinstance(a, torch.Tensor) and id(a) in self.parameter_names]
        computed = [a for a in operands if self._is_derived(a)]
        for parameter in parameters:
            for tensor in computed:
                if tensor.numel() < result.numel() and parameter.numel() > 1:
                    self.found = (f"the parameter {self.parameter_names[id(parameter)]} "
                                  f"{list(parameter.shape)} broadcasts a tensor computed from the input from "
                                  f"{list(tensor.shape)} to {list(result.shape)}")
                    self.broadcast_shape = tuple(result.shape)
                    return


def _weak(tensor: torch.Tensor):
    import weakref

    return weakref.ref(tensor)


def _flat(values: Any) -> Iterator[Any]:
    for value in values:
        if isinstance(value, (tuple, list)):
            yield from _flat(value)
        else:
            yield value


# What torch raises when code asks for a GPU the machine does not have.
_NO_CUDA = re.compile(r"not compiled with CUDA enabled|Found no NVIDIA driver|no CUDA GPUs are available|"
                      r"CUDA driver initialization failed|torch\.cuda\.is_available\(\) is False")


class _Prober:
    """Runs the model on candidate inputs without changing its state (buffers are restored)."""

    def __init__(self, model: nn.Module, device: str, float_dtype: torch.dtype):
        self.model, self.device, self.float_dtype = model, device, float_dtype
        self.tried = 0
        self.first_error: Optional[str] = None
        self.last_error: Optional[str] = None
        self.missing_package: Optional[str] = None  # a package the forward used that the runner lacks
        self.needs_cuda: Optional[str] = None  # the error of a forward that moved tensors to a GPU there is not
        self.broadcast: Optional[str] = None  # how the parameters broadcast the last input (watch_broadcast)
        self.broadcast_shape: Optional[tuple] = None

    def last_operation(self, plan: InputPlan, select: Callable[[Any], Any]) -> str:
        """The operation that made the selected output (its autograd node, without "Backward"), lower case: "sigmoid",
        "addmm", ...; "" when the forward fails or the output has no graph."""
        generator = torch.Generator().manual_seed(0)
        buffers = {name: b.detach().clone() for name, b in self.model.named_buffers()}
        try:
            args, kwargs = plan.make(PROBE_BATCH, generator, self.float_dtype, self.device)
            with torch.enable_grad():
                node = getattr(select(self.model(*args, **kwargs)), "grad_fn", None)
        except (Exception, SystemExit):  # noqa: BLE001 - the PR's forward: the plain objective then
            return ""
        finally:
            self.model.zero_grad(set_to_none=True)
            with torch.no_grad():
                for name, buffer in self.model.named_buffers():
                    if name in buffers and buffer.shape == buffers[name].shape:
                        buffer.copy_(buffers[name])
        return re.sub(r"Backward\d*$", "", type(node).__name__).lower() if node is not None else ""

    def try_plan(self, plan: InputPlan, batch_size: int = PROBE_BATCH, watch_broadcast: bool = False) -> Any:
        """The model's output on ``plan``, or _FAILED. With ``watch_broadcast``, ``self.broadcast`` says how the
        parameters broadcast the input, when they do (None otherwise)."""
        self.tried += 1
        self.broadcast = None
        generator = torch.Generator().manual_seed(0)
        buffers = {name: b.detach().clone() for name, b in self.model.named_buffers()}
        try:
            args, kwargs = plan.make(batch_size, generator, self.float_dtype, self.device)
            with torch.no_grad():
                if not watch_broadcast:
                    return self.model(*args, **kwargs)
                names = {id(p): name for name, p in self.model.named_parameters()}
                with _BroadcastWatch(list(args) + list(kwargs.values()), names) as watch:
                    output = self.model(*args, **kwargs)
                self.broadcast, self.broadcast_shape = watch.found, watch.broadcast_shape
                if self.broadcast is None and not plan.is_graph():
                    self.broadcast = self._batch_on_two_axes(plan, output, batch_size)
                return output
        except (Exception, SystemExit) as exc:
            self.missing_package = self.missing_package or absent.missing_package(exc)
            if self.needs_cuda is None and not torch.cuda.is_available() and _NO_CUDA.search(str(exc)):
                self.needs_cuda = f"{type(exc).__name__}: {_one_line_text(exc, 120)}"
            self.last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            self.first_error = self.first_error or self.last_error
            return _FAILED
        finally:
            with torch.no_grad():
                for name, buffer in self.model.named_buffers():
                    if name in buffers and buffer.shape == buffers[name].shape:
                        buffer.copy_(buffers[name])

    def _batch_on_two_axes(self, plan: InputPlan, output: Any, batch_size: int) -> Optional[str]:
        """Why the output says the input has a shape the model was not written for: two of its axes grow with the
        batch (``context.view(b, -1, d) + x`` with x [B, d] gives [B, B, d]: the batch combined with itself, where a
        [B, L, d] input gives [B, L, d]); None when one axis at most does (graphs, whose nodes are the batch, aside).
        Every tensor of the output counts: attention weights returned beside the attended values show it as well."""
        firsts = [t for t in _flat([output]) if isinstance(t, torch.Tensor)]
        suspects = [i for i, t in enumerate(firsts) if sum(size == batch_size for size in t.shape) >= 2]
        if not suspects or batch_size == SECOND_PROBE_BATCH:
            return None
        generator = torch.Generator().manual_seed(0)
        try:
            args, kwargs = plan.make(SECOND_PROBE_BATCH, generator, self.float_dtype, self.device)
            with torch.no_grad():
                seconds = [t for t in _flat([self.model(*args, **kwargs)]) if isinstance(t, torch.Tensor)]
        except (Exception, SystemExit):  # noqa: BLE001 - the PR's forward: the first answer stands
            return None
        if len(seconds) != len(firsts):
            return None
        for index in suspects:
            first, second = firsts[index], seconds[index]
            if second.dim() != first.dim():
                continue
            growing = [axis for axis, (a, b) in enumerate(zip(first.shape, second.shape))
                       if a == batch_size and b == SECOND_PROBE_BATCH]
            if len(growing) >= 2:
                which = "output" if len(firsts) == 1 else f"output's tensor {index + 1}"
                return (f"the {which} {list(first.shape)} has the batch on axes {growing[0]} and {growing[1]}: the "
                        "input's batch is combined with itself, a shape the model was not written for")
        return None


def _infer_input(model: nn.Module, prober: _Prober, notes: list[str],
                 hints: Optional[dict] = None) -> tuple[Optional[InputPlan], Any]:
    example = getattr(model, "example_input_array", None)
    if example is not None:
        plan = _plan_from_example(example)
        if plan is not None:
            output = prober.try_plan(plan)
            if output is not _FAILED:
                notes.append(f"input from example_input_array: {plan.describe()}")
                return plan, output
    seen: set = set()
    broadcast: Optional[tuple[InputPlan, Any, str, int]] = None  # the first input that only worked by broadcasting
    for plan in _with_broadcast_shapes(_candidate_plans(model, hints), prober):
        if plan.key() in seen:
            continue
        if len(seen) >= MAX_PROBES or (broadcast is not None and len(seen) >= broadcast[3] + MAX_PROBES_AFTER_BROADCAST):
            break
        seen.add(plan.key())
        output = prober.try_plan(plan, watch_broadcast=True)
        if output is _FAILED:
            continue
        if prober.broadcast is not None:
            broadcast = broadcast or (plan, output, prober.broadcast, len(seen))
            continue
        if broadcast is not None:
            notes.append(f"rejected the input {broadcast[0].describe()}: {broadcast[2]}")
        notes.append(f"input inferred {plan.source}: {plan.describe()}")
        return plan, output
    if broadcast is not None:  # nothing else works: maybe the model is written that way
        notes.append(f"input inferred {broadcast[0].source}: {broadcast[0].describe()} ({broadcast[2]}; no other "
                     "input worked)")
        return broadcast[0], broadcast[1]
    return None, None


def _input_from_parent(prober: "_Prober", notes: list[str]) -> tuple[Optional[InputPlan], Any]:
    """The input the parent the model was built inside fed it (``_PARENT_INPUTS``); (None, None) when there is
    none or the model alone rejects it (then inferred as usual: never a failure)."""
    for where, plan, instance in _PARENT_INPUTS:
        if plan is None or instance is not prober.model:  # fed to another instance (an earlier target's)
            continue
        output = prober.try_plan(plan)
        if output is not _FAILED:
            notes.append(f"input from what {where} feeds it: {plan.describe()}")
            return plan, output
        notes.append(f"the input {where} feeds it ({plan.describe()}) failed here alone: {prober.last_error}")
    return None, None


MAX_CHILD_DEPTH = 2  # a wrapper of a wrapper: its input read from the submodule two levels down, no deeper


def _input_from_children(model: nn.Module, prober: "_Prober", notes: list[str],
                         depth: int = 0) -> tuple[Optional[InputPlan], Any]:
    """When no input was found for the model itself: each forward parameter it hands as it is to a submodule
    (``forward_body.parameters_handed_to_children``: ``self.encoder(x)``, each discriminator of a list it loops
    over) given the input found for that submodule at that position, inferred as for any model. Every parameter
    the forward needs must be handed on so; (None, None) otherwise or when the model rejects the result."""
    from gpu_runner import forward_body

    try:
        handed = forward_body.parameters_handed_to_children(model)
    except Exception:  # noqa: BLE001 - reading the forward is a help, never a reason to skip
        return None, None
    parameters = _forward_parameters(model)
    if not parameters or not handed or any(p.name not in handed or p.keyword for p in parameters):
        return None, None
    plans: dict[int, Optional[InputPlan]] = {}
    args = []
    for parameter in parameters:
        child, position = handed[parameter.name]
        if id(child) not in plans:
            child_prober = _Prober(child, prober.device, prober.float_dtype)
            child_plan, _ = _infer_input(child, child_prober, [], _input_hints(child))
            if child_plan is None and depth + 1 < MAX_CHILD_DEPTH:
                child_plan, _ = _input_from_children(child, child_prober, [], depth + 1)
            plans[id(child)] = child_plan
        child_plan = plans[id(child)]
        if child_plan is None or position >= len(child_plan.args):
            return None, None
        args.append(child_plan.args[position])
    plan = InputPlan(tuple(args), source="from the submodules the forward hands its inputs to")
    output = prober.try_plan(plan)
    if output is _FAILED:
        notes.append(f"the input the submodules take ({plan.describe()}) failed for the whole model: "
                     f"{prober.last_error}")
        return None, None
    notes.append(f"input inferred {plan.source}: {plan.describe()}")
    return plan, output


def _input_from_sites(prober: "_Prober", notes: list[str]) -> tuple[Optional[InputPlan], Any]:
    """The input the repository feeds the model where it builds it (``model(torch.randn(8, 3, 32, 32))``), its
    first axis taken as the batch; (None, None) when there is none or the model (with its shrunk sizes) rejects it."""
    for where, (args, kwargs) in _SITE_INPUTS:
        def spec(shape: "sites.TensorShape") -> TensorSpec:
            return TensorSpec(tuple(shape.shape[1:]), shape.dtype, high=shape.high)

        plan = InputPlan(tuple(spec(a) for a in args), tuple((k, spec(v)) for k, v in kwargs.items()),
                         source=f"from the repository's call of the model near {where}")
        output = prober.try_plan(plan)
        if output is not _FAILED:
            notes.append(f"input {plan.source}: {plan.describe()}")
            return plan, output
        notes.append(f"the input of the repository's call near {where} ({plan.describe()}) failed here: "
                     f"{prober.last_error}")
    return None, None


def _with_broadcast_shapes(plans: Iterator[InputPlan], prober: "_Prober") -> Iterator[InputPlan]:
    """``plans``; after one whose single input the parameters broadcast to a bigger shape, first that shape
    (a [B, 1, H, W] image broadcast to [B, 32, H, W] by a [1, 32, 1, 1] gain: 32 channels)."""
    for plan in plans:
        yield plan
        shape = prober.broadcast_shape
        if prober.broadcast is None or shape is None or len(plan.args) != 1 or plan.kwargs:
            continue
        spec = plan.args[0]
        if isinstance(spec, TensorSpec) and spec.dtype == "float" and spec.batch_axis == 0 and not spec.adjacency \
                and not spec.batchless and len(shape) == len(spec.shape) + 1 and shape[0] == PROBE_BATCH:
            yield InputPlan((TensorSpec(tuple(shape[1:])),), (), "from the shape the parameters broadcast "
                                                                  f"{spec.describe()} to")


_IMAGE_SIZE_NAMES = ("image_size", "img_size", "input_size", "input_resolution", "resolution", "image_res")
_CHANNEL_NAMES = ("channels", "in_chans", "in_channels", "num_channels", "n_channels", "input_channels",
                  "image_channels", "in_ch")
_LENGTH_NAMES = ("seq_len", "seq_length", "sequence_length", "max_len", "block_size", "signal_length", "num_samples")


def _first_int(value: Any) -> Optional[int]:
    if isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _input_hints(model: nn.Module) -> dict:
    """What describes the input besides the forward: the constructor's arguments, the fields of a config object
    among them (``configs.seq_len``), and the sizes the model keeps on itself (``self.channels = configs.enc_in``)."""
    hints: dict = {}
    for key, value in vars(model).items():
        if not key.startswith("_") and isinstance(value, int) and not isinstance(value, bool):
            hints[key] = value
    for value in _LAST_ARGUMENTS.values():
        if isinstance(value, (types.SimpleNamespace, dict)) or dataclasses.is_dataclass(value) \
                and not isinstance(value, type):
            fields = value if isinstance(value, dict) else guess_config_fields(value)
            hints.update({k: v for k, v in fields.items() if isinstance(k, str)})
    hints.update(_LAST_ARGUMENTS)
    return hints


def _specs_from_hints(hints: dict) -> list[TensorSpec]:
    """Inputs the constructor's own arguments describe: an image of ``image_size`` with ``channels``, or a
    1-D signal of ``seq_len`` with ``channels`` (a 1-D ViT)."""
    channels = next((_first_int(hints[n]) for n in _CHANNEL_NAMES if _first_int(hints.get(n))), None)
    specs = []
    for name in _IMAGE_SIZE_NAMES:
        value = hints.get(name)
        if isinstance(value, (list, tuple)) and len(value) == 2 and all(_first_int(v) for v in value):
            specs.append(TensorSpec((channels or 3, int(value[0]), int(value[1]))))
        elif _first_int(value):
            side = _first_int(value)
            specs.append(TensorSpec((channels or 3, side, side)))
    for name in _LENGTH_NAMES:
        if _first_int(hints.get(name)) and channels:
            specs.append(TensorSpec((channels, _first_int(hints[name]))))
            specs.append(TensorSpec((_first_int(hints[name]), channels)))  # time first: [B, seq_len, channels]
    return specs


GROWN_IMAGE_SIDES = (64, 128, 224)


def _dead_parameters(model: nn.Module, plan: InputPlan, device: str, float_dtype: torch.dtype) -> Optional[int]:
    """How many trainable parameters get no or an exactly zero gradient from one train-mode backward of a random
    projection of the output (buffers restored); None when that cannot be run."""
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    was_training = model.training
    try:
        model.train()
        model.zero_grad(set_to_none=True)
        generator = torch.Generator().manual_seed(1)
        args, kwargs = plan.make(PROBE_BATCH, generator, float_dtype, device)
        output = model(*args, **kwargs)
        select, _ = _select_primary(output)
        primary = select(output) if select is not None else None
        if not isinstance(primary, torch.Tensor) or not primary.is_floating_point() or not primary.requires_grad:
            return None
        weights = torch.randn(primary.shape, generator=generator).to(primary.device)
        (primary.float() * weights).sum().backward()
        return sum(1 for p in model.parameters() if p.requires_grad and (p.grad is None or not bool(p.grad.any())))
    except (Exception, SystemExit):  # noqa: BLE001 - the checks will say what is wrong
        return None
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in buffers and b.shape == buffers[n].shape:
                    b.copy_(buffers[n])


def _grow_small_image(model: nn.Module, prober: "_Prober", plan: InputPlan,
                      notes: list[str]) -> Optional[tuple[InputPlan, Any]]:
    """An image input so small that the network reduces it to nothing (parameters get an exactly zero gradient:
    a 32x32 image through a 64x-downsampling backbone) is grown to 64, 128 or 224 pixels, the first size where
    every parameter gets a gradient. None when the inferred input is fine, or no larger one is."""
    if len(plan.args) != 1 or plan.kwargs:
        return None
    spec = plan.args[0]
    if spec.dtype != "float" or spec.adjacency or spec.batchless or len(spec.shape) != 3 \
            or max(spec.shape[1:]) >= GROWN_IMAGE_SIDES[-1]:
        return None
    dead = _dead_parameters(model, plan, prober.device, prober.float_dtype)
    if not dead:
        return None
    channels, height, width = spec.shape
    for side in GROWN_IMAGE_SIDES:
        if side <= max(height, width):
            continue
        candidate = InputPlan((TensorSpec((channels, side, side)),), (), plan.source)
        output = prober.try_plan(candidate)
        if output is _FAILED:
            continue
        if _dead_parameters(model, candidate, prober.device, prober.float_dtype) == 0:
            notes.append(f"at {height}x{width} {dead} parameters got an exactly zero gradient (the network reduces "
                         f"the image to nothing); the input was grown to {candidate.describe()}")
            return candidate, output
    return None


def _candidate_plans(model: nn.Module, hints: Optional[dict] = None) -> Iterator[InputPlan]:
    """Input plans, most likely first: from the parameter names and the entry layers in registration
    order, then (only when those all fail) from a torch.fx trace, then common shapes. Optional masks are
    offered with, then without. Plans may repeat; the caller skips repeats."""
    hints = hints or {}
    parameters = _forward_parameters(model)
    tensors = [p for p in parameters if p.role in ("input", "tokens", "target", "adjacency", "hidden")]
    if not tensors:
        tensors = [_ForwardParameter("input", "input", False)]
    masks = [p for p in parameters if p.role in ("mask", "padding_mask")]
    layers = _entry_layers(model)
    vocab = _token_vocabulary(model)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features]
    classes = linears[-1].out_features if linears else 2
    recurrent = next((m for m in model.modules() if isinstance(m, nn.RNNBase)), None)
    # an RNN called with its state: time-first inputs when the RNN is (the state's batch is its dim 1)
    time_first = recurrent is not None and not recurrent.batch_first and any(p.role == "hidden" for p in tensors)
    attentions = [m for m in model.modules() if isinstance(m, nn.MultiheadAttention)]
    # masks handed to torch's attention, which is time-first unless told otherwise: [T, B] inputs first too
    attention_time_first = bool(masks and attentions) and not any(m.batch_first for m in attentions) \
        and not _swaps_its_inputs(model)
    first_kind = "like the RNN" if time_first else "like torch's attention it holds (batch_first=False)"
    time_first = time_first or attention_time_first

    def heuristic_options(index: int, parameter: _ForwardParameter) -> list[tuple[TensorSpec, str]]:
        choices: list[tuple[TensorSpec, str]] = []
        as_tokens = parameter.role == "tokens"
        tables = forward_body.column_tables(model) if index == 0 else None
        if tables is not None:  # the model is the tables: one id per column
            choices.append((TensorSpec((tables[0],), "long", 0, tables[1], columns=True),
                            f"as {tables[0]} columns of ids, one per embedding table (the smallest has "
                            f"{tables[1]} rows)"))
        if as_tokens:
            choices.append((TensorSpec((SEQUENCE_LENGTH,), "long", 0, vocab), f"from the name '{parameter.name}'"))
        if parameter.role == "target":
            choices += [(TensorSpec((), "long", 0, classes, is_target=True), "as class labels"),
                        (TensorSpec((SEQUENCE_LENGTH,), "long", 0, vocab, is_target=True), "as next tokens"),
                        (TensorSpec((classes,), is_target=True), "as regression targets")]
        if parameter.role == "adjacency":
            return [(TensorSpec((), adjacency=True), f"as a graph's adjacency from the name '{parameter.name}'")]
        if parameter.role == "hidden":
            return [(spec, f"as the state of the {describe_layer(recurrent)}") for spec in _recurrent_state(recurrent)]
        if index == 0 and not as_tokens:
            choices += [(spec, "from the constructor's arguments") for spec in _specs_from_hints(hints)]
        # the i-th input likely feeds the i-th entry layer (two-input models); else the first one
        for layer in ([layers[index]] if index < len(layers) else []) + layers[:1]:
            choices += [(spec, f"from the first {describe_layer(layer)}") for spec in specs_for_layer(layer, as_tokens)]
        if index == 0 and len(tensors) > 1 and layers and not as_tokens:
            # a decoder block: the first input, upsampled, is concatenated with a skip connection before the
            # first convolution, so it carries about half of that convolution's channels
            for spec in specs_for_layer(layers[0])[:1]:
                if len(spec.shape) == 3 and spec.shape[0] > 1:
                    choices.insert(min(1, len(choices)), (TensorSpec((spec.shape[0] // 2,) + spec.shape[1:]),
                                                          "as half the channels of a concatenation"))
        if index > 0 and layers and not as_tokens:  # a skip connection: half the channels at twice the size...
            for spec in specs_for_layer(layers[0])[:1]:
                if len(spec.shape) == 3:
                    c, h, w = spec.shape
                    rest = max(c - c // 2, 1)  # what concatenates with an upsampled c // 2 channels back to c
                    choices += [(TensorSpec(shape), "from the first input's shape, as a skip connection")
                                for shape in ((rest, 2 * h, 2 * w), (rest, h, w), (c, 2 * h, 2 * w))]
        if time_first:
            choices = [(dataclasses.replace(spec, batch_axis=1), why + f", time-first {first_kind}")
                       for spec, why in choices if isinstance(spec, TensorSpec) and spec.shape
                       and not spec.adjacency] + choices
        return _unique(choices)

    torch_attention = any(isinstance(m, nn.MultiheadAttention) for m in model.modules())
    packed = {p.name: n for p in tensors if p.role in ("input", "tokens")
              for name, n in forward_body.packed_parameters(model).items() if name == p.name}

    def packing(combination: tuple) -> tuple:
        """A parameter the body only unpacks or indexes gets its tensor as a tuple (``ids, lengths = batch``)."""
        if not packed:
            return combination
        return tuple((TupleSpec((spec,) * packed[p.name]), why + f", as the {packed[p.name]}-tuple the forward "
                      f"unpacks") if p.name in packed and isinstance(spec, TensorSpec) else (spec, why)
                     for (spec, why), p in zip(combination, tensors))

    def plans(options: list[list[tuple[TensorSpec, str]]]) -> Iterator[InputPlan]:
        for rank in range(sum(len(o) for o in options)):
            for combination in _combinations_of_rank(options, rank):
                combination = packing(combination)
                args = tuple(spec for (spec, _), p in zip(combination, tensors) if not p.keyword)
                kwargs = tuple((p.name, spec) for (spec, _), p in zip(combination, tensors) if p.keyword)
                sources = [source for _, source in combination]
                source = sources[0] if len(set(sources)) == 1 else "; ".join(
                    f"{p.name} {source}" for source, p in zip(sources, tensors))
                mask_choices = [_mask_specs(m, combination[0][0], torch_attention) for m in masks]
                mask_specs = tuple((m.name, choices[0]) for m, choices in zip(masks, mask_choices))
                yield InputPlan(args, kwargs + mask_specs, source)
                if masks and all(m.keyword for m in masks):
                    yield InputPlan(args, kwargs, source + ", without the optional masks")
                # a required mask in the other shapes attention masks take (optional ones are left out instead)
                for variant in range(1, max((len(c) for c in mask_choices), default=1) if masks and not all(
                        m.keyword for m in masks) else 1):
                    mask_specs = tuple((m.name, choices[min(variant, len(choices) - 1)])
                                       for m, choices in zip(masks, mask_choices))
                    yield InputPlan(args, kwargs + mask_specs, source + ", the masks shaped to broadcast over "
                                                                        "attention scores [B, heads, L, L]")

    heuristic = [heuristic_options(i, p) for i, p in enumerate(tensors)]
    for index, p in enumerate(tensors):  # a packed pair whose items the body reads apart: each its own tensor
        heuristic[index] = _packed_item_options(model, p, packed.get(p.name), hints) + heuristic[index]
    read = _options_from_forward_body(model, tensors, hints)
    if read is not None:  # what the body requires, before what the names suggest
        body_options, joint, time_first = read
        for index in time_first:  # time-first in the body: the guesses by name too
                heuristic[index] = _unique([(_batch_second(spec), why + ", time-first as the forward reads it")
                                            for spec, why in heuristic[index]] + heuristic[index])
        for assignment in joint:
            yield from plans([[choice] for choice in assignment])
        yield from plans([_unique(b + h) for b, h in zip(body_options, heuristic)])
    if all(heuristic):
        yield from plans(heuristic)
    traced = _specs_from_fx(model)  # only reached when the heuristics failed: tracing costs time
    sizes = [m.num_embeddings for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
    common = [(spec, "by a search over common shapes") for spec in _common_shapes(min(sizes + [100]))]
    yield from plans([_unique(options + [(spec, "from a torch.fx trace") for spec in traced.get(p.name, [])] + common)
                      for options, p in zip(heuristic, tensors)])


def _swaps_its_inputs(model: nn.Module) -> bool:
    """Whether the forward body swaps the first two axes of one of its inputs (``x.transpose(0, 1)``): it then
    orders the axes for its layers itself. True when the body cannot be read."""
    try:
        return any(facts.time_first for facts in forward_body.read_forward(model).values())
    except (Exception, SystemExit):  # noqa: BLE001 - a property of the model raising while read: say it may
        return True


def _specs_for_width(width: int, layer: Optional[nn.Module]) -> list[TensorSpec]:
    """Inputs ``width`` wide on the axis ``layer`` reads: features of a Linear, channels of a convolution, the
    input size of an RNN (time-first unless the RNN is batch-first)."""
    if isinstance(layer, nn.modules.conv._ConvNd):
        return [TensorSpec((width,) + spec.shape[1:]) for spec in specs_for_layer(layer)]
    if isinstance(layer, nn.RNNBase):
        return [TensorSpec((SEQUENCE_LENGTH, width), batch_axis=0 if layer.batch_first else 1)]
    return [TensorSpec((width,)), TensorSpec((SEQUENCE_LENGTH, width))]


def _width_specs(facts: "forward_body.ParameterFacts", width: int, layer: Optional[nn.Module] = None
                 ) -> list[TensorSpec]:
    """Inputs ``width`` wide where the body reads them: a vector the body spreads over an image's positions
    ([B, C] made [B, C, 1, 1]) is [B, width]; else as ``_specs_for_width`` says for its layer."""
    if facts.spread:
        return [TensorSpec((width,))]
    return _specs_for_width(width, layer if layer is not None else facts.layer)


MAX_PACKED_CHOICES = 3  # per item of a packed argument: this many of the shapes the body allows it


def _packed_item_options(model: nn.Module, parameter: _ForwardParameter, count: Optional[int], hints: dict
                         ) -> list[tuple[TupleSpec, str]]:
    """For a parameter the forward unpacks into names (``audio, cond = pair``), tuples whose items are the
    inputs the body requires of each name, read as parameters of their own (``forward_body.read_packed``): the
    two tensors of a pair may differ in width. [] when the body does not say what every item is."""
    if not count:
        return []
    try:
        items = forward_body.read_packed(model).get(parameter.name)
    except (Exception, SystemExit):  # noqa: BLE001 - reading the body is a help: the same-tensor tuple still runs
        return []
    if not items or len(items) != count:
        return []
    read = _options_from_forward_body(model, [_ForwardParameter(n, "input", False) for n, _ in items], hints,
                                      facts=dict(items))
    if read is None:
        return []
    options, joint, _ = read
    assignments = [list(a) for a in joint] + [list(c) for c in itertools.product(
        *[o[:MAX_PACKED_CHOICES] for o in options])]
    names = ", ".join(n for n, _ in items)
    return _unique([(TupleSpec(tuple(spec for spec, _ in a)), f"as the ({names}) the forward unpacks, each read "
                     "from the forward body") for a in assignments
                    if a and all(isinstance(spec, TensorSpec) for spec, _ in a)])


def _options_from_forward_body(model: nn.Module, tensors: list[_ForwardParameter], hints: dict,
                               facts: Optional[dict] = None
                               ) -> Optional[tuple[list[list[tuple[TensorSpec, str]]], list[list[tuple[TensorSpec, str]]],
                                                   list[int]]]:
    """Per tensor parameter, the inputs its use in ``forward`` requires (``forward_body``), and whole
    assignments for parameters concatenated into one layer with neither width known (each split of that
    layer's width, splits into two of the constructor's own sizes first). None when the body says nothing that
    the names and entry layers do not: a single input that only reaches a layer. Third, the parameters the body
    transposes to batch-first (time-first inputs)."""
    try:
        facts = forward_body.read_forward(model) if facts is None else facts
    except (Exception, SystemExit):  # noqa: BLE001 - a property of the model raising while read: the guesses below still run
        return None
    if not facts:
        return None
    per_parameter = [facts.get(p.name, forward_body.ParameterFacts()) for p in tensors]
    special = any(f.vocabulary or f.adjacency or f.lengths or f.split_of or f.columns or f.time_first
                  or f.state_of is not None or f.width and f.channels_last or f.axis_sizes or f.rank or f.spread
                  for f in per_parameter)
    if not special and (len(tensors) < 2 or not any(f.width for f in per_parameter)):
        return None
    options: list[list[tuple[TensorSpec, str]]] = []
    for facts_of in per_parameter:
        why = "from the forward body (" + "; ".join(facts_of.why) + ")" if facts_of.why else ""
        if facts_of.adjacency:
            options.append([(TensorSpec((), adjacency=True), why)])
        elif facts_of.lengths:  # [B], or [B, 1] where the body squeezes axis 1 before it sorts them
            options.append([(TensorSpec((1,) if facts_of.axis_sizes == {1: 1} else (), "long", lengths=True), why)])
        elif facts_of.state_of is not None:
            options.append([(spec, why) for spec in _recurrent_state(facts_of.state_of)])
        elif facts_of.vocabulary:  # a sequence of ids, else one id per row (a decoder's single step)
            options.append([(TensorSpec((SEQUENCE_LENGTH,), "long", 0, facts_of.vocabulary), why),
                            (TensorSpec((), "long", 0, facts_of.vocabulary), why + ", one id per row")])
        elif facts_of.columns:
            options.append([(TensorSpec((facts_of.columns[0],), "long", 0, facts_of.columns[1], columns=True), why)])
        elif facts_of.width and facts_of.channels_last:
            options.append([(TensorSpec((SEQUENCE_LENGTH, facts_of.width)), why)])
        elif facts_of.width:
            options.append([(spec, why) for spec in _width_specs(facts_of, facts_of.width)])
        elif facts_of.time_first:  # a time-first sequence of unknown width: as wide as one of the given sizes
            options.append([(TensorSpec((width,)), why + f", {width} wide as a constructor size")
                            for width in _hint_sizes(hints, limit=None) if width > 1])
        else:
            options.append([])
    # a parameter concatenated with one whose input is known: the same leading axes, its own width unknown
    names = [p.name for p in tensors]
    for index, facts_of in enumerate(per_parameter):
        if options[index] or not facts_of.partner or facts_of.partner not in names:
            continue
        partner_options = options[names.index(facts_of.partner)]
        for spec, _ in partner_options[:1]:
            if spec.dtype == "float" and spec.shape:
                why = f"concatenated with '{facts_of.partner}' in the forward: its leading axes"
                for width in _hint_sizes(hints, limit=None):
                    options[index].append((dataclasses.replace(spec, shape=(width,) + spec.shape[1:]) if len(spec.shape) >= 3
                                           else dataclasses.replace(spec, shape=spec.shape[:-1] + (width,)), why))
    joint = []
    done: set = set()
    for index, facts_of in enumerate(per_parameter):
        if not facts_of.split_of or facts_of.split_of[0] not in names or index in done:
            continue
        other, total = names.index(facts_of.split_of[0]), facts_of.split_of[1]
        done |= {index, other}
        sizes = _hint_sizes(hints, limit=total)
        given = set(_hint_sizes(hints, limit=None)) - {1}  # the constructor's own sizes: splits into them first
        splits = sorted({(total - v, v) for v in sizes if 0 < v < total},
                        key=lambda s: (-((s[0] in given) + (s[1] in given)), -(s[0] in sizes and s[1] in sizes), -s[0]))
        for first_width, second_width in splits[:6]:
            why = f"splitting the {total} features of {forward_body.describe_layer(facts_of.layer)} that they are concatenated into"
            assignment = []
            for i in range(len(tensors)):
                if i in (index, other):
                    width = first_width if i == index else second_width
                    assignment.append((_width_specs(per_parameter[i], width, facts_of.layer)[0], why))
                elif options[i]:
                    assignment.append(options[i][0])
                else:
                    assignment = []
                    break
            if assignment:
                joint.append(assignment)
    for index, facts_of in enumerate(per_parameter):  # the number of axes an assert in the forward requires
        if facts_of.rank:
            why = "from the forward body (" + "; ".join(facts_of.why) + ")"
            ranked = [(spec, why_) for spec, why_ in options[index] if _rank(spec) == facts_of.rank]
            if not ranked and facts_of.rank == 1:  # one value per sample: a [B] vector, real-valued or counts
                ranked = [(TensorSpec(()), why), (TensorSpec((), "long", 0, ONE_PER_SAMPLE_HIGH), why)]
            if not ranked and facts_of.rank == 2 and not options[index]:  # nothing else known: a [B, T] signal
                ranked = [(TensorSpec((SEQUENCE_LENGTH,)), why + f", {SEQUENCE_LENGTH} steps")]
            options[index] = ranked or options[index]
    for index, facts_of in enumerate(per_parameter):  # sizes an assert in the forward requires of its axes
        if facts_of.axis_sizes:
            sized = [(_with_axis_sizes(spec, facts_of.axis_sizes), why) for spec, why in options[index]]
            options[index] = [(spec, why) for spec, why in sized if spec is not None] or options[index]
    time_first = [i for i, facts_of in enumerate(per_parameter) if facts_of.time_first]
    for index in time_first:  # [T, B, ...] where the body transposes it to batch-first
        options[index] = [(_batch_second(spec), why) for spec, why in options[index]]
        joint = [a[:index] + [(_batch_second(a[index][0]), a[index][1])] + a[index + 1:] for a in joint]
    return options, joint, time_first


ONE_PER_SAMPLE_HIGH = 10  # integer values of a [B] input the body asserts one-dimensional (a step, a class)


def _rank(spec: Any) -> Optional[int]:
    """How many axes the tensor ``spec`` makes, the batch included."""
    if not isinstance(spec, TensorSpec):
        return None
    if spec.adjacency:
        return 2
    if spec.batchless:
        return len(spec.shape)
    return 1 if spec.lengths else len(spec.shape) + 1


def _with_axis_sizes(spec: Any, sizes: dict) -> Optional[TensorSpec]:
    """``spec`` with the axes ``sizes`` names (counted with the batch first, negative from the end) set to those
    sizes; None when an axis is the batch or outside the spec."""
    if not isinstance(spec, TensorSpec) or spec.batch_axis != 0 or spec.adjacency or spec.lengths:
        return spec
    shape = list(spec.shape)
    for axis, size in sizes.items():
        index = axis - 1 if axis > 0 else len(shape) + axis if axis < 0 else None
        if index is None or not 0 <= index < len(shape):
            return None
        shape[index] = size
    return dataclasses.replace(spec, shape=tuple(shape))


def _batch_second(spec: TensorSpec) -> TensorSpec:
    """``spec`` with its batch on axis 1, as a sequence of ``SEQUENCE_LENGTH`` steps when it was one vector:
    [D] -> [T, B, D], [L, D] -> [L, B, D]. Other inputs unchanged."""
    if not isinstance(spec, TensorSpec) or spec.dtype != "float" or spec.adjacency or spec.lengths \
            or spec.batch_axis != 0 or spec.is_target:
        return spec
    if len(spec.shape) == 1:
        return dataclasses.replace(spec, shape=(SEQUENCE_LENGTH,) + spec.shape, batch_axis=1)
    if len(spec.shape) == 2:
        return dataclasses.replace(spec, batch_axis=1)
    return spec


def _hint_sizes(hints: dict, limit: Optional[int]) -> list[int]:
    """Sizes the constructor was given (a condition vector of ``n_classes``, an action of ``action_dim``), then 1."""
    sizes = [v for v in hints.values() if isinstance(v, int) and not isinstance(v, bool) and v > 0
             and (limit is None or v < limit)]
    if limit is not None and limit > 1:
        sizes.append(limit // 2)
    return list(dict.fromkeys(sizes + [1]))


def _recurrent_state(layer: Optional[nn.Module]) -> list[Union[TensorSpec, TupleSpec]]:
    """The initial state an RNN takes: [layers x directions, B, hidden], a pair (h, c) for an LSTM."""
    if not isinstance(layer, nn.RNNBase):
        return []
    stacked = layer.num_layers * (2 if layer.bidirectional else 1)
    hidden = TensorSpec((stacked, layer.proj_size or layer.hidden_size), batch_axis=1)
    if isinstance(layer, nn.LSTM):
        return [TupleSpec((hidden, TensorSpec((stacked, layer.hidden_size), batch_axis=1)))]
    return [hidden]


def _token_vocabulary(model: nn.Module) -> int:
    """The size of the embedding that token ids index: the first one not named like a position or segment table."""
    embeddings = [(name, m) for name, m in model.named_modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
    for name, embedding in embeddings:
        if not _NON_TOKEN_EMBEDDINGS.search(name.rsplit(".", 1)[-1]):
            return embedding.num_embeddings
    return embeddings[0][1].num_embeddings if embeddings else 100


def _unique(choices: list[tuple[TensorSpec, str]]) -> list[tuple[TensorSpec, str]]:
    seen: set = set()
    return [c for c in choices if not (c[0] in seen or seen.add(c[0]))]


def _combinations_of_rank(options: list[list], rank: int) -> Iterator[tuple]:
    """Combinations whose option indices sum to ``rank``: all first choices, then one step off..."""
    if len(options) == 1:
        if rank < len(options[0]):
            yield (options[0][rank],)
        return
    for first in range(min(rank, len(options[0]) - 1) + 1):
        for rest in _combinations_of_rank(options[1:], rank - first):
            yield (options[0][first],) + rest


def _mask_specs(parameter: _ForwardParameter, first_input: TensorSpec, torch_attention: bool = False
                ) -> list[TensorSpec]:
    """Masks that hide nothing (ones for attention masks, False for padding masks), most likely shape first:
    one value per position ([B, L]), then, for an attention mask over a sequence of L positions, the shapes that
    broadcast over the scores [B, heads, L, L] that attention masks are applied to: [B, 1, 1, L] (a key
    padding mask), [B, 1, L, L] (one mask for every head), [B, L, L]. For a model built on torch's attention
    (``torch_attention``: an ``nn.MultiheadAttention`` inside, as ``nn.Transformer`` has), an attention mask is
    first what torch takes: one [L, L] mask for the whole batch, all False (torch hides True and refuses integer
    masks; boolean like the padding masks, which torch wants of the same type)."""
    if first_input.dtype == "long":
        shape = first_input.shape
    elif len(first_input.shape) >= 2:
        shape = first_input.shape[:1]
    else:
        shape = (SEQUENCE_LENGTH,)
    if parameter.role == "padding_mask":
        return [TensorSpec(shape, "bool", fill=0)]
    if torch_attention and shape:
        return [TensorSpec((shape[0], shape[0]), "bool", fill=0, batchless=True), TensorSpec(shape, "long", fill=1)]
    shapes = [shape]
    sequence = first_input.batch_axis == 0 and (len(first_input.shape) == 2 or (
        first_input.dtype == "long" and len(first_input.shape) == 1))
    if sequence:
        length = first_input.shape[0]
        shapes += [(1, 1, length), (1, length, length), (length, length)]
    return [TensorSpec(s, "long", fill=1) for s in shapes]


# ---- task, target and loss -----------------------------------------------------------------------


@dataclass
class _Task:
    name: str
    loss_fn: Callable[[Any, Any], Any]
    make_target: Callable[[int, torch.Generator, tuple, str], Any]  # (batch_size, generator, args, device)
    num_classes: Optional[int] = None
    batch_axis: Optional[int] = 0  # of the selected output; None: it has none (configured)
    select: Optional[Callable[[Any], Any]] = None  # the configured output.select, for the checks to look at


def _select_primary(output: Any) -> tuple[Optional[Callable[[Any], Any]], str]:
    """A function picking the tensor to train on from the model's output, and a note when it is not the output."""
    if isinstance(output, torch.Tensor):
        return (lambda out: out), ""
    if isinstance(output, dict) or hasattr(output, "keys"):
        keys = list(output.keys())
        loss = output.get("loss") if "loss" in keys else None
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            return (lambda out: out["loss"]), "output is a mapping; trained on its 'loss'"
        for key in ["logits"] + keys:
            if key in keys and isinstance(output[key], torch.Tensor):
                return (lambda out, key=key: out[key]), f"output is a mapping; trained on its '{key}'"
        return None, ""
    if isinstance(output, (tuple, list)):
        for index, item in enumerate(output):
            if isinstance(item, torch.Tensor):
                note = f"output is a {type(output).__name__}; trained on element {index}"
                return (lambda out, index=index: out[index]), note
        for index, item in enumerate(output):
            # (scores, feature maps) of several heads, each a list: the first tensor of the first list that has one
            inner, inner_note = _select_primary(item) if isinstance(item, (tuple, list)) else (None, "")
            if inner is not None:
                note = f"output is a {type(output).__name__} of sequences; trained on element {index}, " \
                       f"{inner_note.split('; ', 1)[-1]}"
                return (lambda out, index=index, inner=inner: inner(out[index])), note
        return None, ""
    if isinstance(getattr(output, "logits", None), torch.Tensor):
        return (lambda out: out.logits), "trained on the output's .logits"
    return None, ""


def _batch_axis(primary_at_probe: torch.Tensor, primary_at_second: Optional[torch.Tensor]) -> Optional[int]:
    if primary_at_second is None or primary_at_second.dim() != primary_at_probe.dim():
        return 0 if primary_at_probe.dim() and primary_at_probe.shape[0] == PROBE_BATCH else None
    for axis, (a, b) in enumerate(zip(primary_at_probe.shape, primary_at_second.shape)):
        if a == PROBE_BATCH and b == SECOND_PROBE_BATCH:
            return axis
    return None


def _choose_task(plan: InputPlan, output: Any, prober: _Prober, config: dict, code_root: Path,
                 notes: list[str]) -> Union[_Task, Skip]:
    configured_task = config.get("task")
    if configured_task not in (None, "classification", "language_model", "regression", "custom"):
        raise BuildError(f"smoke task '{configured_task}' is not classification, language_model, regression or custom")
    configured_loss = load_callable(code_root, config["loss"]) if config.get("loss") else None
    if inspect.isclass(configured_loss):
        configured_loss = configured_loss()
    if output is _FAILED:  # a configured input the forward rejects: the checks report it
        return _task_without_output(configured_task or "custom", configured_loss, config)

    configured_output = config.get("output") or {}
    if "select" in configured_output:
        select, selection_note = _configured_selection(output, configured_output["select"])
    else:
        select, selection_note = _select_primary(output)
    if select is None:
        return Skip(f"forward returned {type(output).__name__} with no tensor to train on; configure smoke.targets "
                    "with a task and a loss")
    if selection_note:
        notes.append(selection_note)
    primary = select(output)
    if "batch_axis" in configured_output:
        axis = configured_output["batch_axis"]
        axis = None if axis in (None, False, "none") else int(axis)
        if axis is not None and axis >= primary.dim():
            raise BuildError(f"smoke output batch_axis {axis} is past the end of the output {tuple(primary.shape)}")
        notes.append(f"output batch axis: configured {axis}")
    else:
        second = prober.try_plan(plan, SECOND_PROBE_BATCH)
        axis = _batch_axis(primary, select(second) if second is not _FAILED else None)
    tokens_index = next((i for i, s in enumerate(plan.args) if s.dtype == "long" and len(s.shape) == 1
                         and not getattr(s, "columns", False) and not getattr(s, "batchless", False)), None)

    task = configured_task or _infer_task_name(primary, axis, plan, tokens_index)
    if configured_task is not None:
        notes.append(f"task: configured {task}")
    else:
        notes.append(f"task inferred from the output {_shape_text(primary, axis)}: {task}")
    probabilities = (task == "regression" and configured_task is None and configured_loss is None
                     and _is_probability(primary) and prober.last_operation(plan, select) == "sigmoid")
    built = _task_for(task, primary, axis, plan, tokens_index, select, config, notes, probabilities=probabilities)
    if isinstance(built, Skip):
        return built
    if "batch_axis" in configured_output or (built.name == "language_model" and axis == 1):
        built.batch_axis = axis  # else the checks hold the output to batch-first
    if "select" in configured_output:
        built.select = select
    if configured_loss is not None:
        # called with the model's whole output (or the configured selection of it) and the target
        built.loss_fn = _SelectedOutputLoss(configured_loss, select) if "select" in configured_output \
            else configured_loss
        notes.append(f"loss: the configured {config['loss']}")
    if config.get("loss_target") is not None:
        built.make_target = _target_from_spec(_spec_from_config(config["loss_target"]))
    return built


def _configured_selection(output: Any, key: Union[int, str]) -> tuple[Callable[[Any], Any], str]:
    """``output.select``: an index of a tuple output or a key of a mapping (or an attribute of an object)."""
    try:
        if isinstance(output, (tuple, list)) and isinstance(key, int):
            value = output[key]
            select: Callable[[Any], Any] = lambda out: out[key]  # noqa: E731
        elif isinstance(key, str) and (isinstance(output, dict) or hasattr(output, "keys")):
            value = output[key]
            select = lambda out: out[key]  # noqa: E731
        elif isinstance(key, str) and hasattr(output, key):
            value = getattr(output, key)
            select = lambda out: getattr(out, key)  # noqa: E731
        else:
            raise LookupError(key)
    except (LookupError, TypeError):
        raise BuildError(f"smoke output select {key!r} picks nothing from the {type(output).__name__} the forward "
                         "returns") from None
    if not isinstance(value, torch.Tensor):
        raise BuildError(f"smoke output select {key!r} picks a {type(value).__name__}, not a tensor")
    return select, f"trained on the output's {key!r} (configured)"


class _SelectedOutputLoss:
    def __init__(self, loss: Callable, select: Callable):
        self.loss, self.select = loss, select

    def __call__(self, output, target):
        return self.loss(self.select(output), target)


def _shape_text(tensor: torch.Tensor, batch_axis: Optional[int]) -> str:
    dims = [str(d) for d in tensor.shape]
    if batch_axis is not None:
        dims[batch_axis] = "B"
    return f"[{', '.join(dims)}]"


def _infer_task_name(primary: torch.Tensor, axis: Optional[int], plan: InputPlan, tokens_index: Optional[int]) -> str:
    if primary.dim() == 0 or (axis is None and primary.numel() == 1):
        return "custom"  # the model computes its own loss
    if _flattened_token_logits(primary, axis, plan, tokens_index):
        return "language_model"
    if primary.is_floating_point() and axis == 1 and primary.dim() == 3 and tokens_index is not None \
            and plan.args[tokens_index].batch_axis == 1 and primary.shape[2] > 1:
        return "language_model"  # time-first tokens in, time-first logits [T, B, V] out
    if primary.is_floating_point() and axis == 0:
        if primary.dim() == 2 and primary.shape[1] > 1:
            return "classification"
        if primary.dim() == 3 and tokens_index is not None and primary.shape[2] > 1:
            return "language_model"
    return "regression"


def _flattened_token_logits(primary: torch.Tensor, axis: Optional[int], plan: InputPlan,
                            tokens_index: Optional[int]) -> bool:
    """Logits [B * T, V]: one row per input token (``decoded.view(-1, ntoken)``), rows in the tokens' order."""
    if tokens_index is None or axis is not None or primary.dim() != 2 or not primary.is_floating_point():
        return False
    tokens = plan.args[tokens_index]
    return primary.shape[0] == PROBE_BATCH * tokens.shape[0] and primary.shape[1] >= tokens.high > 1


def _is_probability(primary: torch.Tensor) -> bool:
    return primary.is_floating_point() and primary.numel() > 0 and bool(((primary >= 0) & (primary <= 1)).all())


def _task_for(task: str, primary: torch.Tensor, axis: Optional[int], plan: InputPlan, tokens_index: Optional[int],
              select: Callable, config: dict, notes: list[str], *, probabilities: bool = False) -> Union[_Task, Skip]:
    if task == "custom":
        if primary.numel() != 1 and not config.get("loss"):
            return Skip("task custom needs a scalar output or a configured loss; the output is "
                        f"{_shape_text(primary, axis)}")
        return _Task("custom", _ScalarOutputLoss(select), lambda b, g, args, device: None)
    if task == "classification":
        if primary.dim() != 2 or axis != 0:
            return Skip(f"task classification needs an output [B, C]; the output is {_shape_text(primary, axis)}; "
                        "configure smoke.targets with a task and a loss")
        classes = int(config.get("num_classes") or primary.shape[1])
        return _Task("classification", _CrossEntropyLoss(select), _random_labels((), classes), classes)
    if task == "language_model" and _flattened_token_logits(primary, axis, plan, tokens_index):
        notes.append(f"the logits {_shape_text(primary, axis)} have one row per input token; their targets are the "
                     "next tokens in the same order, and the output has no batch axis")
        layout = plan.args[tokens_index].batch_axis
        shifted = _shifted_tokens(tokens_index, tokens_batch_axis=layout, logits_batch_axis=layout)
        make_target = lambda b, g, args, device: shifted(b, g, args, device).reshape(-1)  # noqa: E731
        task_value = _Task("language_model", _CrossEntropyLoss(select), make_target, int(primary.shape[1]))
        task_value.batch_axis = None
        return task_value
    if task == "language_model":
        if primary.dim() != 3 or axis not in (0, 1) or tokens_index is None:
            return Skip(f"task language_model needs token ids [B, T] and logits [B, T, V] (or [T, B, V] with "
                        f"output.batch_axis = 1); the output is {_shape_text(primary, axis)}; configure smoke.targets "
                        "with a task and a loss")
        vocab = int(primary.shape[2])
        tokens = plan.args[tokens_index]
        time_steps = int(primary.shape[1 - axis])
        if time_steps == tokens.shape[0] and tokens.high <= vocab:
            # the targets in the logits' layout: [B, T] for batch-first logits, [T, B] for time-first
            make_target = _shifted_tokens(tokens_index, tokens.batch_axis, axis)
        else:
            make_target = _random_labels((time_steps,), vocab)
            if axis == 1:
                make_target = _time_first(make_target)
            notes.append(f"the logits {_shape_text(primary, axis)} do not line up with the input tokens "
                         f"{tokens.describe()}; their targets are random tokens")
        return _Task("language_model", _CrossEntropyLoss(select), make_target, vocab)
    shape = list(primary.shape)
    if axis is not None:
        del shape[axis]
    if probabilities:
        # A sigmoid's output is a probability: under squared error its gradient vanishes once an Adam step
        # saturates it (and the model is called unable to fit), as its own training with binary cross-entropy
        # would not.
        notes.append("the output is a sigmoid's (probabilities): trained with binary cross-entropy against targets in "
                     "[0, 1], less the targets' own entropy (so a perfect fit is 0)")
        return _Task("regression", _BernoulliDivergence(select),
                     _random_regression_targets(tuple(shape), axis, draw=torch.rand))
    return _Task("regression", _MeanSquaredError(select), _random_regression_targets(tuple(shape), axis))


def _task_without_output(task: str, configured_loss: Optional[Callable], config: dict) -> _Task:
    identity = lambda out: out  # noqa: E731
    classes = config.get("num_classes")
    if configured_loss is not None:
        loss: Callable = configured_loss
    elif task in ("classification", "language_model"):
        loss = _CrossEntropyLoss(identity)
    elif task == "regression":
        loss = _MeanSquaredError(identity)
    else:
        loss = _ScalarOutputLoss(identity)
    make_target = (_target_from_spec(_spec_from_config(config["loss_target"])) if config.get("loss_target") is not None
                   else _random_labels((), int(classes or 2)) if task == "classification"
                   else (lambda b, g, args, device: None))
    return _Task(task, loss, make_target, int(classes) if classes else None)


class _CrossEntropyLoss:
    def __init__(self, select: Callable):
        self.select = select

    def __call__(self, output, target):
        logits = self.select(output)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=-100)


class _MeanSquaredError:
    def __init__(self, select: Callable):
        self.select = select

    def __call__(self, output, target):
        return F.mse_loss(self.select(output).float(), target)


class _BernoulliDivergence:
    """KL(target || output) for probabilities: binary cross-entropy less the target's entropy, 0 at a perfect fit
    whatever the targets, so the checks' "halve the loss" holds for soft targets too."""

    def __init__(self, select: Callable):
        self.select = select

    def __call__(self, output, target):
        probabilities = self.select(output).float()
        target = target.float().clamp(0.0, 1.0)
        entropy = F.binary_cross_entropy(target.clamp(1e-7, 1 - 1e-7), target, reduction="mean")
        return F.binary_cross_entropy(probabilities, target) - entropy.detach()


class _ScalarOutputLoss:
    def __init__(self, select: Callable):
        self.select = select

    def __call__(self, output, target):
        return self.select(output).reshape(())


def _random_labels(shape: tuple, classes: int):
    def make(batch_size, generator, args, device):
        return torch.randint(0, classes, (batch_size,) + shape, generator=generator).to(device)

    return make


def _shifted_tokens(tokens_index: int, tokens_batch_axis: int = 0, logits_batch_axis: int = 0):
    """Next-token targets: position t predicts token t+1; the last position is ignored (-100). Laid out like
    the logits' first two axes (batch-first or time-first)."""

    def make(batch_size, generator, args, device):
        tokens = args[tokens_index]
        if tokens_batch_axis == 1:  # [T, B]: work batch-first
            tokens = tokens.transpose(0, 1)
        target = torch.full_like(tokens, -100)
        target[:, :-1] = tokens[:, 1:]
        return target.transpose(0, 1).contiguous() if logits_batch_axis == 1 else target

    return make


def _time_first(make_target):
    def make(batch_size, generator, args, device):
        return make_target(batch_size, generator, args, device).transpose(0, 1).contiguous()

    return make


def _random_regression_targets(shape: tuple, batch_axis: Optional[int], draw: Callable = torch.randn):
    """Targets of the output's shape (the batch inserted at ``batch_axis``): ``draw`` (normal, or torch.rand for
    probabilities) of that shape."""
    def make(batch_size, generator, args, device):
        full = list(shape)
        if batch_axis is not None:
            full.insert(batch_axis, batch_size)
        return draw(full, generator=generator).to(device)

    return make


def _target_from_spec(spec: TensorSpec):
    def make(batch_size, generator, args, device):
        return spec.make(batch_size, generator, torch.float32, device)

    return make


class _BatchMaker:
    """``make_batch(batch_size, seed)``: the same tensors for the same arguments, on the device."""

    def __init__(self, plan: InputPlan, task: _Task, device: str, float_dtype: torch.dtype):
        self.plan, self.task, self.device, self.float_dtype = plan, task, device, float_dtype

    def __call__(self, batch_size: int, seed: int) -> Batch:
        generator = torch.Generator().manual_seed(int(seed))
        args, kwargs = self.plan.make(batch_size, generator, self.float_dtype, self.device)
        target = self.task.make_target(batch_size, generator, args, self.device)
        return Batch(args=args, kwargs=kwargs, target=target, batch_size=batch_size)
