"""Realistic multi-function scenarios for the inference (TR2xx), architecture (TR3xx) and autograd (TR5xx) rules."""
from __future__ import annotations

import textwrap

from analyzers.config import Config
from analyzers.engine import analyze_source
from analyzers.rules import all_rules

RULES = [r for r in all_rules() if r.id[:3] in ("TR2", "TR3", "TR5")]


def findings(code: str, path: str = "train.py"):
    result = analyze_source(textwrap.dedent(code), path, rules=RULES)
    assert not result.errors, result.errors
    return result.findings


def ids(code: str, path: str = "train.py") -> list[str]:
    return [f.rule for f in findings(code, path)]


CORRECT_SCRIPT = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Net(nn.Module):
        def __init__(self, hidden=(128, 64), p=0.5):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(784, hidden[0]), nn.Linear(hidden[0], hidden[1])])
            self.drop = nn.Dropout(p)
            self.out = nn.Linear(hidden[1], 10)
            self.sizes = list(hidden)

        def forward(self, x):
            for block in self.blocks:
                x = self.drop(F.relu(block(x)))
            return self.out(x)


    def train_one_epoch(model, loader, optimizer, device):
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()


    @torch.no_grad()
    def validate(model, loader, device):
        model.eval()
        correct = 0
        for x, y in loader:
            pred = model(x.to(device)).argmax(1)
            correct += (pred == y.to(device)).sum().item()
        return correct / len(loader.dataset)


    def main():
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = Net().to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for epoch in range(10):
            train_one_epoch(model, train_loader, optimizer, device)
            acc = validate(model, val_loader, device)
            print(epoch, acc)
        torch.save(model.state_dict(), "model.pt")


    if __name__ == "__main__":
        main()
"""


def test_correct_train_validate_script_has_no_findings():
    assert findings(CORRECT_SCRIPT) == []


def test_validate_without_eval_names_the_model():
    code = """
        import torch

        def validate(net, loader):
            total = 0
            with torch.no_grad():
                for x, y in loader:
                    total += (net(x).argmax(1) == y).sum().item()
            return total

        def main(net, loader):
            for epoch in range(3):
                net.train()
                print(validate(net, loader))
    """
    found = findings(code)
    assert [f.rule for f in found] == ["TR201"]
    assert "`net`" in found[0].message and "validate()" in found[0].message
    assert found[0].line == 8


def test_eval_and_no_grad_in_the_caller_are_accepted():
    code = """
        import torch

        def evaluate(model, loader):
            return [model(x) for x in loader]

        def run(model, loader):
            model.eval()
            with torch.no_grad():
                scores = evaluate(model, loader)
            model.train()
            return scores
    """
    assert ids(code) == []


def test_eval_in_a_caller_of_the_caller_is_accepted():
    code = """
        import torch

        def evaluate(model, loader):
            return [model(x) for x in loader]

        def evaluate_all(model, loaders):
            return {k: evaluate(model, v) for k, v in loaders.items()}

        @torch.no_grad()
        def main(model, loaders):
            model.eval()
            evaluate_all(model, loaders)
    """
    assert ids(code) == []


def test_per_epoch_validation_inside_a_training_function():
    code = """
        import torch

        def fit(model, train_loader, val_loader, optimizer, epochs):
            for epoch in range(epochs):
                model.train()
                for x, y in train_loader:
                    optimizer.zero_grad()
                    model(x).mean().backward()
                    optimizer.step()
                for x, y in val_loader:
                    val_out = model(x)
    """
    found = findings(code)
    assert sorted(f.rule for f in found) == ["TR201", "TR202"]
    assert all("val_loader" in f.message for f in found)


def test_per_epoch_validation_done_right():
    code = """
        import torch

        def fit(model, train_loader, val_loader, optimizer, epochs):
            for epoch in range(epochs):
                model.train()
                for x, y in train_loader:
                    optimizer.zero_grad()
                    model(x).mean().backward()
                    optimizer.step()
                model.eval()
                with torch.no_grad():
                    for x, y in val_loader:
                        val_out = model(x)
    """
    assert ids(code) == []


def test_phase_loop_tutorial_pattern():
    code = """
        import torch

        def train_model(model, dataloaders, criterion, optimizer, num_epochs=25):
            for epoch in range(num_epochs):
                for phase in ["train", "val"]:
                    if phase == "train":
                        model.train()
                    else:
                        model.eval()
                    for inputs, labels in dataloaders[phase]:
                        optimizer.zero_grad()
                        with torch.set_grad_enabled(phase == "train"):
                            outputs = model(inputs)
                            loss = criterion(outputs, labels)
                            if phase == "train":
                                loss.backward()
                                optimizer.step()
    """
    assert ids(code) == []


def test_trainer_class_methods():
    bad = """
        import torch

        class Trainer:
            def __init__(self, model, val_loader):
                self.model = model
                self.val_loader = val_loader

            def validate(self):
                losses = []
                for batch in self.val_loader:
                    losses.append(self.model(batch).mean())
                return losses
    """
    found = findings(bad)
    assert sorted(f.rule for f in found) == ["TR201", "TR202"]
    assert all("self.model" in f.message for f in found)

    bad = textwrap.dedent(bad)
    good = bad.replace("losses = []", "self.model.eval()\n        losses = []").replace(
        "    def validate(self):", "    @torch.inference_mode()\n    def validate(self):")
    assert ids(good) == []


def test_pytest_and_test_files_are_not_inference_paths():
    code = """
        import torch

        def test_forward_shape():
            model = torch.nn.Linear(3, 2)
            assert model(torch.zeros(1, 3)).shape == (1, 2)

        def run_inference(model, x):
            return model(x)
    """
    assert sorted(ids(code, "train.py")) == ["TR201", "TR202"]
    assert ids(code, "tests/test_model.py") == []


def test_lightning_module_is_skipped():
    code = """
        import torch
        import pytorch_lightning as pl

        class Lit(pl.LightningModule):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def validation_step(self, batch, batch_idx):
                x, y = batch
                return self.model(x)

            def test_step(self, batch, batch_idx):
                return self.model(batch[0])
    """
    assert ids(code) == []


def test_module_predict_helper_without_loop_is_not_flagged():
    code = """
        import torch
        import torch.nn as nn

        class Classifier(nn.Module):
            def __init__(self):
                super().__init__()
                self.backbone = nn.Linear(4, 4)

            def forward(self, x):
                return self.backbone(x)

            def predict(self, x):
                return self.backbone(x).argmax(-1)
    """
    assert ids(code) == []


def test_import_aliases():
    code = """
        import torch as th
        from torch import nn

        class Head(nn.Module):
            def __init__(self, dims=[]):
                dims.append(4)
                self.layers = [nn.Linear(d, d) for d in dims]
    """
    found = findings(code)
    assert sorted(f.rule for f in found) == ["TR301", "TR302", "TR303"]
    fix = next(f for f in found if f.rule == "TR302").fix
    assert fix is not None and "nn.ModuleList([nn.Linear(d, d) for d in dims])" in fix.replacement


def test_plain_list_fix_uses_torch_nn_when_only_torch_is_imported():
    code = """
        import torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.heads = {"a": torch.nn.Linear(2, 2)}
    """
    found = findings(code)
    assert [f.rule for f in found] == ["TR302"]
    assert "torch.nn.ModuleDict({" in found[0].fix.replacement


def test_local_list_assigned_to_self_is_flagged_unless_registered():
    bad = """
        import torch.nn as nn

        class Net(nn.Module):
            def __init__(self, depth):
                super().__init__()
                layers = []
                for _ in range(depth):
                    layers.append(nn.Linear(8, 8))
                self.layers = layers
    """
    found = findings(bad)
    assert [f.rule for f in found] == ["TR302"]
    assert found[0].fix.replacement.strip() == "self.layers = nn.ModuleList(layers)"
    good = textwrap.dedent(bad) + "        self.seq = nn.Sequential(*layers)\n"
    assert ids(good) == []


def test_manual_sgd_and_parameter_updates():
    code = """
        import torch

        w = torch.randn(3, 1, requires_grad=True)
        b = torch.zeros(1, requires_grad=True)
        for epoch in range(100):
            loss = ((x @ w + b - y) ** 2).mean()
            loss.backward()
            w -= 0.01 * w.grad
            with torch.no_grad():
                b -= 0.01 * b.grad
            w.grad.zero_()
            b.grad.zero_()
    """
    found = findings(code)
    assert [(f.rule, f.line) for f in found] == [("TR501", 9)]
    assert "`w`" in found[0].message


def test_no_grad_update_helpers_are_accepted():
    code = """
        import torch
        import torch.nn as nn

        class EMA:
            def __init__(self, model):
                self.shadow = [p.detach().clone() for p in model.parameters()]

            @torch.no_grad()
            def update(self, model, decay=0.999):
                for s, p in zip(self.shadow, model.parameters()):
                    s.mul_(decay).add_(p, alpha=1 - decay)

        def clip(model):
            with torch.no_grad():
                for p in model.parameters():
                    p.clamp_(-1, 1)

        def reset(model):
            for p in model.parameters():
                p.data.zero_()
    """
    assert ids(code) == []


def test_model_built_in_eval_mode_counts_until_trained():
    loader = """
        import torch

        def load_model(path):
            model = Net()
            model.load_state_dict(torch.load(path, weights_only=True))
            return model.eval()

        model = load_model("m.pt")

        @torch.no_grad()
        def infer(x):
            return model(x)
    """
    assert ids(loader) == []
    hf = """
        import torch
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased")

        def train_epoch(loader, opt):
            model.train()
            for batch in loader:
                model(**batch).loss.backward()
                opt.step()

        @torch.no_grad()
        def evaluate(eval_loader):
            return [model(**batch).logits for batch in eval_loader]
    """
    assert ids(hf) == ["TR201"]


def test_helper_that_leaves_the_model_in_eval_mode():
    code = """
        import torch

        def evaluate(model, loader):
            model.eval()
            with torch.no_grad():
                return sum(model(x).sum() for x in loader)

        evaluate(model, val_loader)
        with torch.no_grad():
            for x in test_loader:
                preds = model(x)
    """
    assert ids(code) == []


def test_list_of_module_attributes_is_registered_already():
    code = """
        import torch.nn as nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(3, 8, 3)
                self.conv2 = nn.Conv2d(8, 8, 3)
                self.convs = [self.conv1, self.conv2]
    """
    assert ids(code) == []


def test_mutable_default_quoting_backticks_stays_one_code_span():
    from analyzers.markdown import split_code

    [finding] = findings("""
        import torch

        def fit(model, tags=["`x`", "``"]):
            tags.append("seen")
    """)
    assert finding.rule == "TR303"
    code = [chunk for is_code, chunk in split_code(finding.message) if is_code]
    assert code == ["tags", "fit()", '["`x`", "``"]']


def test_override_of_a_module_defined_in_another_file_leaves_the_mode_to_its_callers(tmp_path):
    # The base class (an nn.Module in another file of the repository) calls predict_eps() from its sampler,
    # under inference_mode and after eval(), and from its loss with autograd on: the override cannot know.
    from analyzers.program.modules import RepositoryIndex

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "base.py").write_text(textwrap.dedent("""
        import torch
        from torch.nn import Module

        class Sampler(Module):
            def __init__(self, net):
                super().__init__()
                self.net = net

            def predict_eps(self, x, t):
                return self.net(x, t)

            def forward(self, x, t):
                return (self.predict_eps(x, t) - x).pow(2).mean()
    """))
    child = textwrap.dedent("""
        import torch
        from .base import Sampler

        class ClippedSampler(Sampler):
            def predict_eps(self, x, t):
                return self.net(x, t).clamp(-1, 1)
    """)
    path = tmp_path / "pkg" / "clipped.py"
    path.write_text(child)
    result = analyze_source(child, str(path), rules=RULES, repository=RepositoryIndex(tmp_path))
    assert [f.rule for f in result.findings] == []
    # without the repository the base is unknown: the evaluation-named method is still judged on its own
    assert "TR202" in ids(child, str(path))


def test_shape_check_at_the_bottom_of_a_model_file_is_not_an_evaluation():
    # a model file's own smoke check: a fresh, untrained network run once on a random batch to print a shape
    code = """
        import torch
        import torch.nn as nn

        class TinyConv(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Dropout(0.2))

            def forward(self, x):
                return self.body(x)

        def build_tiny():
            return TinyConv()

        def test():
            net = build_tiny()
            batch = torch.randn(2, 3, 16, 16)
            print(net(batch).shape)
    """
    assert ids(code, "models/tiny.py") == []


def test_test_function_that_loads_weights_is_still_an_evaluation():
    code = """
        import torch
        import torch.nn as nn

        class TinyConv(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Dropout(0.2))

            def forward(self, x):
                return self.body(x)

        def test(path):
            net = TinyConv()
            net.load_state_dict(torch.load(path, weights_only=True))
            probe = torch.randn(2, 3, 16, 16)
            print(net(probe).argmax(1))
    """
    assert sorted(ids(code, "models/tiny.py")) == ["TR201", "TR202"]


def test_an_attribute_that_holds_a_function_it_was_handed_is_no_model():
    # the attribute is called ``model``, but every value the class gives it is named as a function: no module,
    # no mode, no autograd state to set
    code = """
    import torch

    class Stepper:
        def __init__(self, score_fn, steps):
            self.model = score_fn
            self.steps = steps

        def predict_step(self, x, t):
            return self.model(x, t)

        def run(self, x):
            for t in self.steps:
                x = x - self.predict_step(x, t)
            return x
    """
    assert ids(code, "stepper.py") == []
    # handed a model, the same class runs it for inference: both rules still speak
    assert sorted(ids(code.replace("score_fn", "score_model"), "stepper.py")) == ["TR201", "TR202"]


def _missing_eval_severities(code: str, path: str = "evaluate.py") -> list[str]:
    """TR201's own severities (not capped at the level measured on holdout)."""
    config = Config(preview=True, measured_severities=False, context_severity=False)
    result = analyze_source(textwrap.dedent(code), path, config=config, rules=RULES)
    assert not result.errors, result.errors
    return [f.severity.name.lower() for f in result.findings if f.rule == "TR201"]


def test_a_model_this_file_never_builds_nor_receives_is_reported_one_level_lower():
    # the helper's model comes from callers in other files: whether they switched it to eval mode is not shown here
    handed = """
    import torch

    @torch.no_grad()
    def evaluate(model, batches):
        predictions = [model(features).argmax(-1) for features in batches]
        return torch.cat(predictions)
    """
    assert _missing_eval_severities(handed) == ["medium"]
    # the same helper fed by this file with a model it builds: the file shows everything, so it speaks at high
    built = handed + """
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 2))
    print(evaluate(net, []))
    """
    assert _missing_eval_severities(built) == ["high"]


_EVALUATE_METHOD = """
        def evaluate(self, loader):
            correct = 0
            with torch.no_grad():
                for x, y in loader:
                    correct += (self.model(x).argmax(1) == y).sum().item()
            return correct
"""
_BUILT_HERE = """
        def __init__(self):
            self.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5))
"""


def test_an_attribute_only_a_base_class_of_another_file_sets_is_reported_one_level_lower():
    # ``self.model`` comes from a base class defined elsewhere (a trainer or pipeline base built from whatever its
    # caller hands it): the mode it is in is not shown by this file
    inherited = "    import torch\n    from engine.base import BaseEvaluator\n\n    class Evaluator(BaseEvaluator):" + \
        _EVALUATE_METHOD
    assert _missing_eval_severities(inherited) == ["medium"]


def test_an_attribute_this_file_sets_keeps_its_level():
    # the class sets it itself, though it derives from a base of another file
    own = "    import torch\n    from engine.base import BaseEvaluator\n\n    class Evaluator(BaseEvaluator):" + \
        _BUILT_HERE + _EVALUATE_METHOD
    assert _missing_eval_severities(own) == ["high"]
    # a base class of this file sets it
    same_file_base = "    import torch\n\n    class BaseEvaluator:" + _BUILT_HERE + \
        "\n    class Evaluator(BaseEvaluator):" + _EVALUATE_METHOD
    assert _missing_eval_severities(same_file_base) == ["high"]
