"""Realistic multi-rule scenarios for the training-loop rules (TR101-TR108)."""
from __future__ import annotations

import textwrap

from analyzers.engine import analyze_source
from analyzers.rules import all_rules


def _training_rules():
    return [r for r in all_rules() if r.id.startswith("TR1")]


def _findings(code: str):
    result = analyze_source(textwrap.dedent(code), "train.py", rules=_training_rules())
    assert not result.errors, result.errors
    return result.findings


CLEAN_SCRIPT = """
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from torch.optim.lr_scheduler import CosineAnnealingLR
from torch.utils.data import DataLoader
from tqdm import tqdm


class Net(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, vocab)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        h, _ = self.rnn(self.drop(self.emb(x)))
        return self.head(h)


@torch.no_grad()
def evaluate(model, loader, device):
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        total += loss
        count += 1
    model.train(was_training)
    return (total / max(count, 1)).item()


def train(args, model, train_loader, val_loader, device):
    optimizer = optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = CosineAnnealingLR(optimizer, T_max=args.epochs * len(train_loader))
    scaler = torch.amp.GradScaler("cuda")
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    best = math.inf
    global_step = 0
    for epoch in range(args.epochs):
        model.train()
        running = 0.0
        pbar = tqdm(enumerate(train_loader), total=len(train_loader))
        for step, (x, y) in pbar:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
                loss = criterion(logits.flatten(0, 1), y.flatten()) / args.accum
            scaler.scale(loss).backward()
            if (step + 1) % args.accum == 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
                global_step += 1
            running += loss.item()
            if step % args.log_every == 0:
                pbar.set_postfix(loss=loss.item(), lr=scheduler.get_last_lr()[0])
        val_loss = evaluate(model, val_loader, device)
        if val_loss < best:
            best = val_loss
            torch.save(model.state_dict(), "best.pt")
        print(f"epoch {epoch}: train {running / len(train_loader):.4f} val {val_loss:.4f}")
    return best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Net(1000, 256).to(device)
    train(args, model, DataLoader([]), DataLoader([]), device)
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
"""


def test_clean_realistic_script_has_no_training_findings():
    assert _findings(CLEAN_SCRIPT) == []


CLEAN_TRAINER_CLASS = """
import torch
from torch import nn


class Trainer:
    def __init__(self, model, loader, val_loader, cfg):
        self.model = model
        self.loader = loader
        self.val_loader = val_loader
        self.optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
        self.lr_scheduler = torch.optim.lr_scheduler.OneCycleLR(self.optimizer, cfg.lr, total_steps=cfg.steps)
        self.criterion = nn.CrossEntropyLoss()

    def _zero(self):
        self.optimizer.zero_grad(set_to_none=True)

    def validate(self):
        self.model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in self.val_loader:
                correct += (self.model(x).argmax(1) == y).sum().item()
        return correct

    def fit(self, epochs):
        history = []
        for epoch in range(epochs):
            self.model.train()
            epoch_loss = torch.zeros(())
            for x, y in self.loader:
                self._zero()
                out = self.model(x)
                loss = self.criterion(out, y)
                loss.backward()
                self.optimizer.step()
                self.lr_scheduler.step()
                epoch_loss += loss.detach()
            history.append(epoch_loss.item())
            acc = self.validate()
        return history
"""


def test_clean_trainer_class_has_no_training_findings():
    assert _findings(CLEAN_TRAINER_CLASS) == []


GAN = """
import torch
import torch.nn as nn
import torch.optim as optim

netG = Generator().cuda()
netD = Discriminator().cuda()
criterion = nn.BCEWithLogitsLoss()
optimizerD = optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))

for epoch in range(25):
    for i, (real, _) in enumerate(dataloader):
        # (1) update D
        optimizerD.zero_grad()
        noise = torch.randn(real.size(0), 100, 1, 1, device="cuda")
        fake = netG(noise)
        errD = criterion(netD(real), ones) + criterion(netD(fake.detach()), zeros)
        errD.backward()
        optimizerD.step()
        # (2) update G -- forgot optimizerG.zero_grad()
        errG = criterion(netD(fake), ones)
        errG.backward()
        optimizerG.step()
        if i % 100 == 0:
            print(f"[{epoch}][{i}] D {errD.item():.3f} G {errG.item():.3f}")
"""


def test_gan_with_one_unzeroed_optimizer():
    findings = _findings(GAN)
    tr101 = [f for f in findings if f.rule == "TR101"]
    assert len(tr101) == 1, findings
    assert "optimizerG" in tr101[0].message
    assert "optimizerD" not in tr101[0].message
    assert tr101[0].line == 24
    assert [f.rule for f in findings] == ["TR101"], findings


DCGAN_STYLE = """
import torch
import torch.optim as optim

optimizerD = optim.Adam(netD.parameters())
optimizerG = optim.Adam(netG.parameters())
for epoch in range(5):
    for i, data in enumerate(dataloader, 0):
        netD.zero_grad()
        errD_real = criterion(netD(data[0]), label)
        errD_real.backward()
        optimizerD.step()
        netG.zero_grad()
        errG = criterion(netD(netG(noise)), label)
        errG.backward()
        optimizerG.step()
"""


def test_dcgan_zeroing_through_modules_is_fine():
    assert [f for f in _findings(DCGAN_STYLE) if f.rule == "TR101"] == []


GRAD_ACCUM = """
import torch
from torch.optim import AdamW

def train(model, loader, accum_steps=8):
    optimizer = AdamW(model.parameters(), lr=3e-4)
    optimizer.zero_grad()
    for micro_step, batch in enumerate(loader):
        loss = model(**batch).loss / accum_steps
        loss.backward()
        if (micro_step + 1) % accum_steps == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
"""


def test_gradient_accumulation_is_fine():
    assert _findings(GRAD_ACCUM) == []


SUMMED_LOSS_ACCUM = """
import torch
import torch.nn.functional as F

for batch in loader:
    optimizer.zero_grad()
    total_loss = 0
    for k, head in enumerate(model.heads):
        l = F.cross_entropy(head(batch.x), batch.y[:, k])
        total_loss = total_loss + l
    total_loss.backward()
    optimizer.step()
"""


def test_summed_multi_head_loss_is_fine():
    assert _findings(SUMMED_LOSS_ACCUM) == []


BUGGY_SCRIPT = """
import torch
import torch.nn as nn
import torch.nn.functional as F


def validate(model, loader):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += F.cross_entropy(model(x), y).item()
    return total


model = nn.Sequential(nn.Linear(10, 10), nn.Dropout(0.5), nn.Linear(10, 2))
optimizer = torch.optim.Adam(model.parameters())
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)
model.train()
epoch_loss = 0
for epoch in range(10):
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        scheduler.step()
        optimizer.step()
        epoch_loss += loss
        torch.cuda.empty_cache()
    validate(model, val_loader)
"""


def test_buggy_script_reports_each_bug_once():
    findings = _findings(BUGGY_SCRIPT)
    rules = sorted(f.rule for f in findings)
    assert rules == ["TR102", "TR104", "TR106", "TR108"], findings
    by_rule = {f.rule: f for f in findings}
    assert "scheduler.step()" in by_rule["TR102"].message
    assert "epoch_loss += loss" in by_rule["TR104"].message
    assert "validate()" in by_rule["TR108"].message and "model" in by_rule["TR108"].message


HF_STYLE = """
import torch
from torch.optim import AdamW
from transformers import get_linear_schedule_with_warmup

model.train()
optimizer = AdamW(model.parameters(), lr=5e-5)
lr_scheduler = get_linear_schedule_with_warmup(optimizer, 100, 1000)
for epoch in range(3):
    for step, batch in enumerate(train_dataloader):
        outputs = model(**batch)
        loss = outputs.loss
        accelerator.backward(loss)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        progress_bar.update(1)
    model.eval()
    for step, batch in enumerate(eval_dataloader):
        with torch.no_grad():
            outputs = model(**batch)
        predictions = outputs.logits.argmax(dim=-1)
        metric.add_batch(predictions=predictions, references=batch["labels"])
    eval_metric = metric.compute()
    model.train()
"""


def test_hf_no_trainer_style_is_fine():
    assert _findings(HF_STYLE) == []


RL_LOOP = """
import torch

policy_opt = torch.optim.Adam(policy.parameters(), lr=3e-4)
while True:
    obs, reward, done, info = env.step(action)
    if done:
        obs = env.reset()
    for _ in range(ppo_epochs):
        loss = ppo_loss(policy, batch)
        policy_opt.zero_grad()
        loss.backward()
        policy_opt.step()
    self_play.step()
"""


def test_rl_loop_with_env_step_is_fine():
    assert _findings(RL_LOOP) == []


MULTI_OPTIMIZER_WRAPPER = """
import torch


class MultipleOptimizer:
    def __init__(self, *optimizers):
        self.optimizers = optimizers

    def zero_grad(self):
        for op in self.optimizers:
            op.zero_grad()

    def step(self):
        for op in self.optimizers:
            op.step()


def freeze_bn(model):
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.eval()


for epoch in range(3):
    for x, y in loader:
        freeze_bn(model)
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
"""


def test_optimizer_wrappers_and_bn_freezing_are_fine():
    assert _findings(MULTI_OPTIMIZER_WRAPPER) == []


VALIDATION_MID_EPOCH = """
import torch


class Trainer:
    def sample(self):
        self.model.eval()
        return self.model.generate()

    def fit(self):
        self.model.train()
        for epoch in range(3):
            for step, batch in enumerate(self.loader):
                self.optimizer.zero_grad()
                loss = self.model(batch).loss
                loss.backward()
                self.optimizer.step()
                if step % 100 == 0:
                    self.sample()
                    print(f"D {loss.item():.3f} lr {self.optimizer.param_groups[0]['lr']}")
"""


def test_mid_epoch_sampling_without_restore():
    findings = _findings(VALIDATION_MID_EPOCH)
    assert [f.rule for f in findings] == ["TR108"], findings
    assert "self.model" in findings[0].message and "sample()" in findings[0].message
    # with train() at the top of each epoch the same code is fine
    fixed = VALIDATION_MID_EPOCH.replace("for epoch in range(3):\n", "for epoch in range(3):\n            self.model.train()\n")
    assert _findings(fixed) == []


PER_STEP_PRINT = """
import torch
generator, discriminator = torch.compile(generator), torch.compile(discriminator)
for epoch in range(n_epochs):
    for i, imgs in enumerate(dataloader):
        imgs = imgs.cuda()
        optimizer_G.zero_grad()
        g_loss = adversarial_loss(discriminator(generator(z)), valid)
        g_loss.backward()
        optimizer_G.step()
        optimizer_D.zero_grad()
        d_loss = adversarial_loss(discriminator(imgs), valid)
        d_loss.backward()
        optimizer_D.step()
        print("[D loss: %f] [G loss: %f]" % (d_loss.item(), g_loss.item()))
"""


def test_per_step_print_reported_once_per_log_call():
    findings = _findings(PER_STEP_PRINT)
    assert [f.rule for f in findings] == ["TR105"], findings
    assert "d_loss.item()" in findings[0].message


def test_per_step_sync_is_reported_only_where_the_program_keeps_the_gpu_busy():
    # the same eager loop without compiling anything: one host read for a log is not worth a comment
    eager = PER_STEP_PRINT.replace("generator, discriminator = torch.compile(generator), torch.compile(discriminator)\n", "")
    assert _findings(eager) == []
    # a CUDA graph replayed every step is as much built for throughput as a compiled model
    graphed = eager.replace("import torch\n", "import torch\ngraph = torch.cuda.CUDAGraph()\n")
    assert [f.rule for f in _findings(graphed)] == ["TR105"]
