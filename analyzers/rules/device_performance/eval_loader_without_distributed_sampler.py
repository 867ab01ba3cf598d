"""TR726 eval-loader-without-distributed-sampler: validation/test DataLoader without a DistributedSampler while DDP
training shards its data.
"""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from analyzers.context import (FileContext, argument, dotted_name)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.program.flow import subtree
from analyzers.rules.base import Invalid, Rule
from analyzers.program.roles import is_test_code
from analyzers.program.ranks import rank_guarded
from analyzers.program.library import is_data_loader
from analyzers.program.names import mentions_evaluation_data
from analyzers.program.values import is_ddp_call as _is_ddp_call, DDP_HINT as _DDP_HINT
from analyzers.program.data import is_sharding_sampler as _is_sharding_sampler, may_have_sampler as _may_have_sampler
from analyzers.program.flow import assigned_name as _assigned_name


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
            if any(mentions_evaluation_data(arg.value) for arg in node.args) or any(
                    mentions_evaluation_data(t.target) for t in targets):
                self.eval_sharded = True
        elif is_data_loader(ctx.call_name(node)):
            self._loader(node, ctx)

    def _loader(self, node: cst.Call, ctx: FileContext) -> None:
        if _may_have_sampler(node, max_positional=3) or rank_guarded(node, ctx):
            return
        dataset = argument(node, 0, "dataset")
        parent = ctx.parent(node)
        variable = _assigned_name(node, ctx)
        if dataset is not None and mentions_evaluation_data(dataset):
            self.loaders.append((node, variable, ctx.module.code_for_node(dataset).strip()))
        elif variable is not None and mentions_evaluation_data(parent.targets[0].target):
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
                    not isinstance(ctx.parent(node), cst.AssignTarget) and rank_guarded(node, ctx):
                return True
        return False
