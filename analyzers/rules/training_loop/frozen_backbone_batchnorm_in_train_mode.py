"""TR116 frozen-backbone-batchnorm-in-train-mode: a frozen pretrained backbone with BatchNorm is left in train mode
while the rest of the model trains.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

import libcst as cst

from analyzers.context import NO_GRAD_CONTEXTS, FileContext, argument, call_receiver, dotted_name, is_false, is_true, \
    method_name, short, uses_name
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.flow import exclusive_branches, subtree
from analyzers.program.library import method_returns_same_module
from analyzers.program.values import BACKWARD_METHODS
from analyzers.program.freezing import program_fixes_batchnorm_statistics
from analyzers.rules.base import Invalid, Rule
from analyzers.program.loops import loop_stack, loop_trains
from analyzers.program.values import batchnorm_evidence
from analyzers.program.names import within as _within


# frozen copies whose weights follow another model (EMA teachers, momentum encoders): their train-mode BatchNorm is
# part of the method (MoCo's shuffled BN, DINO's teacher)
_FOLLOWER_WORDS = ("teacher", "ema", "momentum", "target", "shadow", "_k", "key_encoder", "average", "swa")

def _is_follower(path: str) -> bool:
    lowered = path.lower()
    return any(word in lowered for word in _FOLLOWER_WORDS)


@dataclass
class _Freeze:
    path: str  # the frozen module, as written (``model``, ``model.features``, ``self.backbone``)
    node: cst.CSTNode  # where: the ``for p in ...parameters()`` loop, ``requires_grad_(False)``, the no_grad call
    how: str
    batchnorm: Optional[str]
    cls: Optional[str] = None  # the class whose method froze ``self.<attr>``
    in_init: bool = False


@dataclass
class _ModeCall:
    path: str
    node: cst.Call
    order: int
    function: Optional[cst.CSTNode]
    cls: Optional[str]
    in_init: bool


@dataclass
class _Facts:
    freezes: list[_Freeze] = field(default_factory=list)
    trains: list[_ModeCall] = field(default_factory=list)
    evals: list[_ModeCall] = field(default_factory=list)
    unfrozen: set[str] = field(default_factory=set)
    # modules whose weights go to an optimizer or a ``zip`` with another model's, or are copied from another model
    weights_used: set[str] = field(default_factory=set)
    # callee -> (its first call under no_grad in a training loop, what shows it holds BatchNorm)
    no_grad_calls: dict[str, tuple[cst.Call, Optional[str]]] = field(default_factory=dict)
    grad_calls: set[str] = field(default_factory=set)  # callees also called with autograd on
    train_overrides: set[str] = field(default_factory=set)  # classes defining ``train(self, mode=True)``
    trained: set[str] = field(default_factory=set)  # roots of what is called inside a loop that backpropagates
    backward: Optional[int] = None  # the walk order of the first ``.backward()``


def _loop_target_frozen(loop: cst.For) -> Optional[bool]:
    """``for p in X.parameters(): p.requires_grad = False`` (True), ``= True`` (False); None otherwise. Only
    statements straight in the loop's body count: a condition (``if "fc" not in name``) freezes a part."""
    target = loop.target
    if isinstance(target, cst.Tuple) and len(target.elements) == 2:
        target = target.elements[1].value
    if not isinstance(target, cst.Name) or not isinstance(loop.body, cst.IndentedBlock):
        return None
    for line in loop.body.body:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for statement in line.body:
            if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
                assigned = statement.targets[0].target
                if isinstance(assigned, cst.Attribute) and assigned.attr.value == "requires_grad" and \
                        isinstance(assigned.value, cst.Name) and assigned.value.value == target.value:
                    if is_false(statement.value):
                        return True
                    if is_true(statement.value):
                        return False
            if isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
                call = statement.value
                if method_name(call) == "requires_grad_" and isinstance(call.func, cst.Attribute) and \
                        isinstance(call.func.value, cst.Name) and call.func.value.value == target.value:
                    flag = argument(call, 0, "requires_grad")
                    return True if is_false(flag) else False if flag is None or is_true(flag) else None
    return None


class FrozenBatchNormInTrainMode(Rule):
    id = "TR116"
    source_hint = (re.compile(r"requires_grad|no_grad"), re.compile(r"backward"))
    slug = "frozen-backbone-batchnorm-in-train-mode"
    category = Category.TRAINING
    severity = Severity.MEDIUM
    summary = "a frozen pretrained backbone with BatchNorm is left in train mode while the rest of the model trains"
    what = """
        Flags a backbone whose parameters are frozen (`for p in backbone.parameters(): p.requires_grad = False`,
        `backbone.requires_grad_(False)`, or a backbone only ever called under `torch.no_grad()` in the
        training loop) when it holds BatchNorm (a torchvision/timm ResNet, DenseNet, EfficientNet,
        MobileNet, `vgg*_bn`..., or a project class that builds `BatchNorm*`) and the training loop runs it
        in train mode: `model.train()` with no `backbone.eval()` after it, or no mode switch at all.
        Quiet when the class overrides `train()`, when the code keeps BatchNorm statistics fixed another
        way (`FrozenBatchNorm2d`, `track_running_stats=False`, `momentum=0`, `norm_eval=True`, a loop,
        function or lambda, here or in the repository, that puts `BatchNorm` modules in eval mode),
        and for EMA teachers and momentum encoders, whose weights follow another model.
    """
    why = """
        `requires_grad = False` stops the weights, not the BatchNorm statistics: in train mode every
        forward pass normalizes with the batch's own mean and variance and folds them into the running
        averages. The frozen layers then drift towards the new data's statistics while their affine
        weights stay fitted to the old ones, the features the head learns on shift from step to step,
        and the evaluation (which uses the running averages) sees a backbone nobody trained. With small
        fine-tuning batches this costs accuracy and makes results depend on the batch size.
    """
    example = """
        model = models.resnet50(weights="DEFAULT")
        for p in model.parameters():
            p.requires_grad = False
        model.fc = nn.Linear(2048, 10)
        for epoch in range(epochs):
            model.train()
            for x, y in loader:
                ...
    """
    fix_example = """
        for epoch in range(epochs):
            model.train()
            for m in model.modules():          # keep the frozen BatchNorm statistics fixed
                if isinstance(m, nn.BatchNorm2d):
                    m.eval()
            for x, y in loader:
                ...
        # or, for a backbone attribute: model.backbone.eval() after every model.train(),
        # or override train() in the model class to keep it in eval mode
    """
    VALID = [
        # the backbone put back in eval mode after every train()
        """
        import torch
        import torch.nn as nn
        from torchvision import models
        model = models.resnet18(weights="DEFAULT")
        for p in model.layer4.parameters():
            p.requires_grad = False
        for epoch in range(3):
            model.train()
            model.layer4.eval()
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
        """,
        # a backbone without BatchNorm (plain VGG), and a class that overrides train()
        """
        import torch
        import torchvision
        vgg = torchvision.models.vgg16(weights="DEFAULT")
        for param in vgg.features.parameters():
            param.requires_grad = False
        class Classifier(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.backbone = torchvision.models.resnet50(weights="DEFAULT")
                self.backbone.requires_grad_(False)
                self.head = torch.nn.Linear(2048, 5)
            def train(self, mode=True):
                super().train(mode)
                self.backbone.eval()
                return self
        net = Classifier()
        for x, y in loader:
            criterion(net(x), y).backward()
            opt.step()
            vgg_loss = vgg.features(x)
        """,
        # an EMA teacher: its weights follow the student, its train-mode BatchNorm is part of the method
        """
        import torch
        from torchvision import models
        student = models.resnet50()
        teacher = models.resnet50()
        for p in teacher.parameters():
            p.requires_grad = False
        for x in loader:
            with torch.no_grad():
                t = teacher(x)
            loss = (student(x) - t).pow(2).mean()
            loss.backward()
            opt.step()
            with torch.no_grad():
                for ps, pt in zip(student.parameters(), teacher.parameters()):
                    pt.mul_(0.99).add_(ps.detach(), alpha=0.01)
        """,
        # the whole model put in eval mode and never back: the head trains with fixed statistics
        """
        import torch
        import timm
        model = timm.create_model("efficientnet_b0", pretrained=True)
        for p in model.parameters():
            p.requires_grad = False
        model.classifier = torch.nn.Linear(1280, 2)
        model.eval()
        for x, y in loader:
            loss_fn(model(x), y).backward()
            optimizer.step()
        """,
        # the frozen BatchNorm layers switched back after every train(), whichever types they are
        """
        import torch.nn as nn
        from torchvision.models import resnet50
        model = resnet50(weights="DEFAULT")
        for p in model.parameters():
            p.requires_grad = False
        model.fc = nn.Linear(2048, 10)
        for epoch in range(10):
            model.train()
            for m in model.modules():
                if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                    m.eval()
            for x, y in loader:
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        """,
        # a linear-probe / fine-tune switch: train() only in the fine-tune mode, eval() in the frozen one
        """
        import torch
        import torchvision
        model = torchvision.models.resnet50()
        if args.weights == "freeze":
            model.requires_grad_(False)
            model.fc.requires_grad_(True)
        for epoch in range(10):
            if args.weights == "finetune":
                model.train()
            elif args.weights == "freeze":
                model.eval()
            for x, y in loader:
                criterion(model(x), y).backward()
                optimizer.step()
        """,
        # frozen for a demo forward pass; what backpropagates in this file is something else
        """
        import torch
        import torchvision
        w = torch.randn(3, requires_grad=True)
        for step in range(100):
            (w ** 2).sum().backward()
        resnet = torchvision.models.resnet18(weights="DEFAULT")
        for param in resnet.parameters():
            param.requires_grad = False
        resnet.fc = torch.nn.Linear(512, 100)
        print(resnet(torch.randn(64, 3, 224, 224)).shape)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch import nn, optim
            from torchvision import models
            model = models.densenet121(weights="DEFAULT")
            for param in model.parameters():
                param.requires_grad = False
            model.classifier = nn.Linear(1024, 2)
            optimizer = optim.Adam(model.classifier.parameters(), lr=3e-3)
            for epoch in range(5):
                for inputs, labels in trainloader:
                    loss = criterion(model(inputs), labels)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                model.eval()
                with torch.no_grad():
                    validate(model)
                model.train()
            """,
            line=6, message="`model` (a densenet121, which holds BatchNorm) is frozen",
        ),
        # a helper named for freezing BatchNorm that only logs: the statistics still move
        Invalid(
            """
            import torch
            from torch import nn, optim
            from torchvision import models
            def fix_bn_stats(model):
                print("batch norm layers:", sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()))
            model = models.resnet18(weights="DEFAULT")
            for param in model.parameters():
                param.requires_grad = False
            model.fc = nn.Linear(512, 2)
            fix_bn_stats(model)
            optimizer = optim.Adam(model.fc.parameters(), lr=3e-3)
            model.train()
            for inputs, labels in trainloader:
                criterion(model(inputs), labels).backward()
                optimizer.step()
            """,
            line=8, message="is frozen",
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            import torchvision.models as tvm
            class Net(nn.Module):
                def __init__(self, n):
                    super().__init__()
                    self.backbone = tvm.resnet34(weights=tvm.ResNet34_Weights.DEFAULT)
                    self.backbone.eval()
                    for p in self.backbone.parameters():
                        p.requires_grad_(False)
                    self.head = nn.Linear(1000, n)
                def forward(self, x):
                    return self.head(self.backbone(x))
            net = Net(10).cuda()
            for epoch in range(10):
                net.train()
                for x, y in loader:
                    nn.functional.cross_entropy(net(x), y).backward()
                    opt.step()
            """,
            line=10, message="`self.backbone` of `Net` (a resnet34, which holds BatchNorm) is frozen here",
        ),
        Invalid(
            """
            import torch
            from torchvision.models import resnet50
            encoder = resnet50(weights="IMAGENET1K_V2").to(device)
            head = torch.nn.Linear(1000, 10).to(device)
            for images, labels in train_loader:
                with torch.no_grad():
                    feats = encoder(images)
                loss = torch.nn.functional.cross_entropy(head(feats), labels)
                loss.backward()
                optimizer.step()
            """,
            line=8, message="only run under `torch.no_grad()`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.facts = _Facts()
        self.order = 0
        self.no_grad: list[cst.CSTNode] = []  # the no_grad ``with`` blocks and decorated functions we are in

    # ---- the walk ------------------------------------------------------------------------------
    def visit_For(self, node: cst.For, ctx: FileContext) -> None:
        iterated = node.iter
        if not isinstance(iterated, cst.Call) or method_name(iterated) not in ("parameters", "named_parameters"):
            return
        receiver = call_receiver(iterated)
        path = dotted_name(receiver) if receiver is not None else None
        if path is None:
            return
        frozen = _loop_target_frozen(node)
        if frozen is False:
            self.facts.unfrozen.add(path)
        elif frozen:
            self._freeze(path, receiver, node, f"`for ... in {path}.{method_name(iterated)}()` sets "
                                               f"`requires_grad = False`", ctx)

    def visit_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        owner = ctx.parent(ctx.parent(node))
        if node.name.value == "train" and isinstance(owner, cst.ClassDef):
            self.facts.train_overrides.add(owner.name.value)
        if node.decorators and any(d in NO_GRAD_CONTEXTS for d in ctx.decorators_of(node)):
            self.no_grad.append(node)

    def leave_FunctionDef(self, node: cst.FunctionDef, ctx: FileContext) -> None:
        if self.no_grad and self.no_grad[-1] is node:
            self.no_grad.pop()

    def visit_With(self, node: cst.With, ctx: FileContext) -> None:
        """``with torch.no_grad():`` blocks, kept here: asking ``ctx.in_no_grad()`` at every call costs more."""
        for item in node.items:
            call = item.item if isinstance(item.item, cst.Call) else None
            if ctx.qualified_name(call.func if call is not None else item.item) in NO_GRAD_CONTEXTS and not (
                    call is not None and is_true(argument(call, 0, "mode"))):
                self.no_grad.append(node)
                return

    def leave_With(self, node: cst.With, ctx: FileContext) -> None:
        if self.no_grad and self.no_grad[-1] is node:
            self.no_grad.pop()

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        func = node.func
        if name in BACKWARD_METHODS:
            if self.facts.backward is None:
                self.facts.backward = self.order
            return
        if name in ("parameters", "named_parameters", "load_state_dict") and isinstance(func, cst.Attribute):
            path = dotted_name(func.value)
            copied = name == "load_state_dict" and isinstance(argument(node, 0, "state_dict"), cst.Call) and \
                method_name(argument(node, 0, "state_dict")) == "state_dict"  # ``target.load_state_dict(net.state_dict())``
            if path is not None and (copied or name != "load_state_dict" and self._weights_handed_on(node, ctx)):
                self.facts.weights_used.add(path)
            return
        if name == "eval" and not node.args or name == "train":
            self._mode(node, name, ctx)
            return
        if name == "requires_grad_" and isinstance(func, cst.Attribute):
            path = dotted_name(func.value)
            flag = argument(node, 0, "requires_grad")
            binding = ctx.binding(path) if path is not None else None
            if path is None or (binding is not None and binding.kind == "for"):
                return  # ``p.requires_grad_(False)`` over parameters: the loop is the freeze
            if is_false(flag):
                self._freeze(path, func.value, node, f"`{path}.requires_grad_(False)`", ctx)
            elif flag is None or is_true(flag):
                self.facts.unfrozen.add(path)
            return
        if type(func) is cst.Name:
            callee = func.value
        elif type(func) is cst.Attribute:
            callee = dotted_name(func.value if name == "forward" else func)
            if callee is None:
                return
        else:
            return
        root = callee.split(".", 1)[0]
        if root not in self.facts.trained and ctx.loop is not None and \
                any(loop_trains(lp, ctx) for lp in loop_stack(ctx)):
            self.facts.trained.add(root)
        if not self.no_grad:
            self.facts.grad_calls.add(callee)
        elif callee not in self.facts.no_grad_calls and ctx.qualified_name(func) is None and \
                any(loop_trains(lp, ctx) for lp in loop_stack(ctx)):
            self.facts.no_grad_calls[callee] = (node, batchnorm_evidence(func if name != "forward" else func.value, ctx))

    @staticmethod
    def _weights_handed_on(node: cst.Call, ctx: FileContext) -> bool:
        """``X.parameters()`` given to an optimizer (``optim.SGD(...)``, a param group) or to ``zip``."""
        for ancestor in ctx.ancestors(node):
            if isinstance(ancestor, (cst.ListComp, cst.GeneratorExp)) and any(
                    uses_name(clause, "requires_grad") for clause in ancestor.for_in.ifs):
                return False  # ``[p for p in X.parameters() if p.requires_grad]``: the frozen ones are left out
            if isinstance(ancestor, cst.Call):
                callee = dotted_name(ancestor.func) or ""
                if callee == "filter" and ancestor.args and uses_name(ancestor.args[0], "requires_grad"):
                    return False
                last = callee.rsplit(".", 1)[-1]
                if last == "zip" or last[:1].isupper() or (ctx.qualified_name(ancestor.func) or "").startswith(
                        "torch.optim."):
                    return True
            if isinstance(ancestor, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return False
        return False

    def _mode(self, node: cst.Call, name: str, ctx: FileContext) -> None:
        receiver = call_receiver(node)
        path = dotted_name(receiver) if receiver is not None else None
        parent = ctx.parent(node)
        if path is None and isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            path = dotted_name(parent.targets[0].target)  # ``self.net = models.resnet18(...).eval()``
        if path is None:
            return
        flag = argument(node, 0, "mode")
        if name == "train" and flag is not None and not (is_true(flag) or is_false(flag)):
            return  # ``module.train(mode)``: passes a mode on (a train() override)
        self.order += 1
        fn = ctx.function_def
        call = _ModeCall(path, node, self.order, fn, ctx.class_def.name.value if ctx.class_def else None,
                         fn is not None and fn.name.value == "__init__")
        (self.facts.evals if name == "eval" or is_false(flag) else self.facts.trains).append(call)

    def _freeze(self, path: str, expr: cst.BaseExpression, node: cst.CSTNode, how: str, ctx: FileContext) -> None:
        if _is_follower(path) or path == "self":
            return
        fn = ctx.function_def
        cls = ctx.class_def.name.value if ctx.class_def is not None and path.startswith("self.") else None
        self.facts.freezes.append(_Freeze(path, node, how, batchnorm_evidence(expr, ctx), cls,
                                          fn is not None and fn.name.value == "__init__"))

    # ---- the verdict ---------------------------------------------------------------------------
    def end_file(self, ctx: FileContext) -> None:
        facts = self.facts
        if facts.backward is None or not (facts.freezes or facts.no_grad_calls) or \
                program_fixes_batchnorm_statistics(ctx):
            return
        reported: set[str] = set()
        for freeze in facts.freezes:
            if freeze.batchnorm is None or freeze.path in reported:
                continue
            if self._check(freeze, ctx):
                reported.add(freeze.path)
        for callee, (call, described) in facts.no_grad_calls.items():
            if described is None or callee in facts.grad_calls or callee in reported or _is_follower(callee) or \
                    any(_within(callee, f.path) for f in facts.freezes):
                continue
            freeze = _Freeze(callee, call, "only run under `torch.no_grad()` in the training loop", described)
            if self._check(freeze, ctx):
                reported.add(callee)

    def _check(self, freeze: _Freeze, ctx: FileContext) -> bool:
        facts = self.facts
        paths = [freeze.path]
        if freeze.cls is not None:
            if freeze.cls in facts.train_overrides:
                return False
            attr = freeze.path[len("self."):]
            instances = self._instances(freeze.cls, ctx)
            if not instances:
                return False  # built elsewhere: how it is trained is not in this file
            paths = [f"{inst}.{attr}" for inst in instances]
        if any(facts.unfrozen.__contains__(p) or any(_within(p, u) for u in facts.unfrozen) for p in paths):
            return False  # unfrozen again (alternating GAN updates, gradual unfreezing)
        if any(p in facts.weights_used or freeze.path in facts.weights_used for p in paths):
            return False  # its weights are optimized, or copied from another model
        if freeze.cls is not None and any(e.cls == freeze.cls and not e.in_init and _within(e.path, freeze.path)
                                          for e in facts.evals):
            return False  # the class puts it in eval mode itself (in forward, in a hook)
        for path in paths:
            root = path.split(".", 1)[0]
            if root not in facts.trained:
                continue  # never run in a training loop here (a demo, a feature extractor used elsewhere)
            evals = [e for e in facts.evals if _within(e.path, path)]
            trains = [t for t in facts.trains if _within(path, t.path) and t.path.split(".", 1)[0] == root
                      and not exclusive_branches(ctx, t.node, freeze.node)]  # finetune / freeze modes of one run
            if trains:
                # a validation ``model.eval()`` is undone by the next ``model.train()``: only a switch of the frozen
                # part itself, after the train(), keeps its statistics fixed
                culprit = next((t for t in trains if not any(e.order > t.order and e.path != t.path for e in evals)),
                               None)
                if culprit is None:
                    continue
                self._report(freeze, path, culprit, ctx)
                return True
            if any(e.order <= facts.backward for e in facts.evals if _within(e.path, path) or _within(path, e.path)):
                continue
            if freeze.cls is not None and any(e.cls == freeze.cls and _within(e.path, freeze.path) for e in facts.evals):
                continue  # the class puts it in eval mode (``self.net.eval()`` in ``__init__``) and nothing trains it
            self._report(freeze, path, None, ctx)
            return True
        return False

    @staticmethod
    def _instances(cls: str, ctx: FileContext) -> list[str]:
        """The names bound to ``cls(...)`` in the file (``net = Net(10).cuda()``); asked only for a class that
        freezes a BatchNorm backbone of its own, so the walk over the module is rare."""
        found = []
        for node in subtree(ctx.module):
            if type(node) is not cst.Assign or len(node.targets) != 1 or not isinstance(node.value, cst.Call):
                continue
            value = node.value
            while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and \
                    method_returns_same_module(value.func.attr.value):
                value = value.func.value
            callee = dotted_name(value.func) if isinstance(value, cst.Call) else None
            target = dotted_name(node.targets[0].target)
            if callee is not None and target is not None and callee.rsplit(".", 1)[-1] == cls:
                found.append(target)
        return found

    def _report(self, freeze: _Freeze, path: str, culprit: Optional[_ModeCall], ctx: FileContext) -> None:
        if culprit is not None:
            mode = (f"{code_span(short(ctx, culprit.node))} puts it back in train mode and nothing calls "
                    f"`{path}.eval()` after it")
            related = [(culprit.node, f"`{culprit.path}.train()` switches the frozen BatchNorm layers back to "
                                      f"training")]
        else:
            mode = f"nothing calls `{path}.eval()`, so it runs in train mode"
            related = []
        subject = f"`{freeze.path}` of `{freeze.cls}`" if freeze.cls is not None else f"`{freeze.path}`"
        where = f"is frozen here ({freeze.how})" if not freeze.how.startswith("only") else f"is {freeze.how}"
        if "." in path:
            fix = f"call `{path}.eval()` after every `.train()`, or override `train()` to keep it in eval mode"
        elif culprit is not None or not freeze.how.startswith("only"):
            when = f"after every `{path}.train()`" if culprit is not None else "before the training loop"
            fix = (f"{when}, put its BatchNorm layers in eval mode (`for m in {path}.modules(): "
                   f"if isinstance(m, nn.BatchNorm2d): m.eval()`)")
        else:
            fix = f"call `{path}.eval()` before the training loop"
        self.report(freeze.node, f"{subject} ({freeze.batchnorm}) {where}, but {mode}: its BatchNorm running "
                                 f"statistics keep moving with every training batch although its weights never "
                                 f"change, so the features drift and evaluation uses statistics the frozen weights "
                                 f"were not trained with; {fix}", related=related)
