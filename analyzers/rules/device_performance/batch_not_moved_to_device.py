"""TR705 batch-not-moved-to-device: model moved to a (CUDA-capable) device, but the batches of its DataLoader loop are
fed to it unmoved.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import re
import libcst as cst

from analyzers.context import (FileContext, argument, call_receiver, dotted_name, keyword_arg,
                               method_name, short, string_value)
from analyzers.program.data import hands_a_collate_function
from analyzers.program.flow import assignment_before, call_site_values, may_run_before, parameter_index, targets
from analyzers.program.library import is_data_loader, is_data_parallel
from analyzers.program.loops import iterated
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Rule
from analyzers.program.devices import (BatchFlow, CpuBatchUse, expression_nodes, is_cuda_device as _is_cuda_device,
                                       receiver_root as _receiver_root, observe_assign as _observe_assign,
                                       chain_top as _chain_top, to_moves_device as _to_moves_device,
                                       places_on_a_device, yields_host_tensors)


_CPU_DATASETS = ("torchvision.", "torchaudio.")


def _target_paths(target: cst.BaseExpression) -> list[str]:
    """``self.loader`` for ``self.loader = ...``; every element's path for ``self.model, self.loader = ...``."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [path for element in target.elements for path in _target_paths(element.value)]
    if isinstance(target, cst.StarredElement):
        return _target_paths(target.value)
    path = dotted_name(target)
    return [path] if path is not None else []


@dataclass
class _LoaderLoop:
    loop: cst.For
    fn: Optional[cst.FunctionDef]
    cls: Optional[cst.ClassDef]
    iterable: cst.BaseExpression  # the loader expression, unwrapped from enumerate()/tqdm()


class BatchNotMovedToDevice(Rule):
    id = "TR705"
    source_hint = (re.compile(r"DataLoader"), re.compile(r"\.(?:to|cuda)\s*\("))
    slug = "batch-not-moved-to-device"
    category = Category.DEVICE
    severity = Severity.HIGH
    summary = "model moved to a (CUDA-capable) device, but the batches of its DataLoader loop are fed to it unmoved"
    what = """
        Flags a call of a model that was moved with `.to(device)` / `.cuda()` (to a device that can
        be CUDA: `"cuda" if torch.cuda.is_available() else "cpu"`, `args.device`...) inside a loop
        over a `torch.utils.data.DataLoader` of this file, when an input of the call comes from the
        loader's batch and nothing in the loop moves it: `.to(...)`/`.cuda()` on it, or any helper
        that handles devices. A `x.to(device)` whose result is thrown away does not count as a
        move. Quiet when the loader has a `collate_fn`, when its dataset is not one the file shows
        to stay on the CPU (torchvision/torchaudio data sets, `TensorDataset` of unmoved tensors, a
        `Dataset` class of the file that never mentions a device), when the model is wrapped in
        `DataParallel`/`DistributedDataParallel` (they move inputs themselves), or when the
        model's class moves its inputs in `forward`.
    """
    why = """
        A DataLoader yields CPU tensors. The model's parameters are on the GPU, so the first
        forward raises "Expected all tensors to be on the same device" as soon as the script runs
        where CUDA is available, typically on the training machine, after a CPU-only test passed.
        A `tensor.to(device)` written as a statement does nothing: unlike `Module.to`, it returns
        a moved copy and leaves the tensor where it was.
    """
    example = """
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Net().to(device)
        for images, labels in train_loader:
            labels = labels.to(device)
            loss = criterion(model(images), labels)
    """
    fix_example = """
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Net().to(device)
        for images, labels in train_loader:
            images, labels = images.to(device), labels.to(device)
            loss = criterion(model(images), labels)
    """
    VALID = [
        # every batch value is moved, in each of the usual spellings
        """
        import torch
        from torch.utils.data import DataLoader
        from torchvision import datasets
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Net().to(device)
        loader = DataLoader(datasets.MNIST("data", download=True), batch_size=64)
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            out = model(data)
        for i, (images, labels) in enumerate(loader):
            images = images.reshape(-1, 28 * 28).to(device)
            out = model(images)
        for batch in loader:
            batch = tuple(t.to(device) for t in batch)
            x, y = batch
            out = model(x)
        for x, y in loader:
            out = model(x.to(device, non_blocking=True))
        for x, y in loader:
            if use_cuda:
                x, y = x.cuda(), y.cuda()
            out = model(x)
        """,
        # a helper moves the batch; a collate_fn may; DataParallel scatters CPU inputs itself
        """
        import torch
        from torch.utils.data import DataLoader
        from torchvision.datasets import CIFAR10
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = Net().to(device)
        loader = DataLoader(CIFAR10("data"), batch_size=64)
        for batch in loader:
            batch = to_device(batch, device)
            out = model(batch[0])
        gpu_loader = DataLoader(CIFAR10("data"), collate_fn=collate_to_gpu)
        for x, y in gpu_loader:
            out = model(x)
        """,
        # the loop runs before anything moves the model (a tutorial that moves it further down, for its GPU
        # part): model and batches are both on the CPU there
        """
        import torch
        from torch.utils.data import DataLoader
        from torchvision.datasets import FashionMNIST
        loader = DataLoader(FashionMNIST("data", download=True), batch_size=32)
        classifier = SmallNet()
        for pictures, targets in loader:
            scores = classifier(pictures)
        gpu = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        classifier.to(gpu)
        """,
        """
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader
        from torchvision.datasets import CIFAR10
        model = nn.DataParallel(Net()).cuda()
        for x, y in DataLoader(CIFAR10("data")):
            out = model(x)
        """,
        # a loader rebound by accelerate's prepare (it moves the batches); a legacy GAN's ``.type(Tensor)`` copy,
        # ``Tensor`` being ``torch.cuda.FloatTensor`` when CUDA is used
        """
        import torch
        from accelerate import Accelerator
        from torch.utils.data import DataLoader, TensorDataset
        from torchvision.datasets import MNIST
        accelerator = Accelerator()
        model = Net().to(accelerator.device)
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64)), batch_size=8)
        model, opt, loader = accelerator.prepare(model, opt, loader)
        for x, y in loader:
            out = model(x)
        cuda = torch.cuda.is_available()
        critic = Critic()
        if cuda:
            critic.cuda()
        Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
        for imgs, _ in DataLoader(MNIST("data"), batch_size=64):
            score = critic(imgs.type(Tensor))
        """,
        # the model stays on the CPU; a data set of the file that already holds GPU tensors
        """
        import torch
        from torch.utils.data import DataLoader, Dataset, TensorDataset
        model = Net()
        loader = DataLoader(TensorDataset(xs, ys), batch_size=8)
        for x, y in loader:
            out = model(x)
        class OnGpu(Dataset):
            def __getitem__(self, i):
                return self.x[i].to(self.device)
        net = Net().cuda()
        for x in DataLoader(OnGpu()):
            out = net(x)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            from torchvision import datasets
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            train_loader = DataLoader(datasets.MNIST("data", train=True), batch_size=64, shuffle=True)
            for epoch in range(10):
                for images, labels in train_loader:
                    labels = labels.to(device)
                    loss = criterion(model(images), labels)
            """,
            line=11, message="`images` from `train_loader` reaches `model(...)`",
        ),
        # options built as a dict: no collate function is ever handed over, whatever the comment says
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            from torchvision import datasets
            device = torch.device("cuda")
            model = Net().to(device)
            options = {"batch_size": 64, "shuffle": True}
            options.update({"num_workers": 2})  # the default collate stacks the samples
            train_loader = DataLoader(datasets.MNIST("data", train=True), **options)
            for images, labels in train_loader:
                loss = criterion(model(images), labels.to(device))
            """,
            line=11, message="`images` from `train_loader` reaches `model(...)`",
        ),
        # the loop before the move runs on the CPU; the one after it feeds CPU batches to a GPU model
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            from torchvision.datasets import FashionMNIST
            loader = DataLoader(FashionMNIST("data", download=True), batch_size=32)
            classifier = SmallNet()
            for pictures, targets in loader:
                scores = classifier(pictures)
            classifier.to(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
            for pictures, targets in loader:
                scores = classifier(pictures)
            """,
            line=11, message="`pictures` from `loader` reaches `classifier(...)`",
        ),
        # the loader passed to a training function; ``x.to(device)`` thrown away
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset

            def train(net, loader, optimizer, device):
                for step, (x, y) in enumerate(loader):
                    x.to(device)
                    y = y.to(device)
                    out = net(x.view(x.size(0), -1))
                    loss = F.nll_loss(out, y)

            device = "cuda:0" if torch.cuda.is_available() else "cpu"
            model = MLP().to(device)
            data = DataLoader(TensorDataset(torch.randn(100, 4), torch.randint(0, 2, (100,))), batch_size=10)
            train(model, data, opt, device)
            """,
            line=9, message="`x.to(device)` on line 7 returns a moved copy that is thrown away",
        ),
        # a model attribute, a dict batch given as keywords
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            from torchvision.datasets import ImageFolder

            class Trainer:
                def __init__(self, args):
                    self.model = Classifier().to(args.device)
                    self.loader = None

                def fit(self):
                    loader = DataLoader(ImageFolder("train"), batch_size=32, shuffle=True)
                    for batch in tqdm(loader, desc="train"):
                        logits = self.model(batch[0])
            """,
            line=14, message="`self.model`",
        ),
        # arrays converted to another dtype stay on the host: ``.to(torch.float32)`` is not a move
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            device = torch.device("cuda")
            model = Regressor().to(device)
            features = torch.from_numpy(table).to(torch.float32)
            targets = torch.from_numpy(prices).to(torch.float32)
            loader = DataLoader(TensorDataset(features, targets), batch_size=32, shuffle=True)
            for x, y in loader:
                loss = criterion(model(x), y)
            """,
            line=10, message="`x` from `loader` reaches `model(...)`",
        ),
        # a data set class of the file that makes host tensors: a docstring naming the device moves nothing
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader, Dataset
            class Windows(Dataset):
                '''Sliding windows of a series; the training loop is meant to move them to the device.'''
                def __init__(self, series):
                    self.series = torch.as_tensor(series)
                def __len__(self):
                    return len(self.series) - 8
                def __getitem__(self, i):
                    return self.series[i:i + 8], self.series[i + 8]
            model = Forecaster().cuda()
            loader = DataLoader(Windows(values), batch_size=16)
            for window, target in loader:
                prediction = model(window)
            """,
            line=15, message="`window` from `loader` reaches `model(...)`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.loops: list[_LoaderLoop] = []
        # (scope, name) -> the call that moved that module to a device that can be CUDA; the scope is the
        # enclosing function (None: module level) or, for ``self.x``, the class
        self.moved: dict[tuple[Optional[int], str], cst.Call] = {}
        self.wrapped = False  # DataParallel / DistributedDataParallel scatter CPU inputs themselves
        self.moved_back: set[str] = set()  # modules also moved to the CPU somewhere: which device holds them is unclear

    def visit_Assign(self, node: cst.Assign, ctx: FileContext) -> None:
        _observe_assign(node, ctx)  # ``device = ...`` in one branch of an ``if``: its CUDA names

    def visit_For(self, node: cst.For, ctx: FileContext) -> None:
        iterable = iterated(node.iter)
        if isinstance(iterable, (cst.Name, cst.Attribute, cst.Call)):
            self.loops.append(_LoaderLoop(node, ctx.function_def, ctx.class_def, iterable))

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if name in ("DataParallel", "DistributedDataParallel") and is_data_parallel(ctx.call_name(node)):
            self.wrapped = True
            return
        if name == "cpu" or (name == "to" and string_value(argument(node, 0, "device")) == "cpu"):
            back = call_receiver(node)
            if isinstance(back, (cst.Name, cst.Attribute)):
                self.moved_back.add(dotted_name(back) or "")  # ``model.cpu()`` for export or CPU inference
            return
        if name == "cuda":
            cuda = not any(a.keyword is None and not isinstance(a.value, cst.Integer) for a in node.args)
        elif name == "to" and _to_moves_device(node, ctx):
            device = keyword_arg(node, "device")
            cuda = _is_cuda_device(device.value if device is not None else argument(node, 0, "device"), ctx)
        else:
            return
        if not cuda:
            return
        statement = ctx.statement_of(node)
        moved: Optional[str] = None
        if isinstance(statement, cst.Assign) and len(statement.targets) == 1 and _chain_top(node, ctx) is \
                statement.value:
            moved = dotted_name(statement.targets[0].target)
        elif isinstance(statement, cst.Expr) and statement.value is node:
            moved = dotted_name(call_receiver(node))
        if moved is None or "loss" in moved.lower() or "criterion" in moved.lower():
            return
        if moved.startswith("self."):
            scope = id(ctx.class_def) if ctx.class_def is not None else None
        else:
            scope = id(ctx.function_def) if ctx.function_def is not None else None
        self.moved.setdefault((scope, moved), node)

    def end_file(self, ctx: FileContext) -> None:
        if self.wrapped or not self.moved:
            return
        for entry in self.loops:
            loader = self._loader(entry.iterable, entry.loop, entry.fn, 0, entry.cls)
            if loader is None or not self._stays_on_cpu(loader, ctx):
                continue
            flow = BatchFlow([n for n in self._batch_names(entry.loop)], ctx)
            flow.run(entry.loop.body.body)
            for use in flow.uses:
                move = self._model_move(use.callee, entry)
                if move is None or self._forward_moves_inputs(move, ctx) or not may_run_before(ctx, move, entry.loop):
                    continue
                self.report(use.call, self._message(use, entry, move, ctx), related=((move, "the model is moved here"),))
                break

    def _message(self, use: CpuBatchUse, entry: _LoaderLoop, move: cst.Call, ctx: FileContext) -> str:
        loader = short(ctx, entry.iterable, 40)
        if method_name(move) == "to":
            target = keyword_arg(move, "device")
            device_node = target.value if target is not None else move.args[0].value
            device = ctx.module.code_for_node(device_node)
            moved_to = f"`.to({device})`"
            device = self._device_in_loop(device_node, device, move, entry)
            copy = f".to({device})"
        else:
            device, moved_to, copy = "the GPU", "`.cuda()`", ".cuda()"
        # one code-generation pass for both lines
        positions = ctx.positions([n for n in (move, use.discarded_move) if n is not None])
        line = positions[move].start.line
        if use.discarded_move is not None:
            discarded_line = positions[use.discarded_move].start.line
            how = (f"`{short(ctx, use.discarded_move, 40)}` on line {discarded_line} returns a moved copy that is "
                   f"thrown away (a tensor's `.to` is not in place), so `{use.argument}` from `{loader}` still "
                   f"reaches `{use.callee}(...)` on the CPU")
            fix = f"keep the copy: `{use.root} = {short(ctx, use.discarded_move, 40)}`"
        else:
            how = f"`{use.argument}` from `{loader}` reaches `{use.callee}(...)` without being moved"
            fix = (f"move it in the loop (`{use.root} = {use.root}{copy}`)" if use.argument == use.root
                   else f"move each tensor of `{use.root}` to {device if device == 'the GPU' else f'`{device}`'} "
                        f"in the loop")
        return (f"{how}, while `{use.callee}` was moved with {moved_to} (line {line}): a DataLoader yields CPU "
                f"tensors, so where CUDA is available the forward raises \"Expected all tensors to be on the same "
                f"device\"; {fix}")

    def _device_in_loop(self, device_node: cst.BaseExpression, device: str, move: cst.Call,
                        entry: _LoaderLoop) -> str:
        """The device as the loop can spell it: ``self.device`` for a trainer whose ``__init__`` moved the model with
        its ``device`` parameter and kept it (``self.device = device``)."""
        if entry.cls is None or self._function_of(move) is entry.fn or \
                not isinstance(device_node, cst.Name):
            return device
        for node in expression_nodes(entry.cls.body):
            if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Name) and \
                    node.value.value == device and (dotted_name(node.targets[0].target) or "").startswith("self."):
                return dotted_name(node.targets[0].target) or device
        return device

    @staticmethod
    def _batch_names(loop: cst.For) -> list[str]:
        target = loop.target
        if isinstance(loop.iter, cst.Call) and dotted_name(loop.iter.func) == "enumerate" and \
                isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2:
            target = target.elements[1].value  # ``for i, (x, y) in enumerate(loader)``: not the counter
        return targets(target)

    def _loader(self, expr: cst.BaseExpression, use: cst.CSTNode, fn: Optional[cst.FunctionDef],
                depth: int, cls: Optional[cst.ClassDef] = None) -> Optional[cst.Call]:
        """The ``DataLoader(...)`` call of this file that ``expr`` holds, following assignments and, for a
        parameter, every call of its function; None when any of them is something else or unknown."""
        if depth > 3:
            return None
        if isinstance(expr, cst.Call):
            return expr if is_data_loader(self.ctx.call_name(expr)) else None
        name = dotted_name(expr)
        if name is None:
            return None
        if cls is not None and name.startswith("self.") and name.count(".") == 1:
            value = self._only_assignment(cls, name)  # ``self.train_loader = DataLoader(...)`` in ``__init__``
            return self._loader(value, value, None, depth + 1) if value is not None else None
        # ``model, loader = accelerator.prepare(model, loader)``: the prepared loader, which moves its batches
        value = assignment_before(self.ctx, use, name, unpacked=True)
        if value is not None:
            return self._loader(value, use, fn, depth + 1)
        if fn is None or "." in name or parameter_index(fn, name) is None and not any(
                p.name.value == name for p in fn.params.kwonly_params):
            return None
        values = call_site_values(self.ctx, fn, name)
        if not values:
            return None
        found = [self._loader(v, v, self._function_of(v), depth + 1) for v in values]
        return found[0] if all(found) else None

    @staticmethod
    def _only_assignment(cls: cst.ClassDef, name: str) -> Optional[cst.BaseExpression]:
        """The value of the one statement of the class that binds the attribute ``name`` (``self.loader``); None when
        several do, or one unpacks (``self.model, self.loader = accelerator.prepare(...)``)."""
        values = [node.value for node in expression_nodes(cls.body) if isinstance(node, cst.Assign)
                  for target in node.targets if name in _target_paths(target.target)]
        augmented = any(isinstance(node, (cst.AugAssign, cst.AnnAssign)) and dotted_name(node.target) == name
                        for node in expression_nodes(cls.body))
        if len(values) != 1 or augmented:
            return None
        return values[0] if isinstance(values[0], cst.Call) else None

    def _function_of(self, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        return next((a for a in self.ctx.ancestors(node) if isinstance(a, cst.FunctionDef)), None)

    def _stays_on_cpu(self, loader: cst.Call, ctx: FileContext) -> bool:
        """Whether this file shows that the loader's batches are CPU tensors."""
        for arg in loader.args:
            if arg.star and not self._plain_options(arg.value, loader, ctx):
                return False
        collate = keyword_arg(loader, "collate_fn")
        if collate is not None and not (isinstance(collate.value, cst.Name) and collate.value.value == "None"):
            return False
        dataset: Optional[cst.BaseExpression] = argument(loader, 0, "dataset")
        for _ in range(4):
            if not isinstance(dataset, (cst.Name, cst.Attribute)):
                break
            dataset = assignment_before(ctx, loader, dotted_name(dataset) or "", unpacked=True)
        if not isinstance(dataset, cst.Call):
            return False
        called = ctx.call_name(dataset) or dotted_name(dataset.func) or ""
        if called.startswith(_CPU_DATASETS):
            return True
        if called.rsplit(".", 1)[-1] == "TensorDataset":
            for arg in dataset.args:
                value = arg.value
                if isinstance(value, (cst.Name, cst.Attribute)):
                    value = assignment_before(ctx, loader, dotted_name(value) or "", unpacked=True)
                    if value is None:
                        return False
                if places_on_a_device(value, ctx):
                    return False
            return True
        cls = self._class_in_file(called, ctx)
        return cls is not None and yields_host_tensors(cls, ctx)

    @staticmethod
    def _plain_options(expr: cst.BaseExpression, loader: cst.Call, ctx: FileContext) -> bool:
        """``**train_kwargs`` built in this file as a dict (``{"batch_size": 64}``, updated with more), in a file that
        never hands a loader a collate function: the options cannot carry one."""
        if hands_a_collate_function(ctx):
            return False
        if isinstance(expr, (cst.Name, cst.Attribute)):
            expr = assignment_before(ctx, loader, dotted_name(expr) or "")
        branches = [expr.body, expr.orelse] if isinstance(expr, cst.IfExp) else [expr]  # ``{...} if cuda else {}``
        return all(isinstance(e, cst.Dict) or (isinstance(e, cst.Call) and dotted_name(e.func) == "dict")
                   for e in branches)

    @staticmethod
    def _class_in_file(name: str, ctx: FileContext) -> Optional[cst.ClassDef]:
        return next((s for s in ctx.module.body if isinstance(s, cst.ClassDef) and s.name.value == name), None)

    def _model_move(self, callee: str, entry: _LoaderLoop) -> Optional[cst.Call]:
        if "loss" in callee.lower() or "criterion" in callee.lower() or callee in self.moved_back:
            return None
        if callee.startswith("self."):
            return self.moved.get((id(entry.cls) if entry.cls is not None else None, callee))
        fn = entry.fn
        if fn is not None and callee in self._bound_names(fn):
            own = self.moved.get((id(fn), callee))
            if own is not None:
                return own
            if parameter_index(fn, callee) is None:
                return None
            values = call_site_values(self.ctx, fn, callee) or []
            for value in values:
                name = dotted_name(value)
                scope = self._function_of(value)
                found = self.moved.get((id(scope) if scope is not None else None, name or ""))
                if found is not None:
                    return found
            return None
        return self.moved.get((None, callee))

    @staticmethod
    def _bound_names(fn: cst.FunctionDef) -> set[str]:
        names = {p.name.value for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params)}
        for node in expression_nodes(fn.body):
            if isinstance(node, cst.AssignTarget):
                names.update(targets(node.target))
        return names

    def _forward_moves_inputs(self, move: cst.Call, ctx: FileContext) -> bool:
        """The model's class (of this file) moves what it is given: ``x = x.to(self.device)`` in forward."""
        built = move
        while isinstance(built, cst.Call) and isinstance(built.func, cst.Attribute):
            built = built.func.value
        if isinstance(built, (cst.Name, cst.Attribute)):
            built = assignment_before(ctx, move, dotted_name(built) or "")
        if not isinstance(built, cst.Call):
            return False
        cls = self._class_in_file((dotted_name(built.func) or "").rsplit(".", 1)[-1], ctx)
        if cls is None:
            return False
        for forward in cls.body.body:
            if not (isinstance(forward, cst.FunctionDef) and forward.name.value == "forward"):
                continue
            inputs = {p.name.value for p in (*forward.params.params, *forward.params.kwonly_params)} - {"self"}
            for node in expression_nodes(forward.body):
                if isinstance(node, cst.Call) and method_name(node) in ("to", "cuda", "type_as") and \
                        _receiver_root(call_receiver(node)) in inputs:
                    return True
        return False
