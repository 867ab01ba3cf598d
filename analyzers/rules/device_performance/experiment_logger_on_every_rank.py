"""TR725 experiment-logger-on-every-rank: wandb.init() / SummaryWriter() created on every DDP rank."""
from __future__ import annotations

import re

import libcst as cst

from analyzers.context import (FileContext)
from analyzers.markdown import code_span
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid
from analyzers.program.names import node_text
from analyzers.program.ranks import depends_on_rank, rank_guarded
from analyzers.program.values import DDP_HINT as _DDP_HINT
from analyzers.rules.device_performance._distributed import CallsOnEveryRank as _CallsOnEveryRank


_LOGGERS = {"wandb.init", "torch.utils.tensorboard.SummaryWriter", "torch.utils.tensorboard.writer.SummaryWriter",
            "tensorboardX.SummaryWriter", "mlflow.start_run", "neptune.init_run", "neptune.init", "comet_ml.Experiment",
            "comet_ml.start", "aim.Run"}


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
        return (ctx.call_name(node) in _LOGGERS and not rank_guarded(node, ctx)
                and not any(depends_on_rank(arg.value, ctx) or depends_on_rank(ctx.origin(arg.value) or arg.value, ctx)
                            for arg in node.args))

    def end_file(self, ctx: FileContext) -> None:
        for call, _fn in self.unguarded_calls(ctx):
            self.report(call, f"{code_span(node_text(ctx, call))} runs on every DDP rank: each process starts its own "
                              f"run / event file and logs its own shard's metrics; create it only on rank 0 "
                              f"(`if dist.get_rank() == 0:`)")
