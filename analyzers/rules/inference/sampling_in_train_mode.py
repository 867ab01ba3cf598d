"""TR203 sampling-in-train-mode: samples generated for images inside the training loop with autograd on or
BatchNorm/dropout in train mode.
"""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import (
    FileContext,
    dotted_name,
    method_name)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.flow import subtree
from analyzers.program.loops import loop_stack, loop_trains
from analyzers.program.names import node_text
from analyzers.program.values import (changes_in_eval, is_model_call)
from analyzers.rules.base import Invalid, Rule


# where generated images end: files, grids, TensorBoard, plots
_IMAGE_SINKS = {"save_image", "make_grid", "imshow", "imsave", "add_image", "add_images", "add_video"}
# methods that keep "this is the model's output" (a view, a copy, a scaled version)
_SAME_OUTPUT = {"detach", "cpu", "numpy", "clamp", "clamp_", "mul", "mul_", "add", "add_", "div", "div_", "sub",
                "permute", "squeeze", "unsqueeze", "view", "reshape", "to", "float", "clone", "transpose",
                "contiguous", "tolist"}
_SAMPLING_METHODS = {"sample", "generate", "decode", "forward"}
_TENSOR_FUNCTIONS = ("torch.cat", "torch.stack", "torch.clamp")


class SamplingInTrainMode(Rule):
    id = "TR203"
    source_hint = (re.compile(r"save_image|make_grid|imshow|imsave|add_image|add_video"), re.compile(r"backward"))
    slug = "sampling-in-train-mode"
    category = Category.INFERENCE
    severity = Severity.MEDIUM
    summary = "samples generated for images inside the training loop with autograd on or BatchNorm/dropout in train mode"
    what = """
        Flags a model call inside a training loop (a loop that calls `.backward()`) whose output
        only goes to pictures - `save_image`, `make_grid`, `imshow`, `writer.add_image(s)` - when
        it runs outside `torch.no_grad()`, or while the model, which holds BatchNorm or dropout,
        is still in train mode (no `model.eval()` before it in the loop). The GAN
        `fake = netG(fixed_noise)` snapshot is the typical case.
    """
    why = """
        Outside `no_grad` the sampling pass records a full autograd graph, with every activation,
        that nothing ever backpropagates: memory and time for nothing, kept until the variable is
        overwritten. In train mode BatchNorm normalizes the fixed batch with its own statistics
        and folds them into the running averages the model is evaluated with later, and dropout
        drops units, so the saved samples are not what the model generates.
    """
    example = """
        for i, (real, _) in enumerate(loader):
            ...
            errG.backward()
            optimizerG.step()
            if i % 100 == 0:
                fake = netG(fixed_noise)
                vutils.save_image(fake.detach(), f"fake_{epoch}.png", normalize=True)
    """
    fix_example = """
            if i % 100 == 0:
                netG.eval()
                with torch.no_grad():
                    fake = netG(fixed_noise)
                netG.train()
                vutils.save_image(fake, f"fake_{epoch}.png", normalize=True)
    """
    VALID = [
        """
        import torch
        import torchvision.utils as vutils
        for epoch in range(10):
            for x in loader:
                loss = netG(torch.randn(8, 100)).mean()
                loss.backward()
                opt.step()
            netG.eval()
            with torch.no_grad():
                fake = netG(fixed_noise)
            netG.train()
            vutils.save_image(fake, "fake.png")
        """,
        # the output is trained on, then also saved
        """
        import torch
        from torchvision.utils import save_image
        for x, _ in loader:
            fake = G(torch.randn(64, 100))
            g_loss = criterion(D(fake), ones)
            g_loss.backward()
            opt.step()
            save_image(fake.detach(), "fake.png")
        """,
        # a model without BatchNorm or dropout, under no_grad: eval() would change nothing
        """
        import torch
        import torch.nn as nn
        from torchvision.utils import save_image
        G = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 784), nn.Tanh())
        for x in loader:
            G(x).mean().backward()
            opt.step()
            with torch.no_grad():
                save_image(G(z).view(-1, 1, 28, 28), "sample.png")
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torchvision.utils as vutils
            for epoch in range(25):
                for i, data in enumerate(dataloader):
                    errG = criterion(netD(netG(noise)), label)
                    errG.backward()
                    optimizerG.step()
                    if i % 100 == 0:
                        fake = netG(fixed_noise)
                        vutils.save_image(fake.detach(), "fake_samples_%03d.png" % epoch, normalize=True)
            """,
            line=10, message="`netG(fixed_noise)`",
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            from torchvision.utils import make_grid
            G = nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 784))
            for x in loader:
                G(x).mean().backward()
                opt.step()
                with torch.no_grad():
                    writer.add_image("samples", make_grid(G(z).view(-1, 1, 28, 28)), step)
            """,
            line=10, message="train mode",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        # (call, what it calls, outermost loop, autograd on, named like a model)
        self.candidates: list[tuple[cst.Call, cst.BaseExpression, cst.CSTNode, bool, bool]] = []

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in _SAMPLING_METHODS:
            func = func.value
        if dotted_name(func) is None or ctx.qualified_name(func) is not None:
            return
        stack = loop_stack(ctx)
        if not stack or not any(loop_trains(loop, ctx) for loop in stack):
            return
        # where the output goes is known only once the walk has seen the statements after this one
        self.candidates.append((node, func, stack[0], not ctx.in_no_grad(), is_model_call(func, ctx)))

    def end_file(self, ctx: FileContext) -> None:
        if not self.candidates:
            return
        trained = {dotted_name(node.func.value) for node in subtree(ctx.module)
                   if isinstance(node, cst.Call) and method_name(node) == "parameters"
                   and isinstance(node.func, cst.Attribute)} - {None}  # optimizers are built over models
        for node, model, loop, recording, model_like in self.candidates:
            if not (model_like or dotted_name(model) in trained) or not self._only_pictured(node, ctx):
                continue
            train_mode = not self._evaluated_before(model, node, loop, ctx) and changes_in_eval(ctx, model, node)
            if recording or train_mode:
                self._report(node, model, recording, train_mode, ctx)

    def _report(self, node: cst.Call, model: cst.BaseExpression, recording: bool, train_mode: bool,
                ctx: FileContext) -> None:
        problems = []
        if recording:
            problems.append("outside `torch.no_grad()` it records an autograd graph nothing backpropagates")
        if train_mode:
            problems.append(f"`{node_text(ctx, model)}` is in train mode, so its BatchNorm/dropout layers act as in "
                            f"training (batch statistics, running averages updated from this batch, units dropped)")
        fix = " and ".join(part for part, wanted in (
            (f"`{node_text(ctx, model)}.eval()`", train_mode), ("`with torch.no_grad():`", recording)) if wanted)
        self.report(node, f"{code_span(node_text(ctx, node))} generates samples for pictures inside the training loop: "
                          f"{'; '.join(problems)}; use {fix} around it (and `.train()` after)")

    def _only_pictured(self, node: cst.Call, ctx: FileContext) -> bool:
        """Every path of the output ends in an image sink (and at least one does)."""
        end = self._follow(node, ctx)
        if isinstance(end, cst.Call):
            return True
        if not isinstance(end, cst.Name):
            return False
        statement = ctx.statement_of(node)
        line = ctx.parent(statement)
        block = ctx.parent(line)
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return False
        later = list(block.body)[list(block.body).index(line) + 1:]
        pictured = False
        for following in later:
            for use in subtree(following):
                parent = ctx.parent(use)
                if isinstance(use, cst.Name) and use.value == end.value and not isinstance(parent, cst.AssignTarget) \
                        and not (isinstance(parent, cst.Attribute) and parent.attr is use):
                    if not isinstance(self._follow(use, ctx), cst.Call):
                        return False
                    pictured = True
            if any(isinstance(n, cst.AssignTarget) and dotted_name(n.target) == end.value for n in subtree(following)):
                break  # rebound: later uses read another value
        return pictured

    @staticmethod
    def _follow(expr: cst.CSTNode, ctx: FileContext) -> Optional[cst.CSTNode]:
        """Follow an output up through views and copies: the image sink call it ends in, the Name it is assigned
        to, or None when it goes anywhere else."""
        current = expr
        while True:
            parent = ctx.parent(current)
            if isinstance(parent, cst.Attribute) and parent.value is current:
                call = ctx.parent(parent)
                if parent.attr.value == "data":
                    current = parent
                elif isinstance(call, cst.Call) and call.func is parent and parent.attr.value in _SAME_OUTPUT:
                    current = call
                else:
                    return None
            elif isinstance(parent, (cst.Subscript, cst.BinaryOperation, cst.Element, cst.List, cst.Tuple)):
                current = parent
            elif isinstance(parent, cst.Arg):
                call = ctx.parent(parent)
                if not isinstance(call, cst.Call):
                    return None
                name = dotted_name(call.func) or ""
                if name.rsplit(".", 1)[-1] in _IMAGE_SINKS:
                    return call
                if ctx.qualified_name(call.func) in _TENSOR_FUNCTIONS or (
                        isinstance(call.func, cst.Name) and ctx.binding(call.func.value) is not None
                        and ctx.binding(call.func.value).kind == "def"):
                    current = call  # torch.cat([real, fake]) / denorm(fake)
                else:
                    return None
            elif isinstance(parent, cst.Assign) and parent.value is current and len(parent.targets) == 1 and \
                    isinstance(parent.targets[0].target, cst.Name):
                return parent.targets[0].target
            else:
                return None

    @staticmethod
    def _evaluated_before(model: cst.BaseExpression, node: cst.CSTNode, loop: cst.CSTNode,
                          ctx: FileContext) -> bool:
        wanted = node_text(ctx, model)
        for earlier in subtree(loop):
            if earlier is node:
                return False
            if isinstance(earlier, cst.Call) and method_name(earlier) == "eval" and isinstance(
                    earlier.func, cst.Attribute) and node_text(ctx, earlier.func.value) == wanted:
                return True
        return False
