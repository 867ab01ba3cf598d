"""TR117 optimizer-over-part-of-model: optimizer over a part of the model (model.fc) while the rest still computes
gradients every step.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import libcst as cst

from analyzers.context import FileContext, argument, call_receiver, dotted_name, method_name, short, uses_name
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.freezing import class_freezes_or_stops_gradient, program_freezes
from analyzers.program.values import builds_optimizer, fresh_model_constructor
from analyzers.rules.base import Invalid, Rule
from analyzers.program.loops import loop_stack, loop_trains
from analyzers.program.names import within as _within


# ``model.module`` (DataParallel / DDP), ``model._orig_mod`` (torch.compile): the whole model, not a part of it
_WHOLE = {"module", "_orig_mod", "model", "net", "network", "inner"}
# uses of a model's parameters that neither optimize nor freeze them
_BOOKKEEPING = {"clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "parameters_to_vector", "len", "print",
                "count_parameters", "sum", "list", "next", "numel"}

@dataclass
class _PartOptimizer:
    call: cst.Call
    name: Optional[str]  # the optimizer's variable
    part: str  # ``model.fc``
    model: str  # ``model``
    built: str  # what ``model`` is built from (the message names it)


class OptimizerOverPartOfTrainedModel(Rule):
    id = "TR117"
    source_hint = (re.compile(r"\.\w+\.parameters\(\)"), re.compile(r"backward"))
    slug = "optimizer-over-part-of-model"
    category = Category.TRAINING
    severity = Severity.MEDIUM
    summary = "optimizer over a part of the model (model.fc) while the rest still computes gradients every step"
    what = """
        Flags `optimizer = optim.X(model.fc.parameters(), ...)` (one part of a model) when the whole
        `model` runs in the training loss (`model(x)` in a loop that calls `.backward()`, outside
        `torch.no_grad()`), the model is built in the file (a torchvision/timm constructor or a module
        class), nothing in the file (nor in the file that defines the model's class) freezes parameters
        (`requires_grad = False`, `requires_grad_(False)`, a freeze helper) and no other optimizer,
        parameter group or `add_param_group` takes the rest of the model. Filtering (`filter(lambda p: p.requires_grad, ...)`) and separate optimizers per
        network (GANs) are not this case.
    """
    why = """
        `loss.backward()` computes a gradient for every parameter that requires one, whether or not an
        optimizer will use it. With only the head in the optimizer, the backbone's gradients are
        computed and stored every step and never applied: the backward pass costs about twice the
        forward for nothing, the gradient buffers take as much memory as the weights, and if the intent
        was to fine-tune the whole network, the backbone silently never changes. Either freeze the rest
        (faster, less memory) or give it to the optimizer.
    """
    example = """
        model = models.resnet18(weights="DEFAULT")
        model.fc = nn.Linear(512, 10)
        optimizer = optim.SGD(model.fc.parameters(), lr=0.01)
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    """
    fix_example = """
        model = models.resnet18(weights="DEFAULT")
        for p in model.parameters():
            p.requires_grad = False          # linear probe: freeze the backbone
        model.fc = nn.Linear(512, 10)        # the new head requires grad
        optimizer = optim.SGD(model.fc.parameters(), lr=0.01)
        # or fine-tune everything, the backbone with a smaller learning rate:
        # optimizer = optim.SGD([{"params": model.fc.parameters()},
        #                        {"params": backbone_params, "lr": 1e-3}], lr=0.01)
    """
    VALID = [
        # the backbone frozen first
        """
        import torch
        from torchvision import models
        model = models.resnet18(weights="DEFAULT")
        for p in model.parameters():
            p.requires_grad = False
        model.fc = torch.nn.Linear(512, 10)
        optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.01)
        for x, y in loader:
            criterion(model(x), y).backward()
            optimizer.step()
        """,
        # param groups, a filter over requires_grad, a second optimizer over the rest
        """
        import torch
        from torch import optim
        from torchvision import models
        model = models.resnet50()
        opt_head = optim.Adam(model.fc.parameters(), lr=1e-3)
        opt_body = optim.SGD([p for n, p in model.named_parameters() if not n.startswith("fc.")], lr=1e-4)
        for x, y in loader:
            criterion(model(x), y).backward()
            opt_head.step()
            opt_body.step()
        """,
        # GAN: one optimizer per network, each over the whole network
        """
        import torch.nn as nn
        import torch.optim as optim
        netG, netD = Generator(), Discriminator()
        optG = optim.Adam(netG.parameters(), lr=2e-4)
        optD = optim.Adam(netD.parameters(), lr=2e-4)
        for real in loader:
            errD = criterion(netD(real), ones) + criterion(netD(netG(z).detach()), zeros)
            errD.backward()
            optD.step()
        """,
        # the backbone runs under no_grad: only the head is in the graph
        """
        import torch
        from torchvision import models
        model = models.resnet18(weights="DEFAULT")
        optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.01)
        for x, y in loader:
            with torch.no_grad():
                feats = model.features(x)
            loss = criterion(model.fc(feats), y)
            loss.backward()
            optimizer.step()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn
            from torch import optim
            from torchvision import models
            model = models.resnet18(weights="DEFAULT")
            model.fc = nn.Linear(model.fc.in_features, 10)
            optimizer = optim.SGD(model.fc.parameters(), lr=0.01, momentum=0.9)
            for epoch in range(10):
                for images, labels in loader:
                    optimizer.zero_grad()
                    loss = nn.functional.cross_entropy(model(images), labels)
                    loss.backward()
                    optimizer.step()
            """,
            line=8, message="optimizes only `model.fc`, but the rest of `model` (`models.resnet18`)",
        ),
        Invalid(
            """
            import torch
            class Classifier(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.encoder = Encoder()
                    self.classifier = torch.nn.Linear(256, 2)
                def forward(self, x):
                    return self.classifier(self.encoder(x))
            def main():
                net = Classifier().cuda()
                opt = torch.optim.Adam(params=net.classifier.parameters(), lr=1e-3)
                step = 0
                while step < 1000:
                    for x, y in loader:
                        out = net.forward(x.cuda())
                        torch.nn.functional.cross_entropy(out, y.cuda()).backward()
                        opt.step()
                        opt.zero_grad()
                        step += 1
            """,
            line=12, message="`net.forward(x.cuda())`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.parts: list[_PartOptimizer] = []
        self.other_uses: dict[str, set[str]] = {}  # model -> paths whose parameters are used besides bookkeeping
        self.trained_calls: dict[str, cst.Call] = {}  # model called with autograd on in a training loop
        self.stepped: set[str] = set()
        self.param_groups_added = False

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        func = node.func
        if name in ("parameters", "named_parameters") and isinstance(func, cst.Attribute):
            path = dotted_name(func.value)
            if path is not None and not self._bookkeeping(node, ctx):
                self.other_uses.setdefault(path.split(".", 1)[0], set()).add(path)
            return
        if name == "step" and isinstance(func, cst.Attribute):
            receiver = dotted_name(func.value)
            if receiver is not None:
                self.stepped.add(receiver)
            for arg in node.args:  # scaler.step(optimizer)
                stepped = dotted_name(arg.value)
                if stepped is not None:
                    self.stepped.add(stepped)
            return
        if name == "add_param_group":
            self.param_groups_added = True
            return
        if isinstance(func, (cst.Name, cst.Attribute)) and node.args and builds_optimizer(node, ctx):
            self._optimizer(node, ctx)
            return
        callee = func.value if name == "forward" and isinstance(func, cst.Attribute) else func
        if isinstance(callee, cst.Name) and callee.value not in self.trained_calls and \
                ctx.qualified_name(callee) is None and not ctx.in_no_grad() and \
                any(loop_trains(lp, ctx) for lp in loop_stack(ctx)):
            self.trained_calls[callee.value] = node

    @staticmethod
    def _class_freezes_nothing(name: str, ctx: FileContext) -> bool:
        """The class is found (this file, or the repository), its file freezes no parameter and the class cuts no
        part out of the graph (``with torch.no_grad(): feats = self.backbone(x)``, ``.detach()``)."""
        return class_freezes_or_stops_gradient(name, ctx) is False

    @staticmethod
    def _bookkeeping(node: cst.Call, ctx: FileContext) -> bool:
        """``sum(p.numel() for p in model.parameters())``, ``clip_grad_norm_(model.parameters(), 1.0)``."""
        for ancestor in ctx.ancestors(node):
            if isinstance(ancestor, cst.Call):
                last = (dotted_name(ancestor.func) or "").rsplit(".", 1)[-1]
                if last in _BOOKKEEPING:
                    return True
                if last != "filter":
                    return False
            elif isinstance(ancestor, (cst.GeneratorExp, cst.ListComp)) and \
                    uses_name(ancestor.elt, "numel"):
                return True
            elif isinstance(ancestor, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return False
        return False

    def _optimizer(self, node: cst.Call, ctx: FileContext) -> None:
        params = argument(node, 0, "params")
        if not isinstance(params, cst.Call) or method_name(params) != "parameters" or params.args:
            return
        receiver = call_receiver(params)
        part = dotted_name(receiver) if receiver is not None else None
        if part is None or "." not in part or part.startswith("self."):
            return
        model, _, attr = part.rpartition(".")
        if attr in _WHOLE or "." in model:
            return  # ``model.module.parameters()`` is the whole model; deeper paths: a part of a part
        built = fresh_model_constructor(cst.parse_expression(model), ctx)
        if built is None:
            return
        parent = ctx.parent(node)
        target = parent.targets[0].target if isinstance(parent, cst.Assign) and len(parent.targets) == 1 else None
        self.parts.append(_PartOptimizer(node, dotted_name(target) if target is not None else None, part, model,
                                         built))

    def end_file(self, ctx: FileContext) -> None:
        if not self.parts or self.param_groups_added or program_freezes(ctx):
            return
        for found in self.parts:
            call = self.trained_calls.get(found.model)
            if call is None or (found.name is not None and found.name not in self.stepped):
                continue
            if found.built[:1].isupper() and not self._class_freezes_nothing(found.built, ctx):
                continue  # a project class defined elsewhere may freeze its own backbone
            if any(not _within(path, found.part) for path in self.other_uses.get(found.model, ())):
                continue  # another optimizer, a parameter group or an EMA takes the rest of the model
            self.report(found.call,
                        f"{code_span(short(ctx, found.call))} optimizes only `{found.part}`, but the rest of "
                        f"`{found.model}` (`{found.built}`) is not frozen and runs in the training loss "
                        f"({code_span(short(ctx, call, 40))}): every `backward()` computes gradients for all its "
                        f"other parameters, which no optimizer ever applies (time and memory spent for nothing, or "
                        f"a backbone meant to be fine-tuned that never changes); freeze them (`requires_grad = "
                        f"False`) or add them to the optimizer",
                        related=[(call, f"`{found.model}` runs in the training loss here")])
