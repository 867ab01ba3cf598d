"""Realistic whole-file scenarios for the device (TR70x), reproducibility (TR90x) and leakage (TR951) rules."""
from __future__ import annotations

import textwrap

import pytest

from analyzers.config import Config
from analyzers.engine import analyze_source
from analyzers.rules import get_rule

DEVICE_REPRO = ("TR701", "TR702", "TR703", "TR901", "TR902")
ALL_MINE = DEVICE_REPRO + ("TR951",)


def findings(code: str, ids=ALL_MINE, path: str = "train.py", config=None):
    rules = [get_rule(i) for i in ids]
    result = analyze_source(textwrap.dedent(code), path, config=config, rules=rules)
    assert not result.errors, result.errors
    return [f for f in result.findings if f.rule in ids]


GOOD_CUDA_SCRIPT = '''
import argparse
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.backends import cudnn
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder


class Classifier(nn.Module):
    def __init__(self, dim: int, classes: int):
        super().__init__()
        self.fc = nn.Linear(dim, classes)
        self.register_buffer("temperature", torch.tensor(1.5))

    def forward(self, x):
        noise = torch.randn(x.shape, device=x.device) * 0.01
        positions = torch.arange(x.size(1), device=x.device)
        mask = torch.ones_like(x)
        bias = x.new_zeros(x.size(0), 1)
        scale = torch.tensor(x.size(-1) ** 0.5).to(x.device)
        return self.fc((x + noise) * mask + bias + positions) / (self.temperature * scale)


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    cudnn.deterministic = True
    cudnn.benchmark = False


def train_one_epoch(model, loader, optimizer, device):
    model.train()
    for step, (x, y) in enumerate(loader):
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    set_seed(0)
    device = torch.device(args.device if torch.cuda.is_available() else "cpu")
    train_ds = ImageFolder(args.train_dir, transform=train_transform)
    val_ds = ImageFolder(args.val_dir, transform=eval_transform)
    train_loader = DataLoader(train_ds, batch_size=32, shuffle=True,
                              num_workers=args.workers, pin_memory=True, persistent_workers=True)
    val_loader = DataLoader(val_ds, batch_size=128, num_workers=2, pin_memory=True)
    model = Classifier(16, 3).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(5):
        train_one_epoch(model, train_loader, optimizer, device)
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device, non_blocking=True))


if __name__ == "__main__":
    main()
'''


def test_cuda_training_script_done_right_has_no_findings():
    assert findings(GOOD_CUDA_SCRIPT) == []


def test_same_script_done_wrong_finds_each_problem_once():
    bad = (GOOD_CUDA_SCRIPT
           .replace("torch.randn(x.shape, device=x.device)", "torch.randn(x.shape)")
           .replace("num_workers=args.workers, pin_memory=True, ", "")
           .replace("    torch.manual_seed(seed)\n    torch.cuda.manual_seed_all(seed)\n", "")
           .replace("def set_seed(seed: int)", "def init_rngs(seed: int)")
           .replace("set_seed(0)", "init_rngs(0)"))
    found = findings(bad)
    by_rule = {}
    for f in found:
        by_rule.setdefault(f.rule, []).append(f)
    assert sorted(by_rule) == ["TR701", "TR702", "TR703", "TR901"], found
    assert all(len(v) == 1 for v in by_rule.values()), found
    assert "torch.randn(x.shape)" in by_rule["TR701"][0].message
    assert "Classifier.forward()" in by_rule["TR701"][0].message
    assert "train_loader" in by_rule["TR702"][0].message
    assert "train_loader" in by_rule["TR703"][0].message
    assert "loss.backward()" in by_rule["TR901"][0].message


def test_cpu_only_model_code_is_not_a_device_problem():
    code = '''
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    class Net(nn.Module):
        def forward(self, x):
            return x + torch.zeros(x.shape)

    loader = DataLoader(train_set, shuffle=True)
    model = Net().to(torch.float64)
    for x, y in loader:
        x = x.to(torch.float64)
    '''
    assert findings(code, ("TR701", "TR702", "TR703")) == []


def test_accelerate_style_and_config_devices_count_as_cuda():
    code = '''
    import torch
    from torch import nn
    from accelerate import Accelerator
    from torch.utils.data import DataLoader as DL

    class Head(nn.Module):
        def forward(self, h):
            return h * torch.full((h.size(-1),), 0.5)

    accelerator = Accelerator()
    loader = DL(train_ds, batch_size=8, num_workers=0)
    model, loader = accelerator.prepare(Head(), loader)
    '''
    found = findings(code, ("TR701", "TR702"))
    assert sorted(f.rule for f in found) == ["TR701", "TR702"]
    assert any("torch.full((h.size(-1),), 0.5)" in f.message and "device=h.device" in f.message for f in found)


def test_model_moved_via_self_config_device():
    code = '''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, x):
            idx = torch.arange(x.size(1))
            return x[:, idx]

    class Runner:
        def __init__(self, cfg):
            self.cfg = cfg
            self.model = Model().to(self.cfg.device)
    '''
    found = findings(code, ("TR701",))
    assert [f.line for f in found] == [7]


def test_library_module_without_entry_point_is_not_unseeded():
    code = '''
    import torch

    def train_one_epoch(model, loader, optimizer):
        for x, y in loader:
            loss = model(x, y)
            loss.backward()
            optimizer.step()
    '''
    assert findings(code, ("TR901",)) == []


def test_cudnn_flags_toggle_on_a_flag_is_fine():
    code = '''
    import torch
    import torch.backends.cudnn as cudnn

    def configure(args):
        torch.manual_seed(args.seed)
        if args.deterministic:
            cudnn.deterministic = True
            cudnn.benchmark = False
        else:
            cudnn.benchmark = True
    '''
    assert findings(code, ("TR902",)) == []


def test_cudnn_benchmark_after_determinism_is_flagged():
    code = '''
    import torch
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = True
    '''
    found = findings(code, ("TR902",))
    assert len(found) == 1 and found[0].line == 5
    assert "use_deterministic_algorithms(True)" in found[0].message


LEAKY_NOTEBOOK = '''
import pandas as pd
import numpy as np
from sklearn.preprocessing import StandardScaler, OneHotEncoder
from sklearn.model_selection import train_test_split
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score

df = pd.read_csv("churn.csv")
df.head()
features = df.drop(columns=["churn"])
target = df["churn"]
scaler = StandardScaler()
features = scaler.fit_transform(features)
X_train, X_test, y_train, y_test = train_test_split(features, target, test_size=0.2, random_state=0)
clf = LogisticRegression(max_iter=1000)
clf.fit(X_train, y_train)
print(accuracy_score(y_test, clf.predict(X_test)))
'''


def test_notebook_style_leakage_reports_exactly_one_finding():
    found = findings(LEAKY_NOTEBOOK, ("TR951",), path="analysis.py")
    assert len(found) == 1, found
    assert found[0].line == 14
    assert "StandardScaler `scaler`" in found[0].message and "features" in found[0].message
    assert "train_test_split" in found[0].message


def test_notebook_done_right_has_no_leakage():
    code = LEAKY_NOTEBOOK.replace(
        "features = scaler.fit_transform(features)\n"
        "X_train, X_test, y_train, y_test = train_test_split(features, target, test_size=0.2, random_state=0)\n",
        "X_train, X_test, y_train, y_test = train_test_split(features, target, test_size=0.2, random_state=0)\n"
        "X_train = scaler.fit_transform(X_train)\n"
        "X_test = scaler.transform(X_test)\n")
    assert code != LEAKY_NOTEBOOK
    assert findings(code, ("TR951",), path="analysis.py") == []


@pytest.mark.parametrize("fit_line,data", [
    ("enc.fit(X_val)", "X_val"),
    ("enc.fit_transform(test_df[['city']])", "test_df[['city']]"),
    ("enc.fit(Xtest)", "Xtest"),
    ("enc.fit(df.loc[valid_idx])", "df.loc[valid_idx]"),
])
def test_encoder_fit_on_held_out_data(fit_line, data):
    code = f"from sklearn.preprocessing import OneHotEncoder as OHE\nenc = OHE(handle_unknown='ignore')\n{fit_line}\n"
    found = findings(code, ("TR951",))
    assert len(found) == 1 and data in found[0].message and "OneHotEncoder `enc`" in found[0].message


def test_fit_on_everything_only_for_exploration_is_not_leakage():
    code = '''
    from sklearn.decomposition import PCA
    from sklearn.model_selection import train_test_split
    pca = PCA(2)
    coords = pca.fit_transform(X)
    plot(coords)
    X_train, X_test = train_test_split(X)
    '''
    assert findings(code, ("TR951",)) == []


@pytest.mark.parametrize("path_expr, severity", [
    ("args.resume", "critical"),
    ("f'{args.out_dir}/last.pt'", "critical"),
    ("'./%s.pt' % opt.name", "critical"),
    ("'weights/%s_%d.pth' % (opt.name, opt.epoch)", "high"),
    ("f'runs/{cfg.tag}/last.pt'", "high"),
    ("os.path.join('pretrained', args.file)", "high"),
    # options nothing here parses: whatever the caller passes, not known to come from the command line
    ("unparsed.resume", "high"),
])
def test_unsafe_load_is_critical_only_when_options_choose_the_folder(path_expr, severity):
    code = ("import argparse, os\nimport torch\nargs = argparse.ArgumentParser().parse_args()\nopt = args\ncfg = args\n"
            f"def restore(unparsed):\n    state = torch.load({path_expr})\n")
    # the rule's own choice, before the measured cap of levels.json (which lowers TR601 to medium by default)
    found = findings(code, ids=("TR601",), config=Config(measured_severities=False))
    assert [(f.rule, f.severity.name.lower()) for f in found] == [("TR601", severity)]
