"""TR728 ddp-training-loader-without-sampler: DDP training DataLoader without a DistributedSampler: every rank trains
on the whole dataset.
"""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import FileContext, argument, dotted_name, keyword_arg
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.flow import subtree
from analyzers.rules.base import Invalid, Rule
from analyzers.program.names import node_text
from analyzers.program.roles import is_test_code
from analyzers.program.ranks import depends_on_rank
from analyzers.program.library import is_data_loader
from analyzers.program.values import is_ddp_call as _is_ddp_call, DDP_HINT as _DDP_HINT
from analyzers.program.data import (data_splits_itself, is_sharding_sampler as _is_sharding_sampler, loader_trains,
                                    may_have_sampler as _may_have_sampler)
from analyzers.program.flow import assigned_name as _assigned_name


_PROCESS_GROUP = {"torch.distributed.init_process_group"}

class DdpTrainingLoaderWithoutSampler(Rule):
    id = "TR728"
    source_hint = (_DDP_HINT, re.compile(r"init_process_group"), re.compile(r"DataLoader"))
    slug = "ddp-training-loader-without-sampler"
    category = Category.DEVICE
    severity = Severity.MEDIUM
    summary = "DDP training DataLoader without a DistributedSampler: every rank trains on the whole dataset"
    what = """
        Flags the training `DataLoader` (not named for evaluation data, and iterated by a loop that
        calls `.backward()`, shuffled, named `train*` or over `train*` data) of a file that starts a process group (`init_process_group`) and
        wraps its model in `DistributedDataParallel`, when that loader has no `sampler=` /
        `batch_sampler=` and nothing in the file shards the data another way: no
        `DistributedSampler` at all, no rank in the dataset's construction or in a slice of the
        data, no iterable-style data set (`IterableDataset`, WebDataset), no
        `split_dataset_by_node`, and no Accelerate or Lightning imported (they add the sampler).
        What the code does decides, not the words in its comments.
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
        # an iterable-style data set decides what each process reads; a list of files sliced by the rank
        """
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader, IterableDataset
        from torch.nn.parallel import DistributedDataParallel as DDP
        class Stream(IterableDataset):
            def __iter__(self):
                yield from read(self.files)
        dist.init_process_group("nccl")
        model = DDP(net)
        mine = all_files[dist.get_rank()::dist.get_world_size()]
        for loader in (DataLoader(Stream(all_files)), DataLoader(FileRows(mine))):
            for x in loader:
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
        # the words of self-sharding data in a comment and a string shard nothing
        Invalid(
            """
            import torch
            import torch.distributed as dist
            from torch.utils.data import DataLoader
            dist.init_process_group("nccl")
            model = torch.nn.parallel.DistributedDataParallel(model)
            # TODO: an IterableDataset, or accelerate, would shard this
            train_dl = DataLoader(train_ds, batch_size=16)
            print("shard", "lightning")
            train(model, train_dl)
            """,
            line=8, message="`train_dl`",
        ),
    ]

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self.ddp = False
        self.process_group = False
        self.sharded = False
        self.loaders: list[tuple[cst.Call, Optional[str], Optional[cst.BaseExpression]]] = []

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
        elif is_data_loader(qualified) and not _may_have_sampler(node, max_positional=2):
            self.loaders.append((node, _assigned_name(node, ctx), argument(node, 0, "dataset")))

    def end_file(self, ctx: FileContext) -> None:
        if not (self.ddp and self.process_group) or self.sharded or not self.loaders or is_test_code(ctx) or \
                data_splits_itself(ctx):
            return  # data that splits itself, or a library that adds the sampler: nothing to say
        for call, variable, dataset in self.loaders:
            if dataset is None or self._built_per_rank(dataset, ctx) or not loader_trains(call, variable, dataset, ctx):
                continue
            shown = code_span(variable or "DataLoader") + f" over {code_span(node_text(ctx, dataset))}"
            self.report(call, f"{shown} has no DistributedSampler although the model is trained with "
                              f"DistributedDataParallel across processes: every rank iterates the whole dataset "
                              f"(with one seed, the same batches), so the N GPUs repeat each other's work and an "
                              f"epoch is N passes over the data; pass `sampler=DistributedSampler(dataset)` (no "
                              f"`shuffle=`) and call `sampler.set_epoch(epoch)` every epoch")

    @staticmethod
    def _built_per_rank(dataset: cst.BaseExpression, ctx: FileContext) -> bool:
        """The dataset (or what its name was assigned) is the rank's, or is built with it
        (``Shards(path, rank=rank)``, ``Subset(data, range(rank, n, world))``): it is split per process already."""
        def per_rank(value: cst.BaseExpression) -> bool:
            return depends_on_rank(value, ctx) or isinstance(value, cst.Call) and any(
                isinstance(part, (cst.Name, cst.Attribute, cst.Call)) and depends_on_rank(part, ctx)
                for arg in value.args for part in subtree(arg.value))

        if per_rank(dataset):
            return True
        name = dotted_name(dataset)
        if name is None:
            return False
        for node in subtree(ctx.module):
            if isinstance(node, cst.Assign) and any(dotted_name(t.target) == name for t in node.targets) and \
                    per_rank(node.value):
                return True
        return False
