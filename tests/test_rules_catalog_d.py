"""Realistic scenarios for the catalog's part 2, third batch: TR114 (optimizer built before a layer swap),
TR115 (per-step synchronize / all_reduce for logging), TR414 (log1p / expm1), TR704 (hard-coded CUDA) and
TR728 (a DDP training loader without a distributed sampler)."""
from __future__ import annotations

import textwrap

from analyzers.config import Config
from analyzers.engine import analyze_text
from tests.test_notebooks import notebook
from tests.test_rules_catalog_c import lines, run


# ---- TR414: log(1 + x) and exp(x) - 1 -----------------------------------------------------------

def test_log1p_through_every_import_spelling():
    findings = run("""
        import torch
        import torch as th
        from torch import log, exp

        def density(rate, t, eps):
            rate = rate.to(torch.bfloat16)
            a = torch.log(1. + rate)
            b = th.log(rate * t + 1)
            c = log(1 + eps)
            d = exp(t) - 1
            return a + b + c + d
        """, "TR414")
    assert lines(findings, "TR414") == [8, 9, 10, 11]
    fixes = {f.line: f.fix for f in findings}
    assert fixes[8].replacement.strip() == "a = torch.log1p(rate)"
    assert fixes[9].replacement.strip() == "b = th.log1p(rate * t)"
    # a bare ``log`` / ``exp`` imported from torch: the name to write is not in scope, so no fix is offered
    assert fixes[10] is None and fixes[11] is None
    assert "torch.log1p(x)" in next(f.message for f in findings if f.line == 10)


def test_log1p_in_a_loss_helper_and_a_while_loop():
    findings = run("""
        import torch
        import torch.nn.functional as F

        def poisson_nll(log_rate, counts):
            return (log_rate.exp() - counts * log_rate).mean()

        def shrink(weights, lam):
            step = 0
            while step < 10 and weights.dtype == torch.float16:
                weights = weights * (weights.exp() - 1)
                weights = torch.log(weights * lam + 1)
                step += 1
            return F.softplus(weights)
        """, "TR414")
    assert lines(findings, "TR414") == [11, 12]


def test_numpy_math_softplus_and_stable_code_are_quiet():
    assert run("""
        import math
        import numpy as np
        import torch

        y = np.log(1 + counts)
        z = np.exp(x) - 1
        w = math.log(1 + lr)
        sp = torch.log(1 + torch.exp(x))          # softplus: TR411's finding
        sp2 = torch.log(1 + x.exp())
        ok = torch.log1p(x) + torch.expm1(x)
        symlog = torch.sign(rel) * torch.log(1.0 + rel.abs()) + torch.log(1 + torch.abs(rel))
        ranks = torch.log(1 + torch.arange(n, device=x.device)) + (torch.exp(pos.long()) - 1)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pass
        shifted = torch.log(2 + x) + torch.exp(x) - 2
        constant = torch.log(torch.tensor(1 + 1e-3))
        both = torch.log(1 + 1)
        """, "TR414") == []


def test_log1p_in_a_notebook_cell():
    nb = notebook(("markdown", "# Features\n"),
                  ("code", "import torch\n"),
                  ("code", "x = torch.rand(8, dtype=torch.bfloat16)\nfeatures = torch.log(1 + x)\n"))
    result = analyze_text(nb, "features.ipynb", Config(select=("TR414",)))
    assert [(f.rule, f.cell, f.line) for f in result.findings] == [("TR414", 3, 2)]
    assert result.findings[0].fix is not None


def test_float32_code_is_quiet():
    assert run("""
        import torch
        def density(rate):
            return torch.log(1 + rate) + torch.exp(rate) - 1
        """, "TR414") == []


# ---- TR114: the optimizer built before a layer (or the model) is replaced ------------------------

FINETUNE_CELLS = [
    ("code", "import torch\nimport torch.nn as nn\nimport torch.optim as optim\nfrom torchvision import models\n"),
    ("code", "model = models.densenet121(weights='DEFAULT')\nfor p in model.parameters():\n    p.requires_grad = False\n"
             "optimizer = optim.Adam(model.parameters(), lr=1e-3)\n"),
    ("markdown", "Replace the classifier\n"),
    ("code", "model.classifier[0] = nn.Linear(1024, 2)\n"),
    ("code", "for x, y in loader:\n    optimizer.zero_grad()\n    loss = criterion(model(x), y)\n"
             "    loss.backward()\n    optimizer.step()\n"),
]


def test_notebook_head_swapped_in_a_later_cell():
    result = analyze_text(notebook(*FINETUNE_CELLS), "finetune.ipynb", Config(select=("TR114",)))
    assert [(f.rule, f.cell, f.line) for f in result.findings] == [("TR114", 4, 1)]
    (finding,) = result.findings
    assert "`optimizer` was built over `model.parameters()`" in finding.message


def test_notebook_in_the_right_order_is_quiet():
    cells = [FINETUNE_CELLS[0], FINETUNE_CELLS[3], FINETUNE_CELLS[1], FINETUNE_CELLS[4]]
    assert analyze_text(notebook(*cells), "finetune.ipynb", Config(select=("TR114",))).findings == []


def test_tutorial_params_to_update_list_then_head_swap_in_a_helper():
    findings = run("""
        import torch
        from torch import nn, optim

        def build(num_classes, feature_extract):
            model = torchvision.models.resnet50(weights="DEFAULT")
            params_to_update = []
            for name, param in model.named_parameters():
                if param.requires_grad:
                    params_to_update.append(param)
            optimizer_ft = optim.SGD(params_to_update, lr=0.001, momentum=0.9)
            model.fc = nn.Linear(model.fc.in_features, num_classes)
            return train_model(model, dataloaders, criterion, optimizer_ft, num_epochs=25)
        """, "TR114")
    assert lines(findings, "TR114") == [12]
    (finding,) = findings
    assert "`optimizer_ft` was built over `model.parameters()`" in finding.message
    assert [(site.line, site.message) for site in finding.related] == [(11, "`optimizer_ft` built here")]


def test_trainer_class_attributes_and_a_while_loop():
    findings = run("""
        import torch
        import torch.nn as nn

        class Trainer:
            def __init__(self, model, cfg):
                self.model = model
                self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)
                self.model.head = nn.Linear(cfg.dim, cfg.num_classes)

            def fit(self, loader):
                ...

        def loop(model, opt, loader, steps):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            model.embed = nn.Embedding(1000, 64)
            step = 0
            while step < steps:
                for x, y in loader:
                    opt.zero_grad()
                    nn.functional.mse_loss(model(x), y).backward()
                    opt.step()
                step += 1
        """, "TR114")
    # the trainer's optimizer is never stepped in __init__: nothing to say there (it is used elsewhere)
    assert lines(findings, "TR114") == [16]


def test_exclusive_branches_wrappers_and_rebuilt_optimizers_are_quiet():
    assert run("""
        import torch
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP

        def main(args):
            model = Net()
            if args.finetune:
                optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            else:
                model.fc = nn.Linear(512, 10)
                optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.1)
            model = DDP(model.cuda(), device_ids=[args.gpu])
            model = torch.compile(model)
            train(model, optimizer)

        def sweep(folds):
            optimizer = None
            for fold in folds:
                model = Net()
                optimizer = torch.optim.Adam(model.parameters())
                train(model, optimizer)

        def swap_then_step(model, loader):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            try:
                model.fc = nn.Linear(512, 10)
            except AttributeError:
                opt.step()
        """, "TR114") == []


# ---- TR115: synchronize / all_reduce on every step for a log line ---------------------------------

def test_synchronize_through_import_spellings_and_a_while_loop():
    findings = run("""
        import time
        from timeit import default_timer as timer
        import torch
        from torch.cuda import synchronize

        def train(model, loader, opt):
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                synchronize()
                times.append(timer() - t0)

        def train_steps(model, it, opt, steps):
            step = 0
            while step < steps:
                loss = model(next(it))
                loss.backward()
                opt.step()
                torch.cuda.synchronize()
                t1 = time.perf_counter()
                step += 1
        """, "TR115")
    assert lines(findings, "TR115") == [12, 21]


def test_synchronize_that_nothing_times_and_guarded_reductions_are_quiet():
    assert run("""
        import time
        import torch
        import torch.distributed as dist

        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()          # nothing after it reads a timer or logs
            optimizer.zero_grad()

        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if step % args.log_every == 0 or step == last:
                torch.cuda.synchronize()
                reduced = loss.detach().clone()
                dist.all_reduce(reduced)
                logger.info("loss %.4f %.2fs", reduced.item(), time.time() - t0)
        """, "TR115") == []


def test_synchronize_every_step_for_a_log_every_n_steps():
    findings = run("""
        import time
        import torch
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()
            if step % 100 == 0:
                print(f"{time.time() - t0:.2f}s")
        """, "TR115")
    assert lines(findings, "TR115") == [8]


def test_reduced_loss_from_every_import_spelling():
    findings = run("""
        import torch
        from torch.distributed import all_reduce, ReduceOp

        def train(model, loader, optimizer, writer):
            for step, batch in enumerate(loader):
                loss = model(**batch).loss
                loss.backward()
                optimizer.step()
                loss_for_log = loss.detach().clone()
                all_reduce(loss_for_log, op=ReduceOp.AVG)
                writer.add_scalar("train/loss", loss_for_log, step)
                history.append(loss_for_log)
                torch.distributed.all_reduce(loss_sum := loss.detach())
        """, "TR115")
    assert lines(findings, "TR115") == [11]


def test_helper_in_another_file_is_not_guessed():
    # ``utils.reduce_tensor`` may or may not run a collective: nothing is said without its body
    assert run("""
        import torch
        import utils
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            reduced_loss = utils.reduce_tensor(loss.data, world_size)
            losses.update(reduced_loss.item(), x.size(0))
        """, "TR115") == []


def test_synchronize_in_a_notebook_training_cell():
    nb = notebook(("code", "import time\nimport torch\n"),
                  ("code", "for x, y in loader:\n    loss = loss_fn(model(x.cuda()), y.cuda())\n    loss.backward()\n"
                           "    opt.step()\n    torch.cuda.synchronize()\n    print(time.time() - t0)\n"))
    result = analyze_text(nb, "train.ipynb", Config(select=("TR115",)))
    assert [(f.rule, f.cell, f.line) for f in result.findings] == [("TR115", 2, 5)]


# ---- TR728: a DDP training loader without a distributed sampler ---------------------------------

def test_torchrun_script_with_aliases_and_an_iterator_loop():
    findings = run("""
        import os
        import torch
        from torch.distributed import init_process_group, destroy_process_group
        from torch.nn.parallel import DistributedDataParallel
        import torch.utils.data as tud

        def main():
            init_process_group(backend="nccl")
            local_rank = int(os.environ["LOCAL_RANK"])
            model = DistributedDataParallel(GPT(cfg).to(local_rank), device_ids=[local_rank])
            loader = tud.DataLoader(corpus, batch_size=12, shuffle=True, pin_memory=True)
            val_loader = tud.DataLoader(held_out, batch_size=12)
            it = iter(loader)
            step = 0
            while step < 1000:
                x, y = next(it)
                loss = model(x, y)
                loss.backward()
                step += 1
            for batch in tqdm(loader):
                model(batch).mean().backward()
            destroy_process_group()
        """, "TR728")
    assert lines(findings, "TR728") == [12]
    assert "`loader` over `corpus`" in findings[0].message


def test_rank_split_subsets_samplers_in_helpers_and_frameworks_are_quiet():
    assert run("""
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader, Subset
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("nccl")
        rank, world = dist.get_rank(), dist.get_world_size()
        model = DDP(net)
        shard = Subset(train_set, range(rank, len(train_set), world))
        train_loader = DataLoader(shard, batch_size=64, shuffle=True)
        for x, y in train_loader:
            model(x).sum().backward()
        """, "TR728") == []
    assert run("""
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader
        from torch.nn.parallel import DistributedDataParallel as DDP
        from accelerate import Accelerator

        dist.init_process_group("nccl")
        model = DDP(net)
        train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
        model, train_loader = Accelerator().prepare(model, train_loader)
        """, "TR728") == []
    assert run("""
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader
        from torch.nn.parallel import DistributedDataParallel as DDP
        import samplers

        def loaders(train_set, args):
            sampler = samplers.DistributedEvalSampler(train_set) if args.eval_all else None
            return DataLoader(train_set, batch_size=64, sampler=sampler)

        def main():
            dist.init_process_group("gloo")
            model = DDP(net)
            train_loader = DataLoader(train_set, batch_size=64)
            test_loader = DataLoader(test_set, batch_size=64)
        """, "TR728") == []


def test_ddp_training_notebook_cell():
    nb = notebook(("code", "import torch\nimport torch.distributed as dist\n"
                           "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                           "from torch.utils.data import DataLoader\n"),
                  ("code", "dist.init_process_group('gloo', rank=rank, world_size=2)\nddp_model = DDP(model)\n"
                           "train_loader = DataLoader(train_data, batch_size=32, shuffle=True)\n"))
    result = analyze_text(nb, "ddp.ipynb", Config(select=("TR728",)))
    assert [(f.rule, f.cell, f.line) for f in result.findings] == [("TR728", 2, 3)]
    single = nb.replace("world_size=2", "world_size=1")
    assert analyze_text(single, "ddp.ipynb", Config(select=("TR728",))).findings == []


# ---- TR704: hard-coded CUDA beside a device selection with a CPU fallback ----------------------

def test_hard_coded_cuda_in_a_helper_and_a_while_loop():
    findings = run("""
        import torch

        DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

        def collate(batch):
            xs = torch.stack([b[0] for b in batch]).cuda(non_blocking=True)
            return xs, torch.tensor([b[1] for b in batch], device="cuda:0")

        def train(model, it):
            model.to(DEVICE)
            step = 0
            while step < 100:
                x, y = next(it)
                loss = model(x.to("cuda"), y.to(DEVICE))
                step += 1
        """, "TR704")
    assert lines(findings, "TR704") == [7, 8, 15]


def test_guarded_cuda_and_gpu_helpers_are_quiet():
    assert run("""
        import torch
        device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        train_on_gpu = torch.cuda.is_available()
        if train_on_gpu:
            model.cuda()
        while args.cuda and pending:
            pending.pop().cuda()
        def gpu_batch(x):
            return x.cuda(non_blocking=True)
        y = y.to(device)
        """, "TR704") == []


def test_hard_coded_cuda_in_a_notebook():
    nb = notebook(("code", "import torch\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'\n"),
                  ("code", "model = Net().to(device)\nfor x, y in loader:\n    out = model(x.cuda())\n"))
    result = analyze_text(nb, "nb.ipynb", Config(select=("TR704",)))
    assert [(f.rule, f.cell, f.line) for f in result.findings] == [("TR704", 2, 3)]


def test_log1p_in_test_references_is_quiet(tmp_path):
    code = "import torch\nref = lambda i: torch.where(i > 0, i, (i.exp() - 1)).to(torch.float16)\n"
    for path in ("torch/testing/_internal/common_modules.py", "tests/test_elu.py"):
        assert analyze_text(code, path, Config(select=("TR414",))).findings == []
    assert lines(analyze_text(code, "model/elu.py", Config(select=("TR414",))).findings, "TR414") == [2]


# ---- TR705: a DataLoader's batches fed unmoved to a model moved to the GPU -----------------------

def test_unmoved_batch_through_a_training_function_and_its_call_site():
    findings = run("""
        import torch
        from torch.utils.data import DataLoader
        from torchvision import datasets

        def train(args, model, device, train_loader, optimizer):
            model.train()
            for batch_idx, (data, target) in enumerate(train_loader):
                target = target.to(device)
                optimizer.zero_grad()
                loss = F.nll_loss(model(data), target)

        def main():
            if use_accel:
                device = torch.accelerator.current_accelerator()
            else:
                device = torch.device("cpu")
            train_kwargs = {"batch_size": 64}
            loader_kwargs = {"num_workers": 1, "pin_memory": True} if use_accel else {}
            train_kwargs.update(loader_kwargs)
            train_loader = torch.utils.data.DataLoader(datasets.MNIST("../data"), **train_kwargs)
            model = Net().to(device)
            train(args, model, device, train_loader, optimizer)
        """, "TR705")
    assert lines(findings, "TR705") == [11]
    finding = findings[0]
    assert "`data` from `train_loader` reaches `model(...)`" in finding.message
    assert "`.to(device)` (line 22)" in finding.message and "`data = data.to(device)`" in finding.message
    assert [r.line for r in finding.related] == [22]


def test_dict_batch_given_as_keywords_and_a_thrown_away_move():
    findings = run("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = Net().to(device)
        features = torch.randn(100, 8)
        loader = DataLoader(TensorDataset(features, torch.randint(0, 2, (100,))), batch_size=10)
        for batch in loader:
            out = model(**batch)
        while True:
            for x, y in loader:
                x.to(device)
                out = model(x)
            break
        """, "TR705")
    assert lines(findings, "TR705") == [9, 13]
    assert "each tensor of `batch`" in findings[0].message and "`**batch`" in findings[0].message
    assert "`x.to(device)` on line 12 returns a moved copy that is thrown away" in findings[1].message


def test_trainer_class_loader_attribute_is_followed_to_its_one_assignment():
    code = """
        import torch
        from torch.utils.data import DataLoader
        from torchvision.datasets import CIFAR10

        class Trainer:
            def __init__(self, model, device):
                self.device = device
                self.model = model.to(device)
                self.train_loader = DataLoader(CIFAR10("data", train=True), batch_size=64, shuffle=True)

            def train_epoch(self):
                for step, (inputs, targets) in enumerate(self.train_loader):
                    outputs = self.model(inputs)
                    loss = criterion(outputs, targets.to(self.device))
        """
    findings = run(code, "TR705")
    assert lines(findings, "TR705") == [14]
    assert "`inputs` from `self.train_loader` reaches `self.model(...)`" in findings[0].message
    # the hint spells the device as the method can: the attribute __init__ kept, not its parameter
    assert "`inputs = inputs.to(self.device)`" in findings[0].message
    # rebound by accelerate's prepare in __init__: the attribute holds the prepared loader
    prepared = code.replace('shuffle=True)\n', 'shuffle=True)\n                self.model, self.train_loader = '
                                                 'self.accelerator.prepare(self.model, self.train_loader)\n')
    assert "prepare(self.model, self.train_loader)" in prepared
    assert run(prepared, "TR705") == []


def test_a_model_moved_with_cuda_gets_a_cuda_hint():
    findings = run("""
        import torch
        from torch.utils.data import DataLoader
        from torchvision import datasets
        model = LeNet()
        if torch.cuda.is_available():
            model.cuda()
        for data, target in DataLoader(datasets.MNIST("data"), batch_size=64):
            output = model(data)
        for batch in DataLoader(datasets.MNIST("data"), batch_size=64):
            output = model(batch[0])
        """, "TR705")
    assert lines(findings, "TR705") == [9, 11]
    assert "`data = data.cuda()`" in findings[0].message and "device)" not in findings[0].message
    assert "move each tensor of `batch` to the GPU in the loop" in findings[1].message


def test_tensors_unpacked_into_a_tensor_dataset_are_followed():
    # ``X_val, y_val = ...`` unpacks CPU tensors: the batches stay on the CPU; the same unpacking of moved tensors
    # holds GPU batches already
    findings = run("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = Regressor().to(device)
        X_val, y_val = torch.randn(50, 3), torch.randn(50)
        X_gpu, y_gpu = torch.randn(50, 3).to(device), torch.randn(50).to(device)
        with torch.no_grad():
            for xb, yb in DataLoader(TensorDataset(X_val, y_val), batch_size=10):
                pred = model(xb)
            for xb, yb in DataLoader(TensorDataset(X_gpu, y_gpu), batch_size=10):
                pred = model(xb)
        """, "TR705")
    assert lines(findings, "TR705") == [10]
    assert "`xb` from `DataLoader(TensorDataset(X_val" in findings[0].message


def test_batches_moved_guarded_or_wrapped_are_quiet():
    assert run("""
        import torch
        from torch.utils.data import DataLoader
        from torchvision import datasets
        train_on_gpu = torch.cuda.is_available()
        device = torch.device("cuda" if train_on_gpu else "cpu")
        model = Net()
        if train_on_gpu:
            model.cuda()
        loader = DataLoader(datasets.CIFAR10("d"), batch_size=20)
        for data, target in loader:
            if train_on_gpu:
                data, target = data.cuda(), target.cuda()
            output = model(data)
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            out = model(**batch)
        for batch in loader:
            move_batch(batch, device)
            out = model(batch["x"])
        # a model that stays on the CPU, passed to the same kind of helper
        def evaluate(net, eval_loader):
            for x, y in eval_loader:
                net(x)
        evaluate(Net(), DataLoader(datasets.MNIST("d")))
        """, "TR705") == []


def test_data_the_file_does_not_show_on_the_cpu_is_quiet():
    assert run("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        from project.data import ShardDataset
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = Net().to(device)
        on_gpu = TensorDataset(torch.randn(10, 3).to(device))
        for (x,) in DataLoader(on_gpu):
            model(x)
        for x in DataLoader(ShardDataset("shards")):
            model(x)
        for x in DataLoader(make_dataset(), collate_fn=lambda b: torch.stack(b).to(device)):
            model(x)
        for x in DataLoader(TensorDataset(torch.randn(10, 3)), **options):
            model(x)
        """, "TR705") == []


def test_a_model_that_moves_its_inputs_itself_is_quiet():
    assert run("""
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset

        class Net(nn.Module):
            def forward(self, x):
                x = x.to(self.fc.weight.device)
                return self.fc(x)

        model = Net().cuda()
        for x, y in DataLoader(TensorDataset(torch.randn(10, 3), torch.randn(10))):
            model(x)
        """, "TR705") == []


def test_unmoved_batch_in_a_notebook():
    nb = notebook(("code", "import torch\nfrom torch.utils.data import DataLoader\nfrom torchvision import datasets\n"
                           "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"),
                  ("code", "model = Net().to(device)\ntest_loader = DataLoader(datasets.MNIST('d', train=False))\n"),
                  ("code", "with torch.no_grad():\n    for images, labels in test_loader:\n"
                           "        correct += (model(images).argmax(1) == labels).sum()\n"))
    result = analyze_text(nb, "nb.ipynb", Config(select=("TR705",)))
    assert [(f.rule, f.cell, f.line) for f in result.findings] == [("TR705", 3, 3)]


# ---- TR701 at high: CPU position ids into a CUDA embedding table ---------------------------------

def test_position_ids_into_an_embedding_are_high_other_factories_stay_medium():
    findings = run("""
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        class GPT(nn.Module):
            def __init__(self):
                super().__init__()
                self.wpe = nn.Embedding(64, 32)
                self.head = nn.Linear(32, 100)

            def forward(self, idx):
                b, t = idx.size()
                pos = torch.arange(0, t, dtype=torch.long)
                x = self.wpe(pos)
                table = F.embedding(torch.arange(t)[None], self.wpe.weight)
                mask = torch.ones(t, t)
                return self.head(x + table) * mask

        model = GPT().cuda()
        """, "TR701")
    assert [(f.line, f.severity.label) for f in findings] == [(14, "high"), (16, "high"), (17, "medium")]
    assert "feeds them to the embedding `self.wpe`" in findings[0].message
    assert "`F.embedding`" in findings[1].message


def test_a_name_rebound_to_a_buffer_before_the_lookup_is_not_the_new_tensor():
    # ``pos`` first holds CPU indices for a mask, then the registered buffer the embedding reads: medium, not high;
    # a rebinding from itself (``pos = pos.unsqueeze(0)``) still feeds the new tensor
    findings = run("""
        import torch
        from torch import nn

        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.pe = nn.Embedding(256, 16)
                self.register_buffer("pos_ids", torch.arange(256))

            def forward(self, x):
                t = x.size(1)
                pos = torch.arange(t)
                causal = pos[None, :] <= pos[:, None]
                pos = self.pos_ids[:t]
                return self.pe(pos), causal

        class Decoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.pe = nn.Embedding(256, 16)

            def forward(self, x):
                ids = torch.arange(x.size(1))
                ids = ids.unsqueeze(0)
                return self.pe(ids)

        model = Encoder().cuda()
        """, "TR701")
    assert [(f.line, f.severity.label) for f in findings] == [(13, "medium"), (24, "high")]


def test_position_ids_with_a_device_are_quiet():
    assert run("""
        import torch
        import torch.nn as nn

        class GPT(nn.Module):
            def __init__(self):
                super().__init__()
                self.wpe = nn.Embedding(64, 32)

            def forward(self, idx):
                pos = torch.arange(idx.size(1), device=idx.device)
                return self.wpe(pos)

        model = GPT().cuda()
        """, "TR701") == []


def test_cpu_side_inputs_models_moved_back_and_raw_text_data_are_quiet():
    assert run("""
        import torch
        from torch.utils.data import DataLoader, Dataset, TensorDataset
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = RNNClassifier().to(device)
        loader = DataLoader(TensorDataset(tokens, lengths, labels), batch_size=32)
        for text, text_lengths, label in loader:
            text = text.to(device)
            # pack_padded_sequence wants the lengths on the CPU
            predictions = model(text, text_lengths)

        exported = Net().to(device)
        exported = exported.cpu()
        for x, y in DataLoader(TensorDataset(xs, ys)):
            exported(x)

        class Captions(Dataset):
            def __getitem__(self, i):
                return self.lines[i]
        encoder = SentenceEncoder().to(device)
        for sentences in DataLoader(Captions()):
            encoder(sentences)
        """, "TR705") == []


def test_position_ids_in_a_model_file_that_moves_nothing_itself_are_medium():
    # nanoGPT's layout: model.py never moves the model (train.py does), yet CPU position ids into the module's own
    # embedding break on any GPU; other factories need the file's CUDA evidence, as before
    findings = run("""
        import torch
        import torch.nn as nn

        class GPT(nn.Module):
            def __init__(self):
                super().__init__()
                self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(100, 32), wpe=nn.Embedding(64, 32)))

            def forward(self, idx, targets=None):
                b, t = idx.size()
                pos = torch.arange(0, t, dtype=torch.long)
                mask = torch.ones(t, t)
                return self.transformer.wte(idx) + self.transformer.wpe(pos), mask
        """, "TR701")
    assert [(f.line, f.severity.label) for f in findings] == [(12, "medium")]
    assert "as soon as the model runs on a GPU" in findings[0].message and "device=idx.device" in findings[0].message
