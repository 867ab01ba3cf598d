"""Version pins (analyzers/program/versions.py) and realistic scenarios for TR41x, TR61x, TR81x, TR96x, TR97x."""
from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from analyzers.config import Config
from analyzers.engine import analyze_file, analyze_source
from analyzers.program.versions import Cap, _mentions, pinned_cap
from analyzers.rules import get_rule


def run(code: str, ids):
    code = textwrap.dedent(code)
    result = analyze_source(code, "scenario.py", rules=[get_rule(i) for i in ids])
    assert not result.errors, result.errors
    return code, result.findings


# ---- versions ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,package,cap", [
    ("torch==1.7.1\n", "torch", ((1, 7, 1), True)),
    ("torch>=1.7\n", "torch", None),
    ("torch\n", "torch", None),
    ("torch>=1.8,<2.0  # cuda\n", "torch", ((2, 0), False)),
    ("torch==1.7.*\n", "torch", ((1, 8), False)),
    ("torchvision~=0.8.1\n", "torchvision", ((0, 9), False)),
    ("  - pytorch=1.7\n", "torch", ((1, 8), False)),
    ("  - pytorch=1.7.0\n", "torch", ((1, 7, 0), True)),
    ('dependencies = ["torch<=2.1.2", "numpy"]\n', "torch", ((2, 1, 2), True)),
])
def test_requirement_caps(text, package, cap):
    assert [found for found, _ in _mentions(text)[package]] == [cap]


@pytest.mark.parametrize("text, floor", [
    ("torch>=2.6\n", (2, 6)),
    ("torch>=2.6,<3\n", (2, 6)),
    ("torch==2.7.1\n", (2, 7, 1)),
    ("torch~=2.6\n", (2, 6)),
    ("  - pytorch=2.6\n", (2, 6)),
    ("torch>2.5\n", (2, 5)),  # anything above 2.5: 2.5.1 too, so it guarantees 2.5 and no more
    ("torch<3\n", None),
    ("torch\n", None),
])
def test_requirement_floors(text, floor):
    assert [found for _, found in _mentions(text)["torch"]] == [floor]


def test_a_floor_holds_only_when_every_mention_has_one(tmp_path):
    from analyzers.program.versions import pinned_floor

    (tmp_path / "requirements.txt").write_text("torch>=2.6\n")
    (tmp_path / "train.py").write_text("import torch\n")
    floor = pinned_floor(tmp_path / "train.py", tmp_path, "torch")
    assert (floor.version, floor.source, floor.guarantees((2, 6)), floor.guarantees((2, 7))) == (
        (2, 6), "requirements.txt", True, False)
    (tmp_path / "requirements-dev.txt").write_text("torch\n")  # another install allows any torch
    assert pinned_floor(tmp_path / "train.py", tmp_path, "torch") is None


def test_similar_names_are_not_torch():
    found = _mentions("pytorch-lightning==1.0.8\ntorch_geometric==2.0\ntorchmetrics==0.5\n# torch==1.0\n")
    assert "torch" not in found


def test_cap_admits():
    assert Cap((1, 7, 1), True, "r").admits((1, 7))
    assert not Cap((1, 7, 1), True, "r").admits((1, 9))
    assert not Cap((2, 0), False, "r").admits((2, 0))
    assert Cap((2, 0), False, "r").admits((1, 13))


def test_nearest_folder_wins(tmp_path: Path):
    (tmp_path / "requirements.txt").write_text("torch>=1.7\n")
    (tmp_path / "legacy").mkdir()
    (tmp_path / "legacy" / "requirements.txt").write_text("torch==1.4.0\n")
    assert pinned_cap(tmp_path / "train.py", tmp_path, "torch") is None
    cap = pinned_cap(tmp_path / "legacy" / "train.py", tmp_path, "torch")
    assert cap is not None and cap.version == (1, 4, 0)
    # the pin changes: the cache notices
    (tmp_path / "legacy" / "requirements.txt").write_text("torch==2.3.0\n")
    assert pinned_cap(tmp_path / "legacy" / "train.py", tmp_path, "torch").version == (2, 3, 0)


def _findings(tmp_path: Path, requirements: str, code: str, rule: str):
    (tmp_path / "requirements.txt").write_text(requirements)
    (tmp_path / ".git").mkdir(exist_ok=True)
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(code))
    result = analyze_file(script, "train.py", Config(select=(rule,)))
    assert not result.errors, result.errors
    return [f for f in result.findings if f.rule == rule]


QR = """
import torch
q, r = torch.qr(A)
x, _ = torch.solve(B, A)
it = iter(loader)
batch = it.next()
"""


def test_deprecation_respects_the_pinned_torch(tmp_path: Path):
    assert _findings(tmp_path, "torch==1.7.1\n", QR, "TR811") == []
    assert _findings(tmp_path, "torch==1.7.1\n", QR, "TR810") == []
    assert _findings(tmp_path, "torch==1.7.1\n", QR, "TR815") == []


def test_removed_is_only_deprecated_before_its_removal(tmp_path: Path):
    found = _findings(tmp_path, "torch==1.10.2\n", QR, "TR811")
    assert {f.message.split("`")[1] for f in found} == {"torch.qr(A)", "torch.solve(B, A)"}
    assert _findings(tmp_path, "torch==1.10.2\n", QR, "TR810") == []


def test_open_pin_reports(tmp_path: Path):
    assert len(_findings(tmp_path, "torch>=1.7\n", QR, "TR811")) == 1
    assert len(_findings(tmp_path, "torch>=1.7\n", QR, "TR810")) == 1
    assert len(_findings(tmp_path, "torch>=1.7\n", QR, "TR815")) == 1


def test_torchvision_pin(tmp_path: Path):
    code = "import torch\nimport torchvision\nm = torchvision.models.resnet18(pretrained=True)\n"
    assert _findings(tmp_path, "torch==1.7\ntorchvision==0.8.1\n", code, "TR814") == []
    assert len(_findings(tmp_path, "torch\ntorchvision\n", code, "TR814")) == 1


# ---- scenarios -----------------------------------------------------------------------------------

LEGACY_SCRIPT = """
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Variable

model = Net()
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters())
dataiter = iter(train_loader)
images, labels = dataiter.next()
for epoch in range(10):
    for images, labels in train_loader:
        outputs = model(images)
        loss = criterion(outputs, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(loss.data[0])
up = F.upsample(images, scale_factor=2)
"""


def test_legacy_script_fixes_apply_together():
    code, findings = run(LEGACY_SCRIPT, ["TR811", "TR815", "TR816"])
    assert sorted(f.rule for f in findings) == ["TR811", "TR815", "TR816"]
    for finding in sorted(findings, key=lambda f: -f.fix.start_line):
        code = finding.fix.apply(code)
    assert "next(dataiter)" in code and "loss.item()" in code and "F.interpolate(images, scale_factor=2)" in code
    cst.parse_module(code)


def test_nan_checks_in_a_training_loop():
    code, findings = run("""
        import math
        import torch
        for step, batch in enumerate(loader):
            loss = model(batch)
            if loss.item() == float("nan") or torch.isnan(loss):
                break
            if loss != loss:
                break
    """, ["TR410"])
    assert [f.line for f in findings] == [6]


def test_softplus_and_logsumexp_are_quiet_on_stable_code():
    _, findings = run("""
        import torch
        import torch.nn.functional as F
        y = F.softplus(x)
        z = torch.logsumexp(scores, dim=-1)
        w = torch.log(torch.sum(probs, dim=1))
        v = torch.log(1 + x)
    """, ["TR411", "TR412"])
    assert findings == []


def test_resume_with_helper_is_quiet():
    _, findings = run("""
        import torch
        optimizer = torch.optim.AdamW(model.parameters())
        if args.resume:
            load_checkpoint(args.resume, model, optimizer)
            state = torch.load(args.resume)
        for x in loader:
            model(x).sum().backward()
            optimizer.step()
    """, ["TR610"])
    assert findings == []


def test_augmented_eval_through_a_dict_of_transforms_is_quiet_when_eval_is_deterministic():
    _, findings = run("""
        import torch
        from torchvision import datasets, transforms
        tfs = {"train": transforms.Compose([transforms.RandomCrop(32)]), "val": transforms.ToTensor()}
        val_set = datasets.CIFAR10("d", train=False, transform=tfs["val"])
    """, ["TR960"])
    assert findings == []


def test_sklearn_rules_need_sklearn():
    result = analyze_source("import torch\nfor k in ks:\n    pass\n", "x.py", rules=[get_rule("TR970")])
    assert result.findings == []


def test_legacy_folders_target_old_releases(tmp_path: Path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "legacy").mkdir()
    script = tmp_path / "legacy" / "train.py"
    script.write_text(textwrap.dedent(QR))
    result = analyze_file(script, "legacy/train.py", Config(select=("TR810", "TR811", "TR815")))
    assert result.findings == []


def test_resume_through_a_project_helper_is_quiet():
    _, findings = run("""
        import torch
        optimizer = torch.optim.Adam(model.parameters())
        if args.resume:
            ckpt = torch.load(args.resume)
            restore_training_state(ckpt, model, optimizer)
        for x in loader:
            model(x).sum().backward()
            optimizer.step()
    """, ["TR610"])
    assert findings == []


def test_distributed_load_of_a_vocabulary_is_quiet():
    _, findings = run("""
        import torch
        import torch.distributed as dist
        dist.init_process_group("nccl")
        vocab = torch.load("vocab.pt")
        model.load_state_dict(torch.load(path))
    """, ["TR611"])
    assert [f.line for f in findings] == [6]
