"""Realistic scenarios for the numerics (TR40x) and deprecation (TR80x) rules."""
from __future__ import annotations

import textwrap

import libcst as cst

from analyzers.engine import analyze_source
from analyzers.rules import get_rule

NUMERICS = ["TR401", "TR402", "TR403", "TR404", "TR405"]
DEPRECATION = ["TR801", "TR802", "TR803"]


def run(code: str, ids=None):
    ids = ids or NUMERICS + DEPRECATION
    code = textwrap.dedent(code)
    result = analyze_source(code, "scenario.py", rules=[get_rule(i) for i in ids])
    assert not result.errors, result.errors
    return code, result.findings


def apply_all(code: str, findings) -> str:
    """Apply every fix, bottom-up (fixes on distinct lines)."""
    for finding in sorted((f for f in findings if f.fix), key=lambda f: -f.fix.start_line):
        code = finding.fix.apply(code)
    return code


CLASSIFIER_SCRIPT = """
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader


class Classifier(nn.Module):
    def __init__(self, n_in, n_classes):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_in, 128), nn.ReLU())
        self.head = nn.Linear(128, n_classes)

    def forward(self, x):
        x = self.body(x)
        x = self.head(x)
        return F.softmax(x, dim=1)


def train(loader):
    model = Classifier(32, 10).to("cuda")
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters())
    for inputs, labels in loader:
        optimizer.zero_grad()
        outputs = model(inputs)
        loss = loss_fn(outputs, labels)
        loss.backward()
        optimizer.step()
"""


def test_classifier_returning_softmax_trained_with_cross_entropy():
    _, findings = run(CLASSIFIER_SCRIPT)
    assert [f.rule for f in findings] == ["TR401"]
    finding = findings[0]
    assert finding.line == 27
    assert "`loss_fn` (CrossEntropyLoss)" in finding.message
    assert "Classifier.forward returns softmax" in finding.message
    assert finding.severity.label == "high"


def test_classifier_defined_after_use_and_subclass_inherits_forward():
    code = """
    import torch.nn as nn
    import torch.nn.functional as F

    def step(batch):
        model = Wide()
        crit = nn.CrossEntropyLoss()
        return crit(model(batch.x), batch.y)

    class Base(nn.Module):
        def forward(self, x):
            return F.softmax(self.fc(x), -1)

    class Wide(Base):
        pass
    """
    _, findings = run(code, ["TR401"])
    assert len(findings) == 1 and "Wide.forward returns softmax" in findings[0].message


CORRECT_SCRIPT = """
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, d_model=64):
        super().__init__()
        self.d_model = d_model
        self.fc = nn.Linear(d_model, 10)

    def forward(self, x):
        x = x * np.sqrt(self.d_model)
        return self.fc(x)


def focal_loss(logits, target, gamma: float = 2.0):
    logp = F.log_softmax(logits, dim=1)
    return F.nll_loss((1 - logp.exp()) ** gamma * logp, target)


model = Net()
criterion = nn.CrossEntropyLoss()
bce = nn.BCEWithLogitsLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        logits = model(x)
        loss = criterion(logits, y) + bce(logits[:, 0], y.float()) + focal_loss(logits, y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    probs = F.softmax(logits, dim=1)
    entropy = -(probs * torch.log(probs + 1e-9)).sum(1)
    acc = (probs.argmax(1) == y).float().mean()

model.eval()
with torch.no_grad():
    model.half()
    preds = torch.sigmoid(model(val_x.half()))
    np_preds = preds.cpu().numpy()
"""


def test_correct_training_script_has_no_findings():
    _, findings = run(CORRECT_SCRIPT)
    assert findings == []


def test_sigmoid_rules_and_double_sigmoid_fix_parses():
    code = """
    import torch
    import torch.nn as nn

    bce = nn.BCELoss()
    bce_logits = nn.BCEWithLogitsLoss()
    loss_a = bce(torch.sigmoid(z), y)
    loss_b = bce_logits(torch.sigmoid(z), y)
    """
    code, findings = run(code, ["TR402", "TR403"])
    assert [(f.rule, f.line) for f in findings] == [("TR402", 7), ("TR403", 8)]
    fixed = apply_all(code, findings)
    cst.parse_module(fixed)
    assert "loss_b = bce_logits(z, y)" in fixed
    assert "loss_a = bce(torch.sigmoid(z), y)" in fixed  # TR402 has no mechanical fix


def test_log_softmax_fixes_keep_prefix_and_parse():
    code = """
    import torch
    from torch.nn import functional as fn

    a = torch.log(fn.softmax(x, dim=1))
    b = torch.log(torch.softmax(x, 1)).sum()
    c = x.softmax(-1).log()
    d = torch.log(fn.softmax(x, dim=1).clamp_min(1e-8))
    """
    code, findings = run(code, ["TR404"])
    assert [f.line for f in findings] == [5, 6, 7]
    fixed = apply_all(code, findings)
    cst.parse_module(fixed)
    assert "a = fn.log_softmax(x, dim=1)" in fixed
    assert "b = torch.log_softmax(x, 1).sum()" in fixed
    assert "c = x.log_softmax(-1)" in fixed


def test_numpy_in_forward_tracks_dataflow_conservatively():
    code = """
    import numpy as np
    import torch
    import torch.nn as nn

    class Block(nn.Module):
        def forward(self, x, scale: float = 1.0):
            b, t = x.shape[:2]
            pos = np.arange(t) * scale        # shapes: fine
            h = self.proj(x)
            g = np.maximum(h, 0)              # tensor through numpy
            return torch.as_tensor(g) + torch.as_tensor(pos)
    """
    _, findings = run(code, ["TR405"])
    assert [(f.line, f.rule) for f in findings] == [(11, "TR405")]
    assert "`h`" in findings[0].message and "Block.forward" in findings[0].message


def test_amp_migration_fixes_resolve_in_the_file():
    code = """
    import torch as th
    from torch.cuda.amp import autocast, GradScaler

    scaler = GradScaler(enabled=True)

    @th.cuda.amp.autocast()
    def forward_step(model, x):
        return model(x)

    def train(model, loader):
        for x in loader:
            with autocast(dtype=th.float16):
                loss = model(x).mean()
            scaler.scale(loss).backward()
    """
    code, findings = run(code, ["TR801"])
    assert [f.line for f in findings] == [5, 7, 13]
    assert all(f.fix for f in findings)
    fixed = apply_all(code, findings)
    cst.parse_module(fixed)
    assert 'scaler = th.amp.GradScaler("cuda", enabled=True)' in fixed
    assert '@th.amp.autocast("cuda")' in fixed
    assert 'with th.amp.autocast("cuda", dtype=th.float16):' in fixed


def test_amp_without_torch_binding_reports_without_fix():
    code = """
    import torch.nn as nn
    from torch.cuda.amp import GradScaler
    scaler = GradScaler()
    """
    _, findings = run(code, ["TR801"])
    assert len(findings) == 1 and findings[0].fix is None
    assert "torch.cuda.amp.GradScaler" in findings[0].message


def test_half_precision_training_vs_inference():
    code = """
    import torch

    def train(model, loader, optimizer):
        model = model.cuda().half()
        for x, y in loader:
            loss = model(x.half(), y)
            loss.backward()
            optimizer.step()

    def predict(model, x):
        model.half()
        with torch.inference_mode():
            return model(x.half())
    """
    _, findings = run(code, ["TR802"])
    assert [f.line for f in findings] == [5]  # the batch's cast follows the model's: said once, at the weights
    assert "train()" in findings[0].message


def test_variable_fixes_parse():
    code = """
    import torch
    from torch.autograd import Variable as V

    x = V(images).cuda()
    w = V(torch.zeros(3), requires_grad=True)
    z = -V(a - b)
    """
    code, findings = run(code, ["TR803"])
    assert [f.line for f in findings] == [5, 6, 7]
    fixed = apply_all(code, findings)
    cst.parse_module(fixed)
    assert "x = images.cuda()" in fixed
    assert "w = torch.zeros(3).requires_grad_()" in fixed
    assert "z = -(a - b)" in fixed


def test_aliased_loss_imports():
    code = """
    import torch
    from torch.nn import CrossEntropyLoss as CE
    from torch.nn.functional import binary_cross_entropy_with_logits as bce_logits
    crit = CE()
    a = crit(torch.softmax(z, 1), y)
    b = bce_logits(input=torch.sigmoid(z), target=y)
    """
    code, findings = run(code, ["TR401", "TR403"])
    assert [(f.rule, f.line) for f in findings] == [("TR401", 6), ("TR403", 7)]
    fixed = apply_all(code, findings)
    assert "b = bce_logits(input=z, target=y)" in fixed
