"""Realistic scenarios for the catalog's part 2, fourth batch: TR613 (a checkpoint loaded without map_location in
a script that falls back to the CPU), TR116 (a frozen BatchNorm backbone left in train mode) and TR117 (an
optimizer over a part of a model whose other parameters still get gradients)."""
from __future__ import annotations

from analyzers.config import Config
from analyzers.engine import analyze_text
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
    assert by_line[5].fix.replacement.strip() == "encoder.load_state_dict(torch.load(args.encoder_path, map_location=device))"
    assert by_line[5].fix.safe is True
    # a CPU tensor kept in the checkpoint (an RNG state) would be moved too: the fix changes behaviour
    assert by_line[6].fix.safe is False


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
        ("code", "model = models.resnet18(num_classes=10)\nmodel.load_state_dict(torch.load('weights/resnet_cifar.pth'))\n"
                 "model.to(device)\n"),
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
