"""Realistic scenarios for the catalog's part 2, fourth batch: TR613 (a checkpoint loaded without map_location in
a script that falls back to the CPU), TR116 (a frozen BatchNorm backbone left in train mode) and TR117 (an
optimizer over a part of a model whose other parameters still get gradients)."""
from __future__ import annotations

import textwrap

from analyzers.config import Config
from analyzers.engine import analyze_file, analyze_text
from tests.test_notebooks import notebook
from tests.test_rules_catalog_c import lines, run


# ---- TR613: torch.load without map_location beside a CPU fallback -------------------------------

def test_map_location_fix_is_safe_only_when_the_state_goes_into_load_state_dict():
    findings = run("""
        import torch
        import torch.nn as nn
        device = "cuda" if torch.cuda.is_available() else "cpu"
        encoder.load_state_dict(torch.load(args.encoder_path))
        checkpoint = torch.load(args.resume)
        model.load_state_dict(checkpoint["model"])
        torch.set_rng_state(checkpoint["rng"])
        """, "TR613")
    assert lines(findings, "TR613") == [5, 6]
    by_line = {f.line: f for f in findings}
    fixed = "encoder.load_state_dict(torch.load(args.encoder_path, map_location=device))"
    assert by_line[5].fix.replacement.strip() == fixed
    assert by_line[5].fix.safe is True
    # a CPU tensor kept in the checkpoint (an RNG state) would be moved too: the fix changes behaviour
    assert by_line[6].fix.safe is False


def test_a_keyword_other_than_map_location_does_not_map():
    # ``weights_only=True`` restores tensors where they were saved like any load; a positional second argument maps
    findings = run("""
        import torch
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
        def restore(model, path):
            model.load_state_dict(torch.load(path, weights_only=True))
        def restore_mapped(model, path):
            model.load_state_dict(torch.load(path, device))
        """, "TR613")
    assert lines(findings, "TR613") == [5]
    assert findings[0].fix.replacement.strip() == \
        "model.load_state_dict(torch.load(path, weights_only=True, map_location=device))"


def test_accelerator_choice_written_as_a_conditional_expression():
    findings = run("""
        import torch
        device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
        model = Net().to(device)
        model.load_state_dict(torch.load("ckpt/last.pt"))
        """, "TR613")
    assert lines(findings, "TR613") == [5]
    assert "`map_location=device`" in findings[0].message


def test_no_fix_when_the_device_is_chosen_after_the_load_or_out_of_scope():
    findings = run("""
        import torch
        def load_weights(model, path):
            model.load_state_dict(torch.load(path))
        def main():
            device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            load_weights(model, args.weights)
        """, "TR613")
    (finding,) = findings
    assert finding.line == 4 and finding.fix is None
    assert "`map_location=` the selected device" in finding.message


def test_distributed_code_is_left_to_tr611():
    code = """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model.load_state_dict(torch.load(args.checkpoint))
        model = DDP(model)
        """
    findings = run(code, "TR611", "TR613")
    assert [(f.rule, f.line) for f in findings] == [("TR611", 5)]


def test_notebook_loads_a_downloaded_checkpoint_in_a_later_cell():
    cells = [
        ("code", "import torch\nfrom torchvision import models\n"),
        ("code", "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"),
        ("markdown", "Load the weights we trained on the cluster\n"),
        ("code", "model = models.resnet18(num_classes=10)\n"
                 "model.load_state_dict(torch.load('weights/resnet_cifar.pth'))\nmodel.to(device)\n"),
    ]
    result = analyze_text(notebook(*cells), "eval.ipynb", Config(select=("TR613",)))
    assert [(f.rule, f.cell, f.line) for f in result.findings] == [("TR613", 4, 2)]
    assert result.findings[0].fix is not None


def test_the_same_notebook_saving_before_it_loads_is_quiet():
    cells = [
        ("code", "import torch\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"),
        ("code", "for epoch in range(5):\n    train(model)\n    torch.save(model.state_dict(), 'tut1-model.pt')\n"),
        ("code", "model.load_state_dict(torch.load('tut1-model.pt'))\n"),
    ]
    assert analyze_text(notebook(*cells), "tut.ipynb", Config(select=("TR613",))).findings == []


# ---- TR116: a frozen BatchNorm backbone in train mode --------------------------------------------

FREEZE_CELLS = [
    ("code", "import torch\nfrom torch import nn, optim\nfrom torchvision import models\n"),
    ("code", "model = models.mobilenet_v3_large(weights='DEFAULT')\nfor p in model.features.parameters():\n"
             "    p.requires_grad = False\nmodel.classifier[3] = nn.Linear(1280, 4)\n"),
    ("markdown", "Train the head\n"),
    ("code", "optimizer = optim.SGD(model.classifier.parameters(), lr=0.01)\nfor epoch in range(3):\n"
             "    model.train()\n    for x, y in loader:\n        optimizer.zero_grad()\n"
             "        nn.functional.cross_entropy(model(x), y).backward()\n        optimizer.step()\n"),
]


def test_notebook_backbone_part_frozen_in_one_cell_trained_in_another():
    result = analyze_text(notebook(*FREEZE_CELLS), "finetune.ipynb", Config(select=("TR116",)))
    assert [(f.rule, f.cell, f.line) for f in result.findings] == [("TR116", 2, 2)]
    (finding,) = result.findings
    assert "`model.features` (`features` of a mobilenet_v3_large, which holds BatchNorm)" in finding.message
    assert "call `model.features.eval()` after every `.train()`" in finding.message
    # the train() call is in another cell: named in the message (a related site names no cell)
    assert "`model.train()` puts it back in train mode" in finding.message and finding.related == ()


def test_notebook_with_the_backbone_put_back_in_eval_is_quiet():
    cells = FREEZE_CELLS[:3] + [("code", FREEZE_CELLS[3][1].replace("model.train()\n",
                                                                     "model.train()\n    model.features.eval()\n"))]
    assert analyze_text(notebook(*cells), "finetune.ipynb", Config(select=("TR116",))).findings == []


def test_project_backbone_class_with_batchnorm_frozen_with_requires_grad_():
    code = textwrap.dedent("""
        import torch
        import torch.nn as nn
        import torch.optim as optim

        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 16, 3)
                self.bn = nn.BatchNorm2d(16)

            def forward(self, x):
                return self.bn(self.conv(x)).mean((2, 3))

        encoder = Encoder()
        encoder.load_state_dict(torch.load("encoder.pt", weights_only=True))
        decoder = nn.Linear(16, 2)
        encoder.requires_grad_(False)
        opt = optim.Adam(decoder.parameters())
        for x, y in loader:
            loss = nn.functional.mse_loss(decoder(encoder(x)), y)
            loss.backward()
            opt.step()
        """)
    # its weights come from a checkpoint: a frozen pretrained encoder, in train mode all along
    findings = run(code, "TR116")
    assert lines(findings, "TR116") == [18]
    assert "`encoder` (`Encoder`, which builds BatchNorm)" in findings[0].message
    assert "call `encoder.eval()` before the training loop" not in findings[0].message
    # copied from another model at every step (a target network): its weights follow that model
    copied = code.replace("opt.step()", "opt.step()\n    encoder.load_state_dict(online.state_dict())")
    assert run(copied, "TR116") == []


def test_project_backbone_class_frozen_and_trained_in_train_mode():
    findings = run("""
        import torch
        import torch.nn as nn

        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU())

            def forward(self, x):
                return self.body(x).mean((2, 3))

        encoder = Encoder()
        decoder = nn.Linear(16, 2)
        encoder.requires_grad_(False)
        opt = torch.optim.Adam(decoder.parameters())
        for epoch in range(5):
            encoder.train()
            decoder.train()
            for x, y in loader:
                loss = nn.functional.mse_loss(decoder(encoder(x)), y)
                loss.backward()
                opt.step()
        """, "TR116")
    (finding,) = findings
    assert finding.line == 15 and "`Encoder`, which builds BatchNorm" in finding.message


def test_gan_discriminator_frozen_and_unfrozen_in_turns_is_quiet():
    findings = run("""
        import torch
        from torchvision import models
        netD = models.resnet18(num_classes=1)
        for x in loader:
            for p in netD.parameters():
                p.requires_grad = False
            g_loss = -netD(netG(z)).mean()
            g_loss.backward()
            optG.step()
            for p in netD.parameters():
                p.requires_grad = True
            d_loss = netD(netG(z).detach()).mean() - netD(x).mean()
            d_loss.backward()
            optD.step()
        """, "TR116")
    assert findings == []


def test_validation_eval_is_undone_by_the_next_train_call():
    findings = run("""
        import torch
        import torchvision

        def train_one_epoch(model, loader, optimizer):
            model.train()
            for x, y in loader:
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()

        @torch.no_grad()
        def validate(model, loader):
            model.eval()
            return sum((model(x).argmax(1) == y).sum().item() for x, y in loader)

        model = torchvision.models.efficientnet_b0(weights="DEFAULT")
        model.features.requires_grad_(False)
        optimizer = torch.optim.AdamW(model.classifier.parameters())
        for epoch in range(10):
            train_one_epoch(model, train_loader, optimizer)
            validate(model, val_loader)
        """, "TR116")
    (finding,) = findings
    assert finding.line == 18 and "`model.features.requires_grad_(False)`" in finding.message


def test_trained_in_train_mode_then_evaluated_at_the_end_is_found():
    findings = run("""
        import torch
        from torchvision.models import resnet18
        net = resnet18(weights="DEFAULT")
        for name, param in net.named_parameters():
            param.requires_grad = False
        net.fc = torch.nn.Linear(512, 3)
        opt = torch.optim.Adam(net.fc.parameters())
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
        net.eval()
        test(net)
        """, "TR116")
    assert lines(findings, "TR116") == [5]
    assert "call `net.eval()`" not in findings[0].message  # the head is trained too: only the BatchNorm layers


def test_a_loss_module_that_keeps_its_frozen_network_in_eval_mode_is_quiet():
    # a perceptual loss puts its frozen ResNet in eval mode in __init__ and nothing switches it back
    code = """
        import torch
        import torch.nn as nn
        from torchvision import models
        class PerceptualLoss(nn.Module):
            def __init__(self):
                super().__init__()
                self.net = models.resnet18(weights="DEFAULT")
                self.net.eval()
                for p in self.net.parameters():
                    p.requires_grad = False
            def forward(self, a, b):
                return nn.functional.mse_loss(self.net(a), self.net(b))
        generator = Generator()
        perceptual = PerceptualLoss()
        for epoch in range(10):
            generator.train()
            for x, y in loader:
                loss = perceptual(generator(x), y)
                loss.backward()
                opt.step()
        """
    assert run(code, "TR116") == []
    chained = code.replace('self.net = models.resnet18(weights="DEFAULT")\n                self.net.eval()',
                           'self.net = models.resnet18(weights="DEFAULT").eval()')
    assert "DEFAULT\").eval()" in chained and run(chained, "TR116") == []
    # put back in train mode with the loss module every epoch: its BatchNorm statistics move again
    retrained = code.replace("generator.train()", "generator.train()\n            perceptual.train()")
    assert lines(run(retrained, "TR116"), "TR116") == [10]


def test_batchnorm_switched_to_eval_by_a_lambda_is_quiet():
    assert run("""
        import torch.nn as nn
        from torchvision import models
        model = models.resnet50(weights="DEFAULT")
        for p in model.parameters():
            p.requires_grad = False
        model.fc = nn.Linear(2048, 10)
        for epoch in range(5):
            model.train()
            model.apply(lambda m: m.eval() if isinstance(m, nn.BatchNorm2d) else None)
            for x, y in loader:
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        """, "TR116") == []


# ---- TR117: an optimizer over a part of a model that trains whole ---------------------------------

HEAD_ONLY_CELLS = [
    ("code", "import torch\nimport timm\n"),
    ("code", "model = timm.create_model('convnext_tiny', pretrained=True, num_classes=5)\n"
             "optimizer = torch.optim.AdamW(model.head.parameters(), lr=1e-3)\n"),
    ("markdown", "Training\n"),
    ("code", "for epoch in range(3):\n    for x, y in loader:\n        loss = loss_fn(model(x), y)\n"
             "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n"),
]


def test_notebook_head_optimizer_with_the_backbone_in_the_graph():
    result = analyze_text(notebook(*HEAD_ONLY_CELLS), "probe.ipynb", Config(select=("TR117",)))
    assert [(f.rule, f.cell, f.line) for f in result.findings] == [("TR117", 2, 2)]
    assert "optimizes only `model.head`, but the rest of `model` (`timm.create_model`)" in result.findings[0].message


def test_notebook_that_freezes_with_a_helper_is_quiet():
    cells = HEAD_ONLY_CELLS[:1] + [("code", "def freeze(m):\n    for p in m.parameters():\n"
                                            "        p.requires_grad = False\n")] + HEAD_ONLY_CELLS[1:]
    cells[2] = ("code", cells[2][1].replace("optimizer =", "freeze(model)\nmodel.reset_classifier(5)\noptimizer ="))
    assert analyze_text(notebook(*cells), "probe.ipynb", Config(select=("TR117",))).findings == []


def test_gradual_unfreezing_and_two_stage_training_are_quiet():
    for extra in ("optimizer.add_param_group({'params': model.layer4.parameters(), 'lr': 1e-4})\n",
                  "optimizer = optim.SGD(model.parameters(), lr=1e-4)\n"):
        code = f"""
import torch
from torch import optim
from torchvision import models
model = models.resnet18(weights="DEFAULT")
optimizer = optim.SGD(model.fc.parameters(), lr=1e-2)
for x, y in loader:
    criterion(model(x), y).backward()
    optimizer.step()
{extra}"""
        assert run(code, "TR117") == [], extra


def test_helper_built_models_and_wrapped_parts_are_quiet():
    findings = run("""
        import torch
        from torch import optim
        model = build_model(cfg)          # may come back frozen
        opt = optim.Adam(model.head.parameters())
        net = torch.nn.DataParallel(Net())
        opt_all = optim.Adam(net.module.parameters())   # the whole model
        for x, y in loader:
            (criterion(model(x), y) + criterion(net(x), y)).backward()
            opt.step()
            opt_all.step()
        """, "TR117")
    assert findings == []


def test_a_model_moved_by_reassignment_is_still_the_model_built_before():
    findings = run("""
        import timm
        import torch
        model = timm.create_model("convnext_tiny", pretrained=True, num_classes=5)
        model = model.cuda()
        optimizer = torch.optim.AdamW(model.head.parameters(), lr=1e-3)
        for x, y in train_loader:
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            loss.backward()
            optimizer.step()
        helper = build_model(cfg)
        helper = helper.to("cuda")
        opt_helper = torch.optim.AdamW(helper.head.parameters())
        for x, y in train_loader:
            torch.nn.functional.cross_entropy(helper(x), y).backward()
            opt_helper.step()
        """, "TR117")
    assert lines(findings, "TR117") == [6]
    assert "(`timm.create_model`)" in findings[0].message


def test_a_class_whose_forward_cuts_the_rest_out_of_the_graph_is_quiet():
    # a linear probe that runs its encoder under no_grad (or detaches its features) inside forward: only the head
    # computes gradients, so an optimizer over the head is the whole story; the same class without it is reported
    code = """
        import torch
        from torch import nn
        class Probe(nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = nn.Sequential(nn.Linear(32, 16), nn.ReLU())
                self.head = nn.Linear(16, 2)
            def forward(self, x):
                with torch.no_grad():
                    z = self.encoder(x)
                return self.head(z)
        probe = Probe()
        opt = torch.optim.Adam(probe.head.parameters())
        for x, y in loader:
            nn.functional.cross_entropy(probe(x), y).backward()
            opt.step()
        """
    assert run(code, "TR117") == []
    detached = code.replace("with torch.no_grad():\n                    z = self.encoder(x)",
                            "z = self.encoder(x).detach()")
    assert "detach()" in detached and run(detached, "TR117") == []
    graph = code.replace("with torch.no_grad():\n                    z = self.encoder(x)", "z = self.encoder(x)")
    assert lines(run(graph, "TR117"), "TR117") == [13]  # the optimizer line, one line up


def test_a_class_from_another_file_that_freezes_its_backbone_is_quiet(tmp_path):
    from analyzers.engine import analyze_source
    from analyzers.program.modules import index_for
    from analyzers.rules import get_rule

    (tmp_path / ".git").mkdir()
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        import torch.nn as nn
        from torchvision import models

        class Probe(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.backbone = models.resnet50(weights="DEFAULT")
                self.backbone.requires_grad_(False)
                self.head = nn.Linear(1000, n)

            def forward(self, x):
                return self.head(self.backbone(x))
        """))
    train = textwrap.dedent("""
        import torch
        from model import Probe
        net = Probe(10)
        opt = torch.optim.SGD(net.head.parameters(), lr=0.1)
        for x, y in loader:
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        """)
    script = tmp_path / "train.py"
    script.write_text(train)
    rule = get_rule("TR117")
    result = analyze_source(train, str(script), rules=[rule], repository=index_for(script))
    assert result.findings == []
    # the same class without the freeze: the backbone's gradients are computed for nothing
    (tmp_path / "model.py").write_text((tmp_path / "model.py").read_text().replace(
        "        self.backbone.requires_grad_(False)\n", ""))
    result = analyze_source(train, str(script), rules=[rule], repository=index_for(script))
    assert [f.line for f in result.findings] == [5]
    assert "the rest of `net` (`Probe`)" in result.findings[0].message


def test_frozen_backbone_message_names_the_architecture_with_its_article():
    findings = analyze_text(textwrap.dedent("""
        import torch
        import torchvision
        model = torchvision.models.efficientnet_b0(weights="DEFAULT")
        for p in model.features.parameters():
            p.requires_grad = False
        opt = torch.optim.Adam(model.classifier.parameters())
        for x, y in loader:
            model.train()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        """), "finetune.py", Config(select=("TR116",))).findings
    assert len(findings) == 1 and "`features` of an efficientnet_b0, which holds BatchNorm" in findings[0].message


# A model class and a freezing helper of the repository, in another file: what their code does decides, never what
# they are called.
TRAIN_HEAD = """
import torch
from nets import Classifier
from tools import {helper}
model = Classifier()
{helper}(model.body)
optimizer = torch.optim.SGD(model.head.parameters(), lr=0.1)
for x, y in loader:
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
"""

NETS = """
import torch
from torch import nn
class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)
    def forward(self, x):
        return self.head(self.body(x){cut})
"""

TOOLS = """
def lock(module):
    for p in module.parameters():
        p.requires_grad = False
def lock_all(module):
    lock(module)
def freeze_bn(module):
    module.eval()
"""


def test_a_repository_helper_that_freezes_and_a_class_that_detaches_are_followed(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "tools.py").write_text(TOOLS)
    script = tmp_path / "train.py"
    for helper, cut, reported in (("lock_all", "", []), ("freeze_bn", ".detach()", []), ("freeze_bn", "", [7])):
        (tmp_path / "nets.py").write_text(NETS.format(cut=cut))
        script.write_text(TRAIN_HEAD.format(helper=helper))
        result = analyze_file(script, "train.py", Config(select=("TR117",)))
        assert not result.errors, result.errors
        assert lines(result.findings, "TR117") == reported, (helper, cut)
