"""TR114 optimizer-built-before-layer-replaced: a layer (or the model) replaced after the optimizer collected its
parameters: the new weights never train.
"""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import (
    all_children,
    FileContext,
    call_receiver,
    dotted_name,
    iter_names,
    method_name,
    short)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.flow import exclusive_branches, subtree
from analyzers.rules.base import Invalid, Rule


# Layers without parameters: putting one in place of a layer leaves nothing untrained.
_PARAMETERLESS = {"Identity", "Flatten", "Unflatten", "ReLU", "ReLU6", "LeakyReLU", "GELU", "SiLU", "Mish", "ELU",
                  "SELU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "Softplus", "Hardswish", "Hardsigmoid",
                  "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "MaxPool1d", "MaxPool2d",
                  "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
                  "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "Upsample"}
# ``model.fc.in_features``: sizes read from the old layer to build the new one (no module is reused).
_LAYER_METADATA = {"in_features", "out_features", "in_channels", "out_channels", "num_features", "embedding_dim",
                   "num_embeddings", "hidden_size", "input_size", "shape", "dtype", "device", "weight", "bias",
                   "kernel_size", "stride", "padding", "normalized_shape"}
_BRANCHES = (cst.If, cst.Else, cst.Try, cst.TryStar, cst.ExceptHandler, cst.ExceptStarHandler, cst.Match)


def _assigned_path(target: cst.BaseExpression) -> Optional[str]:
    """``model.classifier`` for ``model.classifier[6] = ...`` / ``model.classifier = ...``."""
    while isinstance(target, cst.Subscript):
        target = target.value
    return dotted_name(target) if isinstance(target, cst.Attribute) else None


def _covers(prefix: str, path: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def _scope_statements(scope: cst.CSTNode):
    """The nodes of ``scope`` in source order, without the bodies of nested functions, classes and lambdas."""
    stack = [scope]
    while stack:
        node = stack.pop()
        yield node
        if node is not scope and isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        stack.extend(reversed(all_children(node)))


class OptimizerBuiltBeforeModelReplaced(Rule):
    id = "TR114"
    slug = "optimizer-built-before-layer-replaced"
    category = Category.TRAINING
    severity = Severity.HIGH
    summary = "a layer (or the model) replaced after the optimizer collected its parameters: the new weights never train"
    source_hint = (re.compile(r"optim"), re.compile(r"parameters\s*\("))
    what = """
        Flags `model.fc = nn.Linear(...)` (a new layer with parameters assigned into the model, or
        `model = Net()` rebinding the model to a new one) after `optimizer = torch.optim.X(model.parameters())`
        was built in the same function, cell sequence or script, when that optimizer is then stepped
        or handed to a training function and is neither rebuilt nor given the new parameters
        (`add_param_group`) in between. Wrapping the model (`DDP(model)`, `model.to(device)`,
        `torch.compile(model)`) keeps its parameters and is fine, and so is a layer the optimizer
        never covered (`optimizer` over `model.fc.parameters()`, then `model.conv1 = ...`).
    """
    why = """
        An optimizer keeps references to the parameter tensors it was given. A layer created
        afterwards has new tensors the optimizer has never seen: `optimizer.step()` keeps updating
        the old, detached layer, and the new one stays at its random initialization for the whole
        run. Fine-tuning code that swaps the classifier head after building the optimizer trains
        a frozen random head, and nothing fails.
    """
    example = """
        model = models.resnet18(weights="DEFAULT")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        model.fc = nn.Linear(model.fc.in_features, num_classes)
        train(model, optimizer)
    """
    fix_example = """
        model = models.resnet18(weights="DEFAULT")
        model.fc = nn.Linear(model.fc.in_features, num_classes)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        train(model, optimizer)
    """
    VALID = [
        # built after the replacement
        """
        import torch
        import torch.nn as nn
        model.fc = nn.Linear(model.fc.in_features, 10)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        train(model, optimizer)
        """,
        # rebuilt before it is used again
        """
        import torch
        import torch.nn as nn
        optimizer = torch.optim.Adam(model.parameters())
        model.classifier = nn.Sequential(nn.Linear(1024, 256), nn.ReLU(), nn.Linear(256, 2))
        optimizer = torch.optim.Adam(model.classifier.parameters())
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        """,
        # wrappers keep the parameters; a parameterless layer adds none; the old optimizer is never used again
        """
        import torch
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        model = model.to(device)
        model = DDP(model, device_ids=[rank])
        model.module.head_drop = nn.Identity()
        model.features = nn.Sequential(*list(model.features.children())[:-1])
        train(model, opt)
        model = torch.load("best.pt")
        evaluate(model)
        """,
        # a layer outside the optimized part; the new parameters added explicitly
        """
        import torch
        import torch.nn as nn
        optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.1)
        model.conv1 = nn.Conv2d(1, 64, 7)
        model.head = nn.Linear(512, 10)
        optimizer.add_param_group({"params": model.head.parameters()})
        train(model, optimizer)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn
            from torchvision import models
            model = models.resnet18(weights="DEFAULT")
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            model.fc = nn.Linear(model.fc.in_features, 10)
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
            """,
            line=7, message="`optimizer` was built over `model.parameters()`",
        ),
        Invalid(
            """
            import torch
            from torch import optim
            def main(args):
                model = Net()
                opt = optim.Adam(filter(lambda p: p.requires_grad, model.parameters()), lr=args.lr)
                if args.resume:
                    model = Net.from_checkpoint(args.resume)
                train(model, opt, args.epochs)
            """,
            line=8, message="`model`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.creations: dict[int, tuple[str, cst.Assign, cst.Call]] = {}  # id(assign) -> (name, assign, call)
        self.scopes: list[cst.CSTNode] = []

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        if len(node.targets) != 1 or not isinstance(node.value, cst.Call):
            return
        name = dotted_name(node.targets[0].target)
        qualified = ctx.call_name(node.value) or ""
        if name is None or not qualified.startswith("torch.optim.") or ".lr_scheduler" in qualified:
            return
        self.creations[id(node)] = (name, node, node.value)
        scope = ctx.function if ctx.function is not None else ctx.module
        if not any(s is scope for s in self.scopes):
            self.scopes.append(scope)

    def end_file(self, ctx: FileContext) -> None:
        for scope in self.scopes:
            self._scan(scope, ctx)

    def _scan(self, scope: cst.CSTNode, ctx: FileContext) -> None:
        built: dict[str, tuple[cst.Assign, set[str]]] = {}  # optimizer -> (creation, parameter prefixes)
        collections: dict[str, list[cst.CSTNode]] = {}  # ``params`` -> where it was filled
        pending: list[tuple[str, cst.CSTNode, str, cst.Assign, str]] = []  # opt, site, what, creation, prefix
        for node in _scope_statements(scope):
            if isinstance(node, cst.Assign):
                if id(node) in self.creations:
                    name, _, call = self.creations[id(node)]
                    pending = [p for p in pending if p[0] != name]  # rebuilt before any use
                    prefixes = self._prefixes(call, collections, ctx)
                    if prefixes:
                        built[name] = (node, prefixes)
                    else:
                        built.pop(name, None)
                    continue
                for target in node.targets:
                    self._note_collection(target.target, node, collections)
                    site = self._replacement(target.target, node.value)
                    if site is None:
                        continue
                    path, what = site
                    for opt, (creation, prefixes) in built.items():
                        prefix = next((p for p in sorted(prefixes) if _covers(p, path) or
                                       (what == "model" and _covers(path, p))), None)
                        if prefix is not None and self._same_path(creation, node, ctx):
                            pending.append((opt, node, what, creation, prefix))
            elif isinstance(node, (cst.AugAssign, cst.Call)):
                if isinstance(node, cst.AugAssign):
                    self._note_collection(node.target, node, collections)
                    continue
                method = method_name(node)
                receiver = dotted_name(call_receiver(node)) if call_receiver(node) is not None else None
                if method in ("append", "extend") and receiver is not None:
                    collections.setdefault(receiver, []).append(node)
                if method == "add_param_group" and receiver is not None:
                    pending = [p for p in pending if p[0] != receiver]
                    continue
                for opt in {p[0] for p in pending}:
                    if self._trains_with(node, opt):
                        for entry in [p for p in pending if p[0] == opt]:
                            if not exclusive_branches(ctx, entry[1], node):
                                self._report(entry, ctx)
                                pending.remove(entry)

    @staticmethod
    def _note_collection(target: cst.BaseExpression, node: cst.CSTNode,
                         collections: dict[str, list[cst.CSTNode]]) -> None:
        name = dotted_name(target)
        if name is not None:
            collections.setdefault(name, []).append(node)

    def _prefixes(self, call: cst.Call, collections: dict[str, list[cst.CSTNode]], ctx: FileContext) -> set[str]:
        """The modules whose ``.parameters()`` the optimizer is built over (through a ``params`` list too)."""
        found: set[str] = set()
        seen: set[str] = set()
        work: list[cst.CSTNode] = [arg.value for arg in call.args if arg.keyword is None or
                                   arg.keyword.value == "params"]
        while work:
            expr = work.pop()
            for node in subtree(expr):
                if isinstance(node, cst.Call) and method_name(node) in ("parameters", "named_parameters"):
                    receiver = call_receiver(node)
                    name = dotted_name(receiver) if receiver is not None else None
                    if name is not None:
                        found.add(name)
                elif isinstance(node, cst.Name) and node.value in collections and node.value not in seen:
                    seen.add(node.value)
                    for filled in collections[node.value]:
                        work.append(filled)
                        loop = next((a for a in ctx.ancestors(filled) if isinstance(a, cst.For)), None)
                        if loop is not None:
                            work.append(loop.iter)
        return found

    @staticmethod
    def _replacement(target: cst.BaseExpression, value: cst.BaseExpression) -> Optional[tuple[str, str]]:
        """``(path, "layer")`` for a new layer stored into a model, ``(name, "model")`` for a new model bound."""
        if not isinstance(value, cst.Call):
            return None
        callee = dotted_name(value.func)
        if callee is None:
            return None
        last = callee.rsplit(".", 1)[-1]
        path = _assigned_path(target)
        if path is not None:
            if not last[:1].isupper() or last in _PARAMETERLESS:
                return None  # a tensor, a helper's result, or a layer without weights
            root = path.split(".", 1)[0]
            for used in iter_names(value):
                if (used == root or used.startswith(root + ".")) and used.rsplit(".", 1)[-1] not in _LAYER_METADATA:
                    return None  # built from the model's own layers: their parameters stay in the optimizer
            return path, "layer"
        name = dotted_name(target)
        if name is None or not isinstance(target, (cst.Name, cst.Attribute)):
            return None
        if any(used == name or used.startswith(name + ".") for used in iter_names(value)):
            return None  # ``model = DDP(model)`` / ``model = model.to(device)``: the same parameters
        if last in ("load", "deepcopy") or callee.startswith("torch.optim") or "optim" in last.lower():
            return None  # a whole model read back (after training, for testing) is not a layer swap
        owner = callee.rsplit(".", 2)[-2] if "." in callee else ""
        if not last[:1].isupper() and not owner[:1].isupper() and \
                not callee.startswith(("models.", "torchvision.", "timm.")):
            return None  # ``model = build(cfg)`` may return the same object; constructors (``Net.from_...``) are sure
        return name, "model"

    @staticmethod
    def _trains_with(call: cst.Call, opt: str) -> bool:
        """``opt.step()`` / ``opt.zero_grad()``, ``scaler.step(opt)``, or ``train(model, opt)``."""
        receiver = call_receiver(call)
        if receiver is not None and dotted_name(receiver) == opt:
            return method_name(call) in ("step", "zero_grad")
        if not any(dotted_name(arg.value) == opt for arg in call.args):
            return False
        return isinstance(call.func, cst.Name) or method_name(call) == "step"

    @staticmethod
    def _branch_path(node: cst.CSTNode, ctx: FileContext) -> list[cst.CSTNode]:
        return [a for a in ctx.ancestors(node) if isinstance(a, _BRANCHES) or isinstance(a, cst.IndentedBlock)]

    def _same_path(self, creation: cst.CSTNode, site: cst.CSTNode, ctx: FileContext) -> bool:
        """Every branch the optimizer was built in also holds ``site`` (not ``if a: opt = ... else: swap``)."""
        around_site = {id(a) for a in ctx.ancestors(site)}
        return all(id(a) in around_site for a in ctx.ancestors(creation) if isinstance(a, _BRANCHES))

    def _report(self, entry: tuple[str, cst.CSTNode, str, cst.Assign, str], ctx: FileContext) -> None:
        opt, site, what, creation, prefix = entry
        built = f"`{opt}` was built over `{prefix}.parameters()`"
        if what == "layer":
            message = (f"{code_span(short(ctx, site))} puts a new layer into the model after {built}: the optimizer "
                       f"still holds the replaced layer's tensors, so {code_span(opt + '.step()')} never updates the "
                       f"new weights and they keep their random initialization; build the optimizer after the model "
                       f"is final (or add them with {code_span(opt + '.add_param_group(...)')})")
        else:
            name = dotted_name(site.targets[0].target) if isinstance(site, cst.Assign) else prefix
            message = (f"{code_span(short(ctx, site))} binds `{name}` to a new model after {built}: the optimizer "
                       f"keeps updating the old model's tensors, and the new model never trains; build the optimizer "
                       f"after this line")
        self.report(site, message, related=[(creation, f"`{opt}` built here")])
