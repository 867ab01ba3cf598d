"""Realistic scenarios for the catalog's part 2: TR203, TR413, TR726, TR727 and torch.norm in TR811."""
from __future__ import annotations

import textwrap
from pathlib import Path

from analyzers.config import Config
from analyzers.engine import analyze_file, analyze_source
from analyzers.rules import get_rule
from tests.test_rules_catalog_b import _findings as in_repository


def run(code: str, *ids: str):
    code = textwrap.dedent(code)
    result = analyze_source(code, "scenario.py", rules=[get_rule(i) for i in ids])
    assert not result.errors, result.errors
    return result.findings


def lines(findings, rule: str) -> list[int]:
    return sorted(f.line for f in findings if f.rule == rule)


# ---- TR203: samples for pictures inside the training loop ---------------------------------------

GAN_SCRIPT = """
import torch
import torch.nn as nn
import torch.optim as optim
from torchvision import utils as tvu


class Generator(nn.Module):
    def __init__(self, nz):
        super().__init__()
        self.main = nn.Sequential(nn.ConvTranspose2d(nz, 64, 4), nn.BatchNorm2d(64), nn.ReLU(True),
                                  nn.ConvTranspose2d(64, 3, 4), nn.Tanh())

    def forward(self, z):
        return self.main(z)


def train_discriminator(D, G, real, opt_d):
    opt_d.zero_grad()
    loss = -(D(real).mean() - D(G(torch.randn(real.size(0), 100, 1, 1)).detach()).mean())
    loss.backward()
    opt_d.step()
    return loss


def main(loader, D, epochs=5):
    G = Generator(100)
    opt_g = optim.Adam(G.parameters(), lr=2e-4)
    opt_d = optim.Adam(D.parameters(), lr=2e-4)
    fixed = torch.randn(64, 100, 1, 1)
    step = 0
    while step < epochs * len(loader):
        for real, _ in loader:
            train_discriminator(D, G, real, opt_d)
            opt_g.zero_grad()
            g_loss = -D(G(torch.randn(real.size(0), 100, 1, 1))).mean()
            g_loss.backward()
            opt_g.step()
            step += 1
            if step % 500 == 0:
                grid = tvu.make_grid(G(fixed).detach().cpu() * 0.5 + 0.5, nrow=8)
                tvu.save_image(grid, f"step_{step}.png")
"""


def test_gan_snapshot_in_a_while_loop_with_a_helper_step():
    findings = run(GAN_SCRIPT, "TR203")
    assert lines(findings, "TR203") == [41]
    message = findings[0].message
    assert "`G(fixed)`" in message and "`G.eval()`" in message and "torch.no_grad()" in message


def test_gan_snapshot_done_right_is_quiet():
    fixed_script = GAN_SCRIPT.replace(
        "                grid = tvu.make_grid(G(fixed).detach().cpu() * 0.5 + 0.5, nrow=8)\n",
        "                G.eval()\n"
        "                with torch.no_grad():\n"
        "                    grid = tvu.make_grid(G(fixed).cpu() * 0.5 + 0.5, nrow=8)\n"
        "                G.train()\n")
    assert run(fixed_script, "TR203") == []


def test_tensorboard_snapshot_in_eval_mode_still_records_autograd():
    code = """
    import torch
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter()
    vae = VAE()
    optimizer = torch.optim.Adam(vae.parameters())
    for epoch in range(10):
        for x, _ in loader:
            recon, mu, logvar = vae(x)
            loss = vae_loss(recon, x, mu, logvar)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        vae.eval()
        samples = vae.decode(z)
        writer.add_images("samples", samples.view(-1, 1, 28, 28), epoch)
        vae.train()
    """
    findings = run(code, "TR203")
    assert lines(findings, "TR203") == [15]
    assert "records an autograd graph" in findings[0].message and "train mode" not in findings[0].message


def test_outputs_that_are_trained_on_or_kept_are_not_snapshots():
    code = """
    import torch
    from torchvision.utils import save_image
    for epoch in range(10):
        for x, _ in loader:
            fake_images = G(torch.randn(64, 100))
            g_loss = criterion(D(fake_images), ones)
            g_loss.backward()
            g_optimizer.step()
        samples_z = G(fixed_z)
        samples.append(samples_z)
        save_image(denorm(fake_images), "fake.png")
    """
    assert run(code, "TR203") == []


# ---- TR413: integer ratios on an old torch ------------------------------------------------------

OLD_EVAL = """
import torch

def evaluate(model, loader):
    model.eval()
    correct, seen = 0, 0
    with torch.no_grad():
        for data, target in loader:
            pred = model(data).max(1)[1]
            correct += (pred == target).sum()
            seen += target.size(0)
    print("accuracy", correct / seen)
    return 100. * correct / seen
"""


def test_integer_ratio_needs_an_old_pin(tmp_path: Path):
    found = in_repository(tmp_path, "torch==1.4.0\n", OLD_EVAL, "TR413")
    assert lines(found, "TR413") == [12, 13]
    assert "floor-divides" in found[0].message and "requirements.txt" in found[0].message
    assert in_repository(tmp_path, "torch>=1.4\n", OLD_EVAL, "TR413") == []
    assert in_repository(tmp_path, "torch==1.13.1\n", OLD_EVAL, "TR413") == []
    # a count that is also reset to something else is not known to be a count
    mixed = OLD_EVAL.replace("            seen += target.size(0)\n", "            seen += target.size(0)\n"
                                                                    "        correct = correct * 1.0\n")
    assert in_repository(tmp_path, "torch==1.4.0\n", mixed, "TR413") == []


def test_integer_ratio_conda_pin(tmp_path: Path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "environment.yml").write_text("dependencies:\n  - python=3.7\n  - pytorch=1.3.1\n")
    script = tmp_path / "metrics.py"
    script.write_text("import torch as T\n\ndef accuracy(logits, y):\n"
                      "    return T.sum(logits.argmax(-1).eq(y)).cpu() / len(y)\n")
    result = analyze_file(script, "metrics.py", Config(select=("TR413",)))
    assert [f.line for f in result.findings] == [4]


def test_item_or_float_counts_are_fine_on_old_torch(tmp_path: Path):
    code = """
    import torch
    def evaluate(model, loader):
        correct = 0
        for x, y in loader:
            correct += model(x).argmax(1).eq(y).sum().item()
        hits = (pred == y).float().sum()
        return correct / len(loader.dataset), hits / len(y), torch.sum(pred == y, dtype=torch.float) / len(y)
    """
    assert in_repository(tmp_path, "torch==1.2.0\n", code, "TR413") == []


# ---- TR726 / TR727: evaluation and printing on every DDP rank -----------------------------------

DDP_SCRIPT = """
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def build_loaders(train_set, val_set, batch_size):
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=DistributedSampler(train_set))
    val_loader = DataLoader(val_set, batch_size=batch_size, shuffle=False, num_workers=4)
    return train_loader, val_loader


def evaluate(model, loader):
    model.eval()
    correct = torch.zeros(1).cuda()
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x.cuda()).argmax(1) == y.cuda()).sum()
    dist.all_reduce(correct)
    return correct.item() / len(loader.dataset)


def main(rank, world_size, train_set, val_set):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    model = nn.parallel.DistributedDataParallel(Net().cuda(rank), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader, val_loader = build_loaders(train_set, val_set, 64)
    for epoch in range(90):
        train_loader.sampler.set_epoch(epoch)
        model.train()
        for step, (x, y) in enumerate(train_loader):
            loss = nn.functional.cross_entropy(model(x.cuda(rank)), y.cuda(rank))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 100 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}")
        acc = evaluate(model, val_loader)
        if rank == 0:
            print(f"epoch {epoch} val acc {acc:.3f}")
"""


def test_ddp_script_evaluates_and_prints_on_every_rank():
    findings = run(DDP_SCRIPT, "TR726", "TR727")
    assert lines(findings, "TR726") == [11]
    assert lines(findings, "TR727") == [39]
    assert "`val_loader` over `val_set`" in next(f.message for f in findings if f.rule == "TR726")


def test_ddp_script_done_right_is_quiet():
    code = DDP_SCRIPT.replace(
        "val_loader = DataLoader(val_set, batch_size=batch_size, shuffle=False, num_workers=4)",
        "val_loader = DataLoader(val_set, batch_size=batch_size, sampler=DistributedSampler(val_set, shuffle=False))",
    ).replace("            if step % 100 == 0:\n", "            if step % 100 == 0 and dist.get_rank() == 0:\n")
    assert run(code, "TR726", "TR727") == []


def test_evaluation_only_on_rank_zero():
    code = DDP_SCRIPT.replace("        acc = evaluate(model, val_loader)\n        if rank == 0:\n",
                              "        if rank == 0:\n            acc = evaluate(model.module, val_loader)\n")
    assert lines(run(code, "TR726"), "TR726") == []


# A launch helper of the project replaces print on the processes that are not the main one, through a function it
# calls; what it is called does not matter, what it does does.
QUIETING_HELPERS = """
import builtins


def keep_print_to(main):
    shown = builtins.print

    def print(*args, **kwargs):
        if main or kwargs.pop("force", False):
            shown(*args, **kwargs)

    builtins.print = print


def start(rank):
    keep_print_to(rank == 0)


def connect(rank):
    return rank
"""


def test_a_print_the_project_keeps_to_the_main_process_is_not_reported(tmp_path: Path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "launch.py").write_text(QUIETING_HELPERS)
    script = tmp_path / "train.py"
    call = '    dist.init_process_group("nccl", rank=rank, world_size=world_size)\n'
    for helper, reported in (("start", []), ("connect", [41])):
        code = DDP_SCRIPT.replace(call, f"{call}    launch.{helper}(rank)\n").replace(
            "import torch\n", "import torch\nimport launch\n", 1)
        script.write_text(code)
        result = analyze_file(script, "train.py", Config(select=("TR727",)))
        assert not result.errors, result.errors
        assert lines(result.findings, "TR727") == reported, helper


def test_a_print_replaced_at_the_top_of_the_file_is_not_reported():
    code = DDP_SCRIPT.replace("import torch\n", "import torch\nimport builtins as _b\n_b.print = quiet_print\n", 1)
    assert lines(run(code, "TR727"), "TR727") == []


def test_notebook_style_module_level_ddp_loop_with_logger():
    code = """
    import logging
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler
    log = logging.getLogger("train")
    model = DDP(net)
    train_dl = DataLoader(train_ds, sampler=DistributedSampler(train_ds))
    test_dl = DataLoader(test_ds, batch_size=512)
    for epoch in range(3):
        for xb, yb in train_dl:
            loss = loss_func(model(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad()
        log.info("epoch %d train loss %.4f", epoch, loss.item())
        print(epoch, evaluate(model, test_dl))
    """
    findings = run(code, "TR726", "TR727")
    assert lines(findings, "TR726") == [9]
    assert lines(findings, "TR727") == [16]


# ---- TR811: torch.norm ----------------------------------------------------------------------------

def test_norm_deprecation_follows_the_pin_and_fixes_only_vector_norms(tmp_path: Path):
    code = """
    import torch
    from torch import linalg

    def lars_ratio(p, dp, eps=1e-8):
        param_norm = torch.norm(p)
        update_norm = torch.norm(dp, p=2)
        return param_norm / (update_norm + eps)

    def spectral(W, kind):
        return torch.norm(W, p=kind, dim=(0, 1))
    """
    assert in_repository(tmp_path, "torch==1.8.1\n", code, "TR811") == []
    found = in_repository(tmp_path, "torch>=1.8\n", code, "TR811")
    assert [f.line for f in found] == [6, 7, 11]
    fixed = textwrap.dedent(code)
    for finding in sorted((f for f in found if f.fix is not None), key=lambda f: -f.line):
        fixed = finding.fix.apply(fixed)
    # written through the file's own import of torch.linalg
    assert "linalg.vector_norm(p)" in fixed and "linalg.vector_norm(dp, ord=2)" in fixed
    assert "torch.norm(W, p=kind, dim=(0, 1))" in fixed
