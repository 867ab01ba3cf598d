"""Distributed training: samplers, per-rank side effects, gradient synchronisation, DataParallel."""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, argument, dotted_name, is_true, iter_names, keyword_arg, method_name,
                               positional_args)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.flow import subtree
from analyzers.rules.base import Invalid, Rule
from analyzers.program.loops import AccumulationFacts, iterated, loop_stack, loop_trains
from analyzers.program.names import node_text
from analyzers.program.roles import is_test_code
from analyzers.program.library import Does, does, is_ddp, training_libraries_that
from analyzers.program.values import is_plain_backward

_DATALOADER = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
_RANK_WORDS = re.compile(r"rank|main_process|is_main|is_master|master|global_zero|local_process_zero|"
                         r"process_index|is_primary|primary|gpu|device_id|proc_id|node_id|worker_id|leader",
                         re.IGNORECASE)


def _is_ddp_call(call: cst.Call, ctx: FileContext) -> bool:
    qualified = ctx.call_name(call)
    if is_ddp(qualified):
        return True
    return qualified is None and (dotted_name(call.func) or "") in ("DDP", "DistributedDataParallel")


def _mentions_rank(expr: cst.CSTNode) -> bool:
    return any(_RANK_WORDS.search(name) for name in iter_names(expr))


# ---------------------------------------------------------------------------------------------
# TR720


class SamplerWithoutSetEpoch(Rule):
    id = "TR720"
    source_hint = re.compile(r"DistributedSampler")
    slug = "distributed-sampler-without-set-epoch"
    category = Category.DEVICE
    severity = Severity.HIGH
    summary = "DistributedSampler shuffles, but set_epoch() is never called in the epoch loop"
    what = """
        Flags a shuffling `DistributedSampler` in a file that trains over epochs (a loop that
        calls `.backward()`) when nothing in the file calls `set_epoch(...)`.
    """
    why = """
        `DistributedSampler` seeds its shuffle with `seed + epoch`. Without
        `sampler.set_epoch(epoch)` the epoch stays 0, so every epoch visits the data in exactly
        the same order on every rank - the shuffle happens once, and the training loses the
        per-epoch reshuffling it was configured for (usually a measurable accuracy loss).
    """
    example = """
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, sampler=sampler, batch_size=64)
        for epoch in range(epochs):
            for x, y in loader:
                ...
    """
    fix_example = """
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, sampler=sampler, batch_size=64)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                ...
    """
    VALID = [
        """
        import torch
        from torch.utils.data import DataLoader, DistributedSampler
        sampler = DistributedSampler(ds)
        loader = DataLoader(ds, sampler=sampler)
        for epoch in range(10):
            loader.sampler.set_epoch(epoch)
            for x, y in loader:
                criterion(model(x), y).backward()
                opt.step()
        """,
        # evaluation sampler
        """
        import torch
        from torch.utils.data.distributed import DistributedSampler
        val_sampler = DistributedSampler(val_ds, shuffle=False)
        for epoch in range(10):
            for x, y in train_loader:
                criterion(model(x), y).backward()
        """,
        # a builder module: the training script sets the epoch
        """
        import torch.utils.data as data
        def build_loader(ds, bs):
            return data.DataLoader(ds, batch_size=bs, sampler=data.DistributedSampler(ds))
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader, DistributedSampler
            train_sampler = DistributedSampler(train_ds)
            loader = DataLoader(train_ds, batch_size=32, sampler=train_sampler)
            for epoch in range(10):
                for x, y in loader:
                    opt.zero_grad()
                    criterion(model(x), y).backward()
                    opt.step()
            """,
            line=4, message="`train_sampler.set_epoch(epoch)`",
        ),
        Invalid(
            """
            import torch
            from torch.utils.data.distributed import DistributedSampler as DS
            def main():
                loader = torch.utils.data.DataLoader(ds, sampler=DS(ds, shuffle=True))
                for epoch in range(3):
                    for batch in loader:
                        model(batch).mean().backward()
            """,
            line=5,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.samplers: list[cst.Call] = []
        self.set_epoch = False
        self.trains = False

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        name = method_name(node)
        if name == "set_epoch":
            self.set_epoch = True
        elif is_plain_backward(node) and loop_stack(ctx):
            self.trains = True
        elif does(ctx.call_name(node), Does.SAMPLES_PER_PROCESS):
            shuffle = keyword_arg(node, "shuffle")
            if shuffle is None or is_true(shuffle.value):
                self.samplers.append(node)

    def end_file(self, ctx: FileContext) -> None:
        if self.set_epoch or not self.trains or any(
                ctx.imports.imports_root(lib) for lib in training_libraries_that(Does.ADVANCES_SAMPLER_EPOCH)):
            return  # Accelerate and Lightning advance the sampler's epoch themselves
        for call in self.samplers:
            parent = ctx.parent(call)
            owner = None
            if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
                owner = dotted_name(parent.targets[0].target)
            fix = code_span(f"{owner}.set_epoch(epoch)") if owner else "`sampler.set_epoch(epoch)`"
            self.report(call, f"this `DistributedSampler` shuffles with `seed + epoch`, and nothing calls "
                              f"`set_epoch()`: every epoch sees the same order on every rank; call {fix} at the "
                              f"start of each epoch")


# ---------------------------------------------------------------------------------------------
# TR722


_DDP_HINT = re.compile(r"DistributedDataParallel|DDP")  # how _is_ddp_call recognises the wrapper


class SaveOnEveryRank(Rule):
    id = "TR722"
    source_hint = (_DDP_HINT, re.compile(r"backward"), re.compile(r"save"))
    slug = "checkpoint-saved-on-every-rank"
    category = Category.DEVICE
    severity = Severity.HIGH
    summary = "torch.save in a DDP training function without a rank-0 guard"
    what = """
        Flags `torch.save(...)` in a function that trains a `DistributedDataParallel` model
        (the same function calls `.backward()`) when the save is not under a rank check
        (`if rank == 0`, `if is_main_process()`, `if local_rank in [-1, 0]`...), the function
        does not return early on other ranks, and the path does not name the rank.
    """
    why = """
        Every process runs the same code: N processes write the same file at once. The writes
        race (a torn or truncated checkpoint that fails to load later), the shared filesystem
        takes N times the traffic, and the run is slower for nothing - all ranks hold identical
        weights.
    """
    example = """
        model = DDP(model, device_ids=[rank])
        for epoch in range(epochs):
            train_one_epoch(model)
            torch.save(model.module.state_dict(), "ckpt.pt")
    """
    fix_example = """
        model = DDP(model, device_ids=[rank])
        for epoch in range(epochs):
            train_one_epoch(model)
            if dist.get_rank() == 0:
                torch.save(model.module.state_dict(), "ckpt.pt")
    """
    VALID = [
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        def train(rank, model):
            model = DDP(model, device_ids=[rank])
            for x in loader:
                model(x).sum().backward()
                if rank == 0:
                    torch.save(model.module.state_dict(), "ckpt.pt")
        """,
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        class Trainer:
            def train(self):
                self.model = DDP(self.model, device_ids=[self.gpu_id])
                for x in self.loader:
                    self.model(x).sum().backward()
                if self.gpu_id == 0 and self.epoch % self.save_every == 0:
                    torch.save(self.model.module.state_dict(), "ckpt.pt")
        """,
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel
        def train(args, model):
            model = DistributedDataParallel(model)
            for x in loader:
                model(x).sum().backward()
            if args.local_rank not in [-1, 0]:
                return
            torch.save(model.state_dict(), "final.pt")
        """,
        # per-rank shards
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        def train(rank, model):
            model = DDP(model)
            for x in loader:
                model(x).sum().backward()
            torch.save(model.state_dict(), f"shard_{rank}.pt")
            path = os.path.join(out_dir, "opt_rank%d.pt" % dist.get_rank())
            torch.save(opt.state_dict(), path)
        """,
        # not a DDP file
        """
        import torch
        for x in loader:
            model(x).sum().backward()
            torch.save(model.state_dict(), "ckpt.pt")
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            def train(rank, world_size):
                model = DDP(Net().to(rank), device_ids=[rank])
                for epoch in range(10):
                    for x, y in loader:
                        opt.zero_grad()
                        loss_fn(model(x), y).backward()
                        opt.step()
                    torch.save(model.state_dict(), "checkpoint.pt")
            """,
            line=11, message="`torch.save(model.state_dict(), \"checkpoint.pt\")`",
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            class Trainer:
                def __init__(self, model, gpu_id):
                    self.model = nn.parallel.DistributedDataParallel(model, device_ids=[gpu_id])
                def train(self, epochs):
                    for epoch in range(epochs):
                        for x in self.loader:
                            self.model(x).sum().backward()
                        if epoch % self.save_every == 0:
                            torch.save(self.model.module.state_dict(), "ckpt.pt")
            """,
            line=12,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.ddp = False
        self.saves: list[tuple[cst.Call, object]] = []
        self.trains: set[int] = set()
        self.guarded: set[int] = set()  # functions that return early on other ranks

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if _is_ddp_call(node, ctx):
            self.ddp = True
        elif is_plain_backward(node):
            self.trains.add(id(ctx.function))
        elif does(ctx.call_name(node), Does.WRITES_TORCH_CHECKPOINT) and not self._guarded(node, ctx):
            path = node.args[1].value if len(node.args) > 1 else None
            if path is not None and (_mentions_rank(path) or _mentions_rank(ctx.origin(path) or path)):
                return  # one file per rank
            self.saves.append((node, ctx.function))

    def visit_If(self, node: cst.If, ctx: FileContext) -> None:
        if _mentions_rank(node.test) and any(isinstance(s, cst.SimpleStatementLine) and any(
                isinstance(small, cst.Return) for small in s.body) for s in node.body.body
                if isinstance(node.body, cst.IndentedBlock)):
            self.guarded.add(id(ctx.function))

    @staticmethod
    def _guarded(node: cst.Call, ctx: FileContext) -> bool:
        for ancestor in ctx.ancestors(node):
            if isinstance(ancestor, (cst.If, cst.IfExp, cst.While)) and _mentions_rank(ancestor.test):
                return True
            if isinstance(ancestor, cst.FunctionDef):
                return bool(_RANK_WORDS.search(ancestor.name.value))
        return False

    def end_file(self, ctx: FileContext) -> None:
        if not self.ddp:
            return
        for call, fn in self.saves:
            if id(fn) not in self.trains or id(fn) in self.guarded:
                continue
            self.report(call, f"{code_span(node_text(ctx, call))} runs on every DDP rank: all processes write the same "
                              f"file at once (a torn checkpoint, N times the I/O); save only on rank 0 "
                              f"(`if dist.get_rank() == 0:`)")


# ---------------------------------------------------------------------------------------------
# TR723


class DdpAccumulationWithoutNoSync(Rule):
    id = "TR723"
    source_hint = re.compile(r"DistributedDataParallel|DDP")
    slug = "ddp-accumulation-without-no-sync"
    category = Category.DEVICE
    severity = Severity.MEDIUM
    summary = "gradient accumulation on a DDP model all-reduces on every micro-step (no model.no_sync())"
    what = """
        Flags gradient accumulation (`backward()` on every batch, `optimizer.step()` only under
        `if (i + 1) % accum_steps == 0`) in a file that wraps the model in
        `DistributedDataParallel` and never uses `no_sync()` (or sets
        `require_backward_grad_sync`).
    """
    why = """
        DDP all-reduces the gradients in every `backward()`. During accumulation only the last
        micro-step's all-reduce is needed; the others move the full gradient over the network
        for nothing, which often makes accumulation nearly as slow as not accumulating at all.
    """
    example = """
        for i, (x, y) in enumerate(loader):
            loss = criterion(ddp_model(x), y) / accum_steps
            loss.backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    fix_example = """
        for i, (x, y) in enumerate(loader):
            sync = (i + 1) % accum_steps == 0
            with ddp_model.no_sync() if not sync else contextlib.nullcontext():
                loss = criterion(ddp_model(x), y) / accum_steps
                loss.backward()
            if sync:
                optimizer.step()
                optimizer.zero_grad()
    """
    VALID = [
        """
        import contextlib
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(net)
        for i, (x, y) in enumerate(loader):
            ctx = model.no_sync() if (i + 1) % accum_steps else contextlib.nullcontext()
            with ctx:
                (criterion(model(x), y) / accum_steps).backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
        """,
        # nanoGPT's flag
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(net)
        for i, (x, y) in enumerate(loader):
            model.require_backward_grad_sync = (i + 1) % grad_accum_steps == 0
            (model(x).mean() / grad_accum_steps).backward()
            if (i + 1) % grad_accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
        """,
        # no DDP
        """
        import torch
        for i, (x, y) in enumerate(loader):
            (criterion(model(x), y) / accum_steps).backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net, device_ids=[rank])
            for i, (x, y) in enumerate(loader):
                loss = criterion(model(x), y) / accum_steps
                loss.backward()
                if (i + 1) % accum_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """,
            line=8, message="`model.no_sync()`",
        ),
        Invalid(
            """
            import torch
            def train(args, model):
                model = torch.nn.parallel.DistributedDataParallel(model)
                for step, batch in enumerate(loader):
                    (model(**batch).loss / args.accumulation_steps).backward()
                    if step % args.accumulation_steps == 0:
                        opt.step()
                        opt.zero_grad()
            """,
            line=7,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.ddp = False
        self.synced = False
        self.models: set[str] = set()

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if _is_ddp_call(node, ctx):
            self.ddp = True
            parent = ctx.parent(node)
            if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
                self.models.add(dotted_name(parent.targets[0].target) or "")

    def visit_If(self, node: cst.If, ctx: FileContext) -> None:
        ctx.facts(AccumulationFacts).note_if(node, ctx)

    def visit_Name(self, node: cst.Name, ctx: FileContext) -> None:
        if node.value in ("no_sync", "require_backward_grad_sync", "no_sync_context"):
            self.synced = True

    def end_file(self, ctx: FileContext) -> None:
        if not self.ddp or self.synced:
            return
        for step in ctx.facts(AccumulationFacts).steps:
            divisor = dotted_name(step.divisor) or "the accumulation steps"
            self.report(step.node.test, f"gradients of a `DistributedDataParallel` model are accumulated over "
                                        f"{code_span(divisor)} micro-batches, but every `backward()` all-reduces "
                                        f"them: wrap the micro-steps that do not step in "
                                        f"{self._no_sync()}")

    def _no_sync(self) -> str:
        if len(self.models) == 1 and "" not in self.models:
            return code_span(next(iter(self.models)) + ".no_sync()")
        return "the DDP model's `no_sync()`"


# ---------------------------------------------------------------------------------------------
# TR724


class DataParallelTraining(Rule):
    id = "TR724"
    source_hint = re.compile(r"DataParallel")
    slug = "data-parallel-training"
    category = Category.DEVICE
    severity = Severity.LOW
    summary = "nn.DataParallel for training; DistributedDataParallel is faster even on one machine"
    what = """
        Flags `nn.DataParallel(model)` in a file that trains (calls `.backward()` in a loop) and
        does not offer `DistributedDataParallel` or `torch.distributed` (where it does, DataParallel is
        a fallback).
    """
    why = """
        DataParallel runs one Python process: it scatters each batch, replicates the model on
        every step, gathers the outputs on GPU 0 (which runs out of memory first) and is bound by
        the GIL. PyTorch recommends `DistributedDataParallel` - one process per GPU - even on a
        single machine; it is significantly faster and scales.
    """
    example = """
        model = nn.DataParallel(model).cuda()
    """
    fix_example = """
        # torchrun --nproc_per_node=N train.py
        dist.init_process_group("nccl")
        model = DDP(model.to(local_rank), device_ids=[local_rank])
    """
    VALID = [
        """
        import torch
        model = torch.nn.DataParallel(model)
        with torch.no_grad():
            preds = model(x)
        """,
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        if distributed:
            model = DDP(model)
        else:
            model = torch.nn.DataParallel(model)
        for x in loader:
            model(x).sum().backward()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn
            model = nn.DataParallel(Net()).cuda()
            for x, y in loader:
                opt.zero_grad()
                criterion(model(x), y).backward()
                opt.step()
            """,
            line=3, message="`nn.DataParallel(Net())`",
        ),
        Invalid(
            """
            import torch
            from torch.nn import DataParallel
            def main():
                net = DataParallel(build(), device_ids=[0, 1])
                for epoch in range(5):
                    for b in loader:
                        net(b).mean().backward()
            """,
            line=5,
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.calls: list[cst.Call] = []
        self.trains = False
        self.ddp = False

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if does(ctx.call_name(node), Does.REPLICATES_PER_DEVICE):
            self.calls.append(node)
        elif is_plain_backward(node) and loop_stack(ctx):
            self.trains = True

    def visit_Name(self, node: cst.Name, ctx: FileContext) -> None:
        if "DDP" in node.value or node.value in ("DistributedDataParallel", "FullyShardedDataParallel",
                                                 "init_process_group"):
            self.ddp = True

    def end_file(self, ctx: FileContext) -> None:
        if not self.trains or self.ddp or ctx.imports.imports_root("torch.distributed") or is_test_code(ctx):
            return  # with DDP in the file, DataParallel is the single-process fallback
        for call in self.calls[:1]:
            self.report(call, f"{code_span(node_text(ctx, call))} trains through single-process DataParallel "
                              f"(model replicated every step, outputs gathered on GPU 0, GIL-bound); "
                              f"`DistributedDataParallel` with one process per GPU is faster even on one machine")


# ---------------------------------------------------------------------------------------------
# TR725

_LOGGERS = {"wandb.init", "torch.utils.tensorboard.SummaryWriter", "torch.utils.tensorboard.writer.SummaryWriter",
            "tensorboardX.SummaryWriter", "mlflow.start_run", "neptune.init_run", "neptune.init", "comet_ml.Experiment",
            "comet_ml.start", "aim.Run"}


class _CallsOnEveryRank(Rule):
    """Calls that every DDP rank makes: whether the file wraps a model in DDP, the calls ``collects``
    accepts (with their function), and the functions that return early off rank 0 (their calls are
    guarded). ``unguarded_calls`` is what the rule may report."""

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.ddp = False
        self.calls: list[tuple[cst.Call, object]] = []
        self.guarded: set[int] = set()

    def collects(self, node: cst.Call, ctx: FileContext) -> bool:
        raise NotImplementedError

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if _is_ddp_call(node, ctx):
            self.ddp = True
        elif self.collects(node, ctx):
            self.calls.append((node, ctx.function))

    def visit_If(self, node: cst.If, ctx: FileContext) -> None:
        if _mentions_rank(node.test) and isinstance(node.body, cst.IndentedBlock) and any(
                isinstance(s, cst.SimpleStatementLine) and any(isinstance(small, cst.Return) for small in s.body)
                for s in node.body.body):
            self.guarded.add(id(ctx.function))

    def unguarded_calls(self, ctx: FileContext) -> list[tuple[cst.Call, object]]:
        if not self.ddp or is_test_code(ctx):
            return []
        return [(call, fn) for call, fn in self.calls if id(fn) not in self.guarded]


class LoggerOnEveryRank(_CallsOnEveryRank):
    id = "TR725"
    source_hint = (_DDP_HINT, re.compile(r"wandb|SummaryWriter|mlflow|neptune|comet_ml|aim\b"))
    slug = "experiment-logger-on-every-rank"
    category = Category.DEVICE
    severity = Severity.MEDIUM
    summary = "wandb.init() / SummaryWriter() created on every DDP rank"
    what = """
        Flags `wandb.init(...)`, `SummaryWriter(...)`, `mlflow.start_run()` and similar
        experiment loggers created in a file that trains a `DistributedDataParallel` model, when
        the call is not under a rank check (`if rank == 0`, `if is_main_process()`...), its
        function does not return early on other ranks, and its arguments do not name the rank.
    """
    why = """
        Every process runs the same code: N ranks create N wandb runs (or N TensorBoard event
        files in one directory), each logging its own shard's metrics. Dashboards show duplicated,
        inconsistent curves, and the run's real (rank-0 or reduced) metrics are hard to find.
    """
    example = """
        dist.init_process_group("nccl")
        model = DDP(model, device_ids=[local_rank])
        wandb.init(project="my-project", config=args)
    """
    fix_example = """
        dist.init_process_group("nccl")
        model = DDP(model, device_ids=[local_rank])
        if dist.get_rank() == 0:
            wandb.init(project="my-project", config=args)
    """
    VALID = [
        """
        import torch
        import wandb
        from torch.nn.parallel import DistributedDataParallel as DDP
        def main(rank):
            model = DDP(net, device_ids=[rank])
            if rank == 0:
                wandb.init(project="p")
            writer = SummaryWriter() if is_main_process() else None
        """,
        """
        import wandb
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.tensorboard import SummaryWriter
        def main(args):
            model = DDP(net)
            log_dir = os.path.join(args.out, "train_" + str(get_rank()))
            writer = SummaryWriter(log_dir)
            wandb.init(project="p", mode="online" if args.local_rank == 0 else "disabled")
        """,
        # not distributed
        """
        import wandb
        import torch
        wandb.init(project="p")
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import wandb
            from torch.nn.parallel import DistributedDataParallel as DDP
            def main(rank, world_size):
                model = DDP(Net().to(rank), device_ids=[rank])
                wandb.init(project="ddp-demo", config={"lr": 1e-3})
            """,
            line=7, message="`wandb.init(project=\"ddp-demo\", config={\"lr\": 1e-3})`",
        ),
        Invalid(
            """
            import torch
            from torch.utils.tensorboard import SummaryWriter
            def train(args):
                model = torch.nn.parallel.DistributedDataParallel(build(args))
                writer = SummaryWriter(args.log_dir)
            """,
            line=6,
        ),
    ]

    def collects(self, node: cst.Call, ctx: FileContext) -> bool:
        return (ctx.call_name(node) in _LOGGERS and not SaveOnEveryRank._guarded(node, ctx)
                and not any(_mentions_rank(arg.value) or _mentions_rank(ctx.origin(arg.value) or arg.value)
                            for arg in node.args))

    def end_file(self, ctx: FileContext) -> None:
        for call, _fn in self.unguarded_calls(ctx):
            self.report(call, f"{code_span(node_text(ctx, call))} runs on every DDP rank: each process starts its own "
                              f"run / event file and logs its own shard's metrics; create it only on rank 0 "
                              f"(`if dist.get_rank() == 0:`)")


# ---------------------------------------------------------------------------------------------
# TR726

# a name that says "evaluation data": val / valid / test / eval as a word between underscores or digits
_EVAL_DATA = re.compile(r"(?<![a-z])(val|valid|validation|test|testing|eval|evaluation|dev)(?![a-z])|"
                        r"(val|valid|test|eval)(set|data|dataset|loader|dl|ds)", re.IGNORECASE)
_DISTRIBUTED_SAMPLER_NAME = re.compile(r"Distributed\w*Sampler")


def _is_sharding_sampler(node: cst.Call, ctx: FileContext) -> bool:
    """torch's DistributedSampler, or a project's own ``Distributed*Sampler`` class."""
    return does(ctx.call_name(node), Does.SHARDS_DATA) or bool(
        _DISTRIBUTED_SAMPLER_NAME.search(dotted_name(node.func) or ""))


def _names_eval_data(expr: Optional[cst.CSTNode]) -> bool:
    return expr is not None and any(_EVAL_DATA.search(name.rsplit(".", 1)[-1]) for name in iter_names(expr))


def _may_have_sampler(loader: cst.Call, max_positional: int) -> bool:
    """A ``DataLoader(...)`` call that passes a sampler, or may: ``**kwargs``, or more than ``max_positional``
    positional arguments (``sampler`` is the fourth: one passed that way is not read)."""
    return (any(a.star for a in loader.args) or len(positional_args(loader)) > max_positional
            or keyword_arg(loader, "sampler") is not None or keyword_arg(loader, "batch_sampler") is not None)


def _assigned_name(node: cst.Call, ctx: FileContext) -> Optional[str]:
    """``name`` in ``name = <node>`` (one target), else None."""
    parent = ctx.parent(node)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        return dotted_name(parent.targets[0].target)
    return None


class EvalLoaderWithoutDistributedSampler(Rule):
    id = "TR726"
    source_hint = (_DDP_HINT, re.compile(r"Sampler"), re.compile(r"DataLoader"))
    slug = "eval-loader-without-distributed-sampler"
    category = Category.DEVICE
    severity = Severity.MEDIUM
    summary = "validation/test DataLoader without a DistributedSampler while DDP training shards its data"
    what = """
        Flags a `DataLoader` over validation or test data (its dataset or its variable is named
        `val*`, `valid*`, `test*`, `eval*`) that has no `sampler=`, in a file that wraps a model in
        `DistributedDataParallel` and shards its training data with a `DistributedSampler` but no
        evaluation data. Stays quiet when the loader is built or used only under a rank check
        (`if rank == 0: evaluate(...)`).
    """
    why = """
        Every process runs the same code: without a distributed sampler each of the N ranks runs
        the whole evaluation set - N times the work for one result, so evaluation takes as long as
        on one GPU while the training beside it got N times faster. Metrics summed across ranks
        (`all_reduce` of correct counts) then count every sample N times.
    """
    example = """
        train_loader = DataLoader(train_set, batch_size=64, sampler=DistributedSampler(train_set))
        val_loader = DataLoader(val_set, batch_size=64)
    """
    fix_example = """
        train_loader = DataLoader(train_set, batch_size=64, sampler=DistributedSampler(train_set))
        val_loader = DataLoader(val_set, batch_size=64, sampler=DistributedSampler(val_set, shuffle=False))
        # then all_reduce the metric sums, or evaluate only on rank 0
    """
    VALID = [
        """
        import torch
        from torch.utils.data import DataLoader, DistributedSampler
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(net)
        train_loader = DataLoader(train_set, sampler=DistributedSampler(train_set))
        val_sampler = DistributedSampler(val_set, shuffle=False)
        val_loader = DataLoader(val_set, sampler=val_sampler)
        extra_loader = DataLoader(Subset(val_set, leftover), batch_size=64)
        """,
        # evaluation only on rank 0
        """
        import torch
        from torch.utils.data import DataLoader, DistributedSampler
        from torch.nn.parallel import DistributedDataParallel as DDP
        def main(rank):
            model = DDP(net, device_ids=[rank])
            train_loader = DataLoader(train_set, sampler=DistributedSampler(train_set))
            test_loader = DataLoader(test_set, batch_size=256)
            for epoch in range(10):
                train(model, train_loader)
                if rank == 0:
                    evaluate(model.module, test_loader)
        """,
        # an explicit sequential sampler is a choice, not an oversight
        """
        import torch
        from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(net)
        train_loader = DataLoader(train_set, sampler=DistributedSampler(train_set))
        val_loader = DataLoader(val_set, sampler=SequentialSampler(val_set))
        """,
        # training not sharded either: a single-process script with a DDP option
        """
        import torch
        from torch.utils.data import DataLoader
        model = torch.nn.parallel.DistributedDataParallel(net)
        train_loader = DataLoader(train_set, shuffle=True)
        val_loader = DataLoader(val_set)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            from torch.utils.data.distributed import DistributedSampler
            from torch.nn.parallel import DistributedDataParallel as DDP
            def main(rank, world_size):
                model = DDP(Net().to(rank), device_ids=[rank])
                train_loader = DataLoader(train_set, batch_size=64, sampler=DistributedSampler(train_set))
                val_loader = DataLoader(val_set, batch_size=64)
                for epoch in range(10):
                    train(model, train_loader)
                    validate(model, val_loader)
            """,
            line=9, message="`val_loader`",
        ),
        Invalid(
            """
            import torch
            import torch.utils.data as tud
            dataset_val = datasets.ImageFolder(valdir)
            loader = tud.DataLoader(
                dataset_val,
                batch_size=128,
                num_workers=8,
            )
            sampler = tud.DistributedSampler(dataset_train)
            train_loader = tud.DataLoader(dataset_train, sampler=sampler)
            classifier = torch.nn.parallel.DistributedDataParallel(classifier)
            """,
            line=5, message="`dataset_val`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.ddp = False
        self.sharded = False
        self.eval_sharded = False
        self.loaders: list[tuple[cst.Call, Optional[str], str]] = []  # (call, variable, what is named eval)

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if _is_ddp_call(node, ctx):
            self.ddp = True
        elif _is_sharding_sampler(node, ctx):
            self.sharded = True
            statement = ctx.statement_of(node)
            targets = statement.body[0].targets if isinstance(statement, cst.SimpleStatementLine) and isinstance(
                statement.body[0], cst.Assign) else ()
            if any(_names_eval_data(arg.value) for arg in node.args) or any(
                    _names_eval_data(t.target) for t in targets):
                self.eval_sharded = True
        elif ctx.call_name(node) in _DATALOADER:
            self._loader(node, ctx)

    def _loader(self, node: cst.Call, ctx: FileContext) -> None:
        if _may_have_sampler(node, max_positional=3) or SaveOnEveryRank._guarded(node, ctx):
            return
        dataset = argument(node, 0, "dataset")
        parent = ctx.parent(node)
        variable = _assigned_name(node, ctx)
        if dataset is not None and _names_eval_data(dataset):
            self.loaders.append((node, variable, ctx.module.code_for_node(dataset).strip()))
        elif variable is not None and _names_eval_data(parent.targets[0].target):
            self.loaders.append((node, variable, variable))

    def end_file(self, ctx: FileContext) -> None:
        if not (self.ddp and self.sharded) or self.eval_sharded or is_test_code(ctx):
            return
        for call, variable, named in self.loaders:
            if variable is not None and self._used_on_one_rank(ctx, variable):
                continue
            subject = code_span(variable or "DataLoader") + (f" over {code_span(named)}" if named != variable else "")
            self.report(call, f"{subject} has no DistributedSampler while training is sharded by one: every DDP rank evaluates the whole set (N times the work for one result, "
                              f"and counts summed across ranks count each sample N times); pass "
                              f"`sampler=DistributedSampler(..., shuffle=False)` and reduce the metrics, or evaluate "
                              f"only on rank 0")

    @staticmethod
    def _used_on_one_rank(ctx: FileContext, variable: str) -> bool:
        """Some use of the loader sits under a rank check (``if rank == 0: evaluate(model, val_loader)``)."""
        for node in subtree(ctx.module):
            if isinstance(node, (cst.Name, cst.Attribute)) and dotted_name(node) == variable and \
                    not isinstance(ctx.parent(node), cst.AssignTarget) and SaveOnEveryRank._guarded(node, ctx):
                return True
        return False


# ---------------------------------------------------------------------------------------------
# TR727

_METRIC_WORDS = re.compile(r"loss|acc(?!um)|top1|top5|metric|perplexity|ppl|bleu|psnr|iou|f1|auc|score", re.IGNORECASE)
# helpers that replace builtins.print by a rank-0-only print (DeiT/DINO/MAE's init_distributed_mode)
_PRINT_SILENCED = re.compile(r"builtins\.print|setup_for_distributed|init_distributed_mode|__builtin__\.print")
_LOGGING_CALLS = {"logging.info", "logging.warning", "logging.debug"}


def _string_text(expr: cst.CSTNode) -> str:
    return " ".join(n.value for n in subtree(expr) if isinstance(n, (cst.SimpleString, cst.FormattedStringText)))


class MetricsPrintedOnEveryRank(_CallsOnEveryRank):
    id = "TR727"
    source_hint = (_DDP_HINT, re.compile(r"backward"), re.compile(r"print|logging|getLogger"))
    slug = "metrics-printed-on-every-rank"
    category = Category.DEVICE
    severity = Severity.LOW
    summary = "training metrics printed/logged by every DDP rank (no rank-0 guard)"
    what = """
        Flags `print(...)` / `logging.info(...)` / `logger.info(...)` of a metric (a loss,
        accuracy, score, or `.item()` value) inside the training loop of a file that trains a
        `DistributedDataParallel` model, when the call is not under a rank check (`if rank == 0`,
        `if is_main_process()`...), its function does not return early on other ranks, and the
        message does not name the rank. Stays quiet where a helper silences `print` on the other
        ranks (`setup_for_distributed` / `builtins.print` replaced, as `init_distributed_mode` does).
    """
    why = """
        Every process prints: N interleaved copies of each line, each showing its own shard's
        loss or accuracy, not the global value - the log is N times longer and its numbers
        disagree. Print on rank 0 (after reducing the metric if it should cover all ranks).
    """
    example = """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"epoch {epoch} loss {loss.item():.4f}")
    """
    fix_example = """
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if dist.get_rank() == 0:
                print(f"epoch {epoch} loss {loss.item():.4f}")
    """
    VALID = [
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        def train(rank, model, loader):
            model = DDP(model, device_ids=[rank])
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
                if rank == 0:
                    print(f"loss {loss.item()}")
                print(f"[GPU{rank}] batch done, loss {loss.item()}")
        """,
        # print is replaced by a rank-0-only print
        """
        import torch
        import utils
        from torch.nn.parallel import DistributedDataParallel
        def main(args):
            utils.init_distributed_mode(args)
            model = DistributedDataParallel(build())
            for x in loader:
                loss = model(x).mean()
                loss.backward()
                print("loss", loss.item())
        """,
        # not a metric
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(net)
        for epoch in range(10):
            for x in loader:
                model(x).sum().backward()
            print("epoch finished")
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            def train(rank, world_size, loader):
                model = DDP(Net().to(rank), device_ids=[rank])
                for epoch in range(10):
                    for x, y in loader:
                        opt.zero_grad()
                        loss = loss_fn(model(x), y)
                        loss.backward()
                        opt.step()
                    print(f"epoch {epoch}: loss {loss.item():.4f}")
            """,
            line=12, message="every DDP rank",
        ),
        Invalid(
            """
            import logging
            import torch
            logger = logging.getLogger(__name__)
            class Trainer:
                def fit(self):
                    self.model = torch.nn.parallel.DistributedDataParallel(self.model)
                    for step, batch in enumerate(self.loader):
                        loss = self.model(batch).mean()
                        loss.backward()
                        self.optimizer.step()
                        if step % 100 == 0:
                            logger.info("step %d loss %.3f", step, loss.item())
            """,
            line=13,
        ),
    ]

    def collects(self, node: cst.Call, ctx: FileContext) -> bool:
        if not (self._is_log_call(node, ctx) and self._shows_metric(node) and not SaveOnEveryRank._guarded(node, ctx)):
            return False
        return any(loop_trains(loop, ctx) for loop in loop_stack(ctx))

    @staticmethod
    def _is_log_call(node: cst.Call, ctx: FileContext) -> bool:
        func = node.func
        if isinstance(func, cst.Name):
            return func.value == "print" and ctx.binding("print") is None
        if ctx.qualified_name(func) in _LOGGING_CALLS:
            return True
        if isinstance(func, cst.Attribute) and func.attr.value == "info":
            origin = ctx.origin(func.value)
            return isinstance(origin, cst.Call) and ctx.call_name(origin) == "logging.getLogger"
        return False

    @staticmethod
    def _shows_metric(node: cst.Call) -> bool:
        for arg in node.args:
            if _mentions_rank(arg.value) or re.search(r"rank|gpu|device", _string_text(arg.value), re.IGNORECASE):
                return False  # a per-rank message on purpose
        return any(_METRIC_WORDS.search(name) for arg in node.args for name in iter_names(arg.value)) or any(
            isinstance(n, cst.Call) and method_name(n) == "item" for arg in node.args for n in subtree(arg.value))

    def end_file(self, ctx: FileContext) -> None:
        silenced = _PRINT_SILENCED.search(ctx.source) is not None
        reported: set[int] = set()
        for call, fn in self.unguarded_calls(ctx):
            if id(fn) in reported:
                continue
            if silenced and isinstance(call.func, cst.Name):
                continue
            reported.add(id(fn))  # one per function: the fix is the same guard
            self.report(call, f"{code_span(node_text(ctx, call))} runs on every DDP rank: N interleaved copies of the "
                              f"line, each with its own shard's value; print on rank 0 (`if dist.get_rank() == 0:`), "
                              f"after reducing the metric if it should cover every rank")


# ---------------------------------------------------------------------------------------------
# TR728

_TRAIN_DATA = re.compile(r"(?<![a-z])train|train(?![a-z])", re.IGNORECASE)
_PROCESS_GROUP = {"torch.distributed.init_process_group"}
# Data that shards itself, or a framework that adds the sampler: nothing to say.
_SELF_SHARDING = re.compile(r"IterableDataset|split_dataset_by_node|webdataset|\bwds\.|accelerate|lightning|"
                            r"Lightning|shard|DistributedBatchSampler|\[\s*\w*rank\w*\s*::", re.IGNORECASE)


class DdpTrainingLoaderWithoutSampler(Rule):
    id = "TR728"
    source_hint = (_DDP_HINT, re.compile(r"init_process_group"), re.compile(r"DataLoader"))
    slug = "ddp-training-loader-without-sampler"
    category = Category.DEVICE
    severity = Severity.MEDIUM
    summary = "DDP training DataLoader without a DistributedSampler: every rank trains on the whole dataset"
    what = """
        Flags the training `DataLoader` (named `train*`, over `train*` data, or iterated by a loop
        that calls `.backward()`) of a file that starts a process group (`init_process_group`) and
        wraps its model in `DistributedDataParallel`, when that loader has no `sampler=` /
        `batch_sampler=` and nothing in the file shards the data another way: no
        `DistributedSampler` at all, no rank in the dataset's construction, no `IterableDataset`,
        `split_dataset_by_node`, WebDataset, Accelerate or Lightning.
    """
    why = """
        DDP only averages gradients; splitting the data is the sampler's job. Without one, each
        of the N processes iterates the whole dataset: with the same seed on every rank they
        draw the same batches, so N GPUs compute the same gradients and training runs no faster
        than on one GPU, while an "epoch" is N passes over the data (schedules, early stopping
        and logged epoch counts are off by N).
    """
    example = """
        dist.init_process_group("nccl")
        model = DDP(model.to(rank), device_ids=[rank])
        train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
    """
    fix_example = """
        dist.init_process_group("nccl")
        model = DDP(model.to(rank), device_ids=[rank])
        sampler = DistributedSampler(train_set)  # shuffles; call sampler.set_epoch(epoch) each epoch
        train_loader = DataLoader(train_set, batch_size=64, sampler=sampler)
    """
    VALID = [
        # sharded by a sampler chosen at run time
        """
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("nccl")
        model = DDP(net)
        sampler = DistributedSampler(train_set) if args.distributed else None
        train_loader = DataLoader(train_set, batch_size=64, shuffle=(sampler is None), sampler=sampler)
        for x, y in train_loader:
            model(x).sum().backward()
        """,
        # the dataset shards itself by rank
        """
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("nccl")
        rank, world = dist.get_rank(), dist.get_world_size()
        model = DDP(net)
        train_set = TokenShards(path, rank=rank, world_size=world)
        train_loader = DataLoader(train_set, batch_size=8)
        for x, y in train_loader:
            model(x).sum().backward()
        """,
        # no process group started here: a single-process script with a DDP option
        """
        import torch
        from torch.utils.data import DataLoader
        model = torch.nn.parallel.DistributedDataParallel(net)
        train_loader = DataLoader(train_set, shuffle=True)
        for x, y in train_loader:
            model(x).sum().backward()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.distributed as dist
            import torch.multiprocessing as mp
            from torch.utils.data import DataLoader
            from torch.nn.parallel import DistributedDataParallel as DDP
            def worker(rank, world_size):
                dist.init_process_group("nccl", rank=rank, world_size=world_size)
                model = DDP(Net().to(rank), device_ids=[rank])
                loader = DataLoader(dataset, batch_size=32, shuffle=True)
                for epoch in range(10):
                    for x, y in loader:
                        loss = criterion(model(x.to(rank)), y.to(rank))
                        loss.backward()
                        opt.step()
            mp.spawn(worker, args=(4,), nprocs=4)
            """,
            line=10, message="`loader` over `dataset`",
        ),
        Invalid(
            """
            import torch
            from torch import distributed
            from torch.utils import data
            distributed.init_process_group(backend="nccl")
            model = torch.nn.parallel.DistributedDataParallel(model)
            train_dl = data.DataLoader(train_ds, batch_size=16, num_workers=4)
            train(model, train_dl)
            """,
            line=7, message="`train_dl`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.ddp = False
        self.process_group = False
        self.sharded = False
        self.loaders: list[tuple[cst.Call, Optional[str], Optional[cst.BaseExpression]]] = []
        self.training_iterables: set[str] = set()

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        qualified = ctx.call_name(node)
        if _is_ddp_call(node, ctx):
            self.ddp = True
        elif qualified in _PROCESS_GROUP:
            size = keyword_arg(node, "world_size")
            if not (size is not None and isinstance(size.value, cst.Integer) and size.value.value == "1"):
                self.process_group = True  # ``world_size=1``: one process, nothing to split
        elif _is_sharding_sampler(node, ctx):
            self.sharded = True
        elif qualified in _DATALOADER and not _may_have_sampler(node, max_positional=2):
            self.loaders.append((node, _assigned_name(node, ctx), argument(node, 0, "dataset")))

    def visit_For(self, node: cst.For, ctx: FileContext) -> None:
        if not loop_trains(node, ctx):
            return
        iterable = iterated(node.iter)
        name = dotted_name(iterable)
        if name is not None:
            self.training_iterables.add(name)

    def end_file(self, ctx: FileContext) -> None:
        if not (self.ddp and self.process_group) or self.sharded or is_test_code(ctx) or \
                _SELF_SHARDING.search(ctx.source):
            return
        for call, variable, dataset in self.loaders:
            if dataset is None or _names_eval_data(dataset) or (variable is not None and _is_eval_name(variable)):
                continue
            if self._built_per_rank(dataset, ctx):
                continue
            trains = variable in self.training_iterables if variable is not None else False
            named = (variable is not None and _TRAIN_DATA.search(variable.rsplit(".", 1)[-1])) or any(
                _TRAIN_DATA.search(name.rsplit(".", 1)[-1]) for name in iter_names(dataset))
            if not (trains or named):
                continue
            shown = code_span(variable or "DataLoader") + f" over {code_span(node_text(ctx, dataset))}"
            self.report(call, f"{shown} has no DistributedSampler although the model is trained with "
                              f"DistributedDataParallel across processes: every rank iterates the whole dataset "
                              f"(with one seed, the same batches), so the N GPUs repeat each other's work and an "
                              f"epoch is N passes over the data; pass `sampler=DistributedSampler(dataset)` (no "
                              f"`shuffle=`) and call `sampler.set_epoch(epoch)` every epoch")

    @staticmethod
    def _built_per_rank(dataset: cst.BaseExpression, ctx: FileContext) -> bool:
        """The dataset (or what its name was assigned) mentions the rank: it is split per process already."""
        if _mentions_rank(dataset):
            return True
        name = dotted_name(dataset)
        if name is None:
            return False
        for node in subtree(ctx.module):
            if isinstance(node, cst.Assign) and any(dotted_name(t.target) == name for t in node.targets) and \
                    _mentions_rank(node.value):
                return True
        return False


def _is_eval_name(variable: str) -> bool:
    return bool(_EVAL_DATA.search(variable.rsplit(".", 1)[-1]))
