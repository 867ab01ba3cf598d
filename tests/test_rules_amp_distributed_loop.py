"""Whole-file scenarios for the AMP (TR710-TR713), distributed (TR720-TR725) and loop/memory (TR110-TR113,
TR510-TR514) rules: a buggy DDP + AMP training script finds each bug once, its fixed version finds none."""
from __future__ import annotations

import textwrap

from analyzers.engine import analyze_source
from analyzers.rules import get_rule

RULES = ("TR110", "TR111", "TR112", "TR113", "TR510", "TR511", "TR512", "TR513", "TR514",
         "TR710", "TR711", "TR712", "TR713", "TR720", "TR962", "TR722", "TR723", "TR724", "TR725")


def findings(code: str, path: str = "train.py"):
    rules = [get_rule(r) for r in RULES]
    result = analyze_source(textwrap.dedent(code), path, rules=rules)
    assert not result.errors, result.errors
    return sorted((f.rule, f.line) for f in result.findings)


BUGGY_DDP = """
import os
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import wandb
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        x = F.dropout(F.relu(self.fc1(x)), p=0.2)
        return self.fc2(x)


def main():
    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    model = DDP(Net().to(rank), device_ids=[rank])
    for p in model.module.fc1.parameters():
        p.require_grad = False
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=64, shuffle=True, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.cuda.amp.GradScaler()
    wandb.init(project="demo")
    for epoch in range(10):
        for i, (x, y) in enumerate(loader):
            with torch.autocast("cuda"):
                loss = F.cross_entropy(model(x.to(rank)), y.to(rank))
            scaler.scale(loss).backward()
            if (i + 1) % accum_steps == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                optimizer.zero_grad()
        torch.save(model.module.state_dict(), "ckpt.pt")
"""

FIXED_DDP = """
import contextlib
import os
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import wandb
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        x = F.dropout(F.relu(self.fc1(x)), p=0.2, training=self.training)
        return self.fc2(x)


def main():
    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    model = DDP(Net().to(rank), device_ids=[rank])
    for p in model.module.fc1.parameters():
        p.requires_grad = False
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=64, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.cuda.amp.GradScaler()
    if rank == 0:
        wandb.init(project="demo")
    for epoch in range(10):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            sync = (i + 1) % accum_steps == 0
            with model.no_sync() if not sync else contextlib.nullcontext():
                with torch.autocast("cuda"):
                    loss = F.cross_entropy(model(x.to(rank)), y.to(rank)) / accum_steps
                scaler.scale(loss).backward()
            if (i + 1) % accum_steps == 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        if rank == 0:
            torch.save(model.module.state_dict(), "ckpt.pt")
"""


def test_buggy_ddp_amp_script_finds_each_bug():
    found = findings(BUGGY_DDP)
    assert [rule for rule, _ in found] == sorted([
        "TR111",  # loss not divided by accum_steps
        "TR513",  # F.dropout without training=
        "TR514",  # p.require_grad
        "TR712",  # scaler.step without scaler.update
        "TR713",  # clip before unscale_
        "TR720",  # no set_epoch
        "TR962",  # shuffle=True with sampler= (TR721 was folded into TR962)
        "TR722",  # torch.save on every rank
        "TR723",  # accumulation without no_sync
        "TR725",  # wandb.init on every rank
    ]), found


def test_fixed_ddp_amp_script_is_clean():
    assert findings(FIXED_DDP) == []


RNN_LM = """
import torch
import torch.nn as nn

model = RNNModel(ntokens, 200, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=lr)
criterion = nn.CrossEntropyLoss()
for epoch in range(1, epochs + 1):
    hidden = model.init_hidden(batch_size)
    outputs = []
    for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
        data, targets = get_batch(train_data, i)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output.view(-1, ntokens), targets)
        loss.backward(retain_graph=True)
        optimizer.step()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        outputs.append(output)
    lr /= 4.0
"""

RNN_LM_FIXED = """
import torch
import torch.nn as nn

model = RNNModel(ntokens, 200, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=lr)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.25)
criterion = nn.CrossEntropyLoss()
for epoch in range(1, epochs + 1):
    hidden = model.init_hidden(batch_size)
    outputs = []
    for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
        data, targets = get_batch(train_data, i)
        model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output.view(-1, ntokens), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        outputs.append(output.detach())
    scheduler.step()
"""


def test_rnn_language_model_loop():
    assert [rule for rule, _ in findings(RNN_LM)] == ["TR110", "TR113", "TR510", "TR511", "TR512"]
    assert findings(RNN_LM_FIXED) == []


def test_fp16_autocast_and_plain_step():
    code = """
    import torch
    scaler = None
    def train(model, loader, optimizer):
        for x, y in loader:
            with torch.cuda.amp.autocast():
                loss = model(x, y)
            loss.backward()
            optimizer.step()
    """
    assert findings(code) == []  # a name "scaler" in the file: the scaler may be used elsewhere
    code = code.replace("    scaler = None\n", "")
    assert [rule for rule, _ in findings(code)] == ["TR710"]
    plain = """
    import torch
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = model(x, y)
        scaler.scale(loss).backward()
        optimizer.step()
        scaler.update()
    """
    assert [rule for rule, _ in findings(plain)] == ["TR711"]
