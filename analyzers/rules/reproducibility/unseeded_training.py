"""TR901 unseeded-training: training entry point never seeds torch."""
from __future__ import annotations

from typing import Optional

import re
import libcst as cst

from analyzers.context import FileContext, argument, call_receiver, dotted_name, method_name, short
from analyzers.program.flow import subtree
from analyzers.program.modules import ModuleFacts
from analyzers.program.roles import is_test_code
from analyzers.program.values import seeds_private_generator
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule


# Calls named like seeding that do not seed torch's global generators.
_NOT_TORCH_SEED = {
    "random.seed", "numpy.random.seed", "tensorflow.random.set_seed", "tensorflow.set_random_seed",
    "torch.seed", "torch.random.seed", "torch.cuda.seed", "torch.cuda.seed_all", "torch.initial_seed",
    "torch.random.initial_seed", "torch.cuda.initial_seed",
}
_READ_SEED = ("initial_seed", "get_seed", "get_rng_state")
# Per-iteration helpers: library code called by an entry point, not the entry point itself.
_HELPER_WORDS = ("epoch", "step", "batch", "one", "iter", "single")


def _is_main_guard(test: cst.BaseExpression) -> bool:
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    if not isinstance(target.operator, cst.Equal):
        return False
    sides = {dotted_name(test.left), dotted_name(target.comparator)}
    strings = [s for s in (test.left, target.comparator) if isinstance(s, cst.SimpleString)]
    return "__name__" in sides and any(s.evaluated_value == "__main__" for s in strings)


def _entry_function(name: str) -> bool:
    lowered = name.lower()
    if lowered == "main" or lowered.endswith("_main") or lowered.startswith("main_"):
        return True
    return lowered.startswith("train") and not any(w in lowered for w in _HELPER_WORDS)


class UnseededTraining(Rule):
    id = "TR901"
    source_hint = re.compile(r"backward")  # reported on the first backward()
    slug = "unseeded-training"
    category = Category.REPRODUCIBILITY
    severity = Severity.LOW
    summary = "training entry point never seeds torch"
    what = """
        Flags a training script — a file with an `if __name__ == "__main__":` block, a
        `main`/`train*` function that the file itself calls, or a module-level loop that runs
        `.backward()` and `.step()`, or a notebook with such a `main`/`train*` function —
        that never seeds torch: no `torch.manual_seed`, `torch.cuda.manual_seed(_all)`,
        `seed_everything`, `transformers.set_seed`, `accelerate.utils.set_seed`, and no call to a
        function whose name contains `seed` (your own `set_seed(42)` counts). Reported once,
        on the first `.backward()` call. Modules without an entry point are not checked.
    """
    why = """
        Weight initialization, dropout, data shuffling and augmentation all draw from torch's
        random generators. Without a seed two runs of the same script give different results,
        so a change cannot be told apart from noise and a reported number cannot be reproduced.
        `random.seed`/`numpy.random.seed` alone do not seed torch.
    """
    example = """
        def main():
            model = Net()
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
    """
    fix_example = """
        def main():
            torch.manual_seed(42)  # or lightning.seed_everything(42) / transformers.set_seed(42)
            model = Net()
            ...
    """
    VALID = [
        # style transfer: the optimized tensor is a copy of the content image, nothing random is initialized
        """
        import torch
        target = content.clone().requires_grad_(True)
        optimizer = torch.optim.Adam([target], lr=0.003)
        for step in range(2000):
            loss = style_loss(vgg(target))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """,
        # seeded
        """
        import torch
        def main():
            torch.manual_seed(0)
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
                opt.step()
        if __name__ == "__main__":
            main()
        """,
        # own helper
        """
        import torch
        from utils import set_seed
        set_seed(1234)
        for x, y in loader:
            loss = crit(model(x), y)
            loss.backward()
            opt.step()
        """,
        # library module: no entry point
        """
        import torch
        def train_one_epoch(model, loader, opt):
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
                opt.step()
        """,
        # Lightning seeding
        """
        import torch
        import lightning as L
        def train(cfg):
            L.seed_everything(cfg.seed)
            loss = step(model)
            loss.backward()
            opt.step()
        """,
        # a helper module: defines train() but never runs it
        """
        import torch
        def train(model, trainloader, criterion, optimizer, epochs=5):
            for e in range(epochs):
                for images, labels in trainloader:
                    optimizer.zero_grad()
                    loss = criterion(model(images), labels)
                    loss.backward()
                    optimizer.step()
        """,
        # a library module: its Fitter trains when imported and used; the __main__ block only draws samples
        """
        import torch
        from torchvision import datasets
        class Fitter:
            def __init__(self, net, root):
                self.net, self.data = net, datasets.ImageFolder(root)
                self.opt = torch.optim.Adam(net.parameters())
            def fit(self, loader):
                for x, _ in loader:
                    self.net.loss(x).backward()
                    self.opt.step()
        def draw(net, n):
            return net.sample(n)
        if __name__ == "__main__":
            print(draw(build_denoiser(), 4).shape)
        """,
        # an autograd demonstration, not a training loop
        """
        import torch
        x = torch.ones(2, requires_grad=True)
        y = (x * 2).sum()
        y.backward()
        optimizer.step()
        """,
        # no training loop (inference script)
        """
        import torch
        if __name__ == "__main__":
            with torch.no_grad():
                print(model(x))
        """,
    ]
    INVALID = [
        # only a private generator is seeded (for random_split): model init and shuffling are not
        Invalid(
            """
            import torch
            from torch.utils.data import random_split
            loader = DataLoader(datasets.CIFAR10("data", train=True, download=True))
            train, val = random_split(data, [0.9, 0.1], generator=torch.Generator().manual_seed(42))
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
            """,
            line=8,
        ),
        Invalid(
            """
            import torch
            loader = DataLoader(datasets.CIFAR10("data", train=True, download=True))
            def main():
                for x, y in loader:
                    loss = model(x).sum()
                    loss.backward()
                    opt.step()
            if __name__ == "__main__":
                main()
            """,
            line=7, message="loss.backward()",
        ),
        Invalid(
            """
            import random
            import numpy as np
            import torch
            loader = DataLoader(datasets.CIFAR10("data", train=True, download=True))
            random.seed(0)
            np.random.seed(0)
            def train(model, loader, optimizer):
                for batch in loader:
                    optimizer.zero_grad()
                    model(batch).mean().backward()
                    optimizer.step()
            train(model, loader, optimizer)
            """,
            line=11, message="train()",
        ),
        Invalid(
            """
            import torch
            loader = DataLoader(datasets.CIFAR10("data", train=True, download=True))
            for epoch in range(10):
                for x, y in loader:
                    loss = criterion(model(x), y)
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
            """,
            line=7,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.main_guard: Optional[cst.If] = None
        self.backward: Optional[cst.Call] = None  # first backward
        self.backward_owner: Optional[str] = None
        self.entry_backward = False  # a training step at module level, in a loop
        self.entry_functions: set[str] = set()  # main()/train*() that train
        self.called_at_module_level: set[str] = set()
        self.has_step = False
        self.seeded = False
        # what the optimizers update: a model's parameters, or plain tensors (style transfer, adversarial
        # inputs: nothing random is initialized when an input image is what is optimized)
        self.optimizes_parameters = False
        self.optimizes_tensors = False
        self.project_classes: set[str] = set()
        self.training_definitions: set[str] = set()  # module-level functions / classes whose body calls backward

    def visit_If(self, node: cst.If, ctx: FileContext) -> None:
        if self.main_guard is None and not ctx.functions and _is_main_guard(node.test):
            self.main_guard = node

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if name is None:
            return
        if not ctx.functions and isinstance(node.func, cst.Name):
            self.called_at_module_level.add(node.func.value)
        if name[:1].isupper() and ctx.call_name(node) is None:
            self.project_classes.add(dotted_name(node.func) or name)  # a Dataset of this repository, maybe
        qualified = ctx.call_name(node) or ""
        if qualified.startswith("torch.optim.") and ".lr_scheduler." not in qualified:
            params = argument(node, 0, "params")
            if isinstance(params, (cst.List, cst.Tuple)) and all(
                    isinstance(e.value, (cst.Name, cst.Attribute)) for e in params.elements):
                self.optimizes_tensors = True
            else:
                self.optimizes_parameters = True
        if name == "backward":
            if call_receiver(node) is None:
                return
            fn = ctx.function_def
            if fn is None and ctx.loop is None:
                return  # a one-off autograd demonstration (``y.backward()`` in an API tour), not training
            if self.backward is None:
                self.backward = node
                self.backward_owner = f"{fn.name.value}()" if fn is not None else "the module-level loop"
            top = next((a for a in ctx.ancestors(node) if isinstance(a, (cst.FunctionDef, cst.ClassDef))
                        and isinstance(ctx.parent(a), cst.Module)), None)
            if top is not None:
                self.training_definitions.add(top.name.value)
            if fn is None:
                self.entry_backward = True
            elif _entry_function(fn.name.value):
                self.entry_functions.add(fn.name.value)
        elif name == "step":
            if call_receiver(node) is not None:
                self.has_step = True
        elif not self.seeded and "seed" in name.lower():
            if name.endswith(_READ_SEED):
                return
            if seeds_private_generator(node, ctx):
                return  # ``torch.Generator().manual_seed(0)`` for random_split: the global generator stays unseeded
            qualified = ctx.call_name(node)
            if qualified not in _NOT_TORCH_SEED:
                self.seeded = True

    def _guard_trains(self, ctx: FileContext) -> bool:
        """Does the ``__main__`` block reach the training code: does it name (directly, or through the
        module-level functions and classes it names) a definition whose body calls backward? A library module
        whose ``__main__`` block only demonstrates sampling does not train."""
        if not self.training_definitions:
            return True  # backward outside any module-level definition: nothing to trace
        definitions = {stmt.name.value: stmt for stmt in ctx.module.body
                       if isinstance(stmt, (cst.FunctionDef, cst.ClassDef))}
        pending = [self.main_guard]
        reached: set[str] = set()
        while pending:
            node = pending.pop()
            for inner in subtree(node):
                if isinstance(inner, cst.Name) and inner.value in definitions and inner.value not in reached:
                    if inner.value in self.training_definitions:
                        return True
                    reached.add(inner.value)
                    pending.append(definitions[inner.value])
        return False

    def end_file(self, ctx: FileContext) -> None:
        if self.seeded or self.backward is None or not self.has_step or is_test_code(ctx):
            return
        if self.optimizes_tensors and not self.optimizes_parameters:
            return  # it optimizes an input (``optim.Adam([target])``), not a randomly initialized model
        if not ctx.facts(ModuleFacts).reads_data(self.project_classes):
            # synthetic or toy data only (``torch.rand`` batches, a literal array): an API demonstration or a
            # smoke test, whose numbers nobody reports
            return
        # A script runs: a __main__ guard, a training loop at module level, or a main()/train() it calls
        # itself. A module that only defines train() is a library: seeding belongs to whoever calls it.
        # A notebook is run, never imported: the train() it defines is there to be run, even when the cell that
        # calls it is not Python yet (an exercise's blanks, ``batch_size = ``) and was left out of the analysis.
        runs = (self.main_guard is not None and self._guard_trains(ctx)) or self.entry_backward or \
            bool(self.entry_functions & self.called_at_module_level) or \
            (ctx.path.endswith(".ipynb") and bool(self.entry_functions))
        if not runs:
            return
        shown = short(ctx, self.backward)
        self.report(self.backward, f"{shown} in {self.backward_owner} trains, but this script never seeds torch: "
                                   f"initialization, dropout and shuffling differ on every run; call "
                                   f"torch.manual_seed(seed) (or seed_everything/set_seed) at start-up")
