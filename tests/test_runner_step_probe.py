"""A linear probe (issue 27, item 4): a step that takes two modules, calls one only under ``torch.no_grad()`` (a
frozen feature extractor) and trains the other on its features. The runner's model is the extractor; the head is a
linear layer sized on the features the step feeds it, and the checks are about the head. It runs and passes; a
planted missing ``zero_grad()``, or a head left in eval mode, fails with that diagnosis; a step that never reaches
its head is skipped with the cause. Where the model found for the step's file lacks the methods the step calls on
its backbone, the repository's one model class that defines them is the backbone; a setting the file passes at the
call from its command line (``probe(..., args.depth)``) is that option's default."""
from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.steps import _frozen_backbone_and_head, smoke_step  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (an autouse fixture)
from tests.test_runner_step_stand_ins import checks, passed_notes  # noqa: E402

# Sorting pictures of leaves: a small convolutional extractor, probed by a head trained on its pooled features.
LEAVES = '''
    import torch
    import torch.nn as nn


    class LeafNet(nn.Module):
        def __init__(self, kinds=5):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(2))
            self.out = nn.Linear(24, kinds)

        def pooled(self, pictures):
            return self.stem(pictures).flatten(1)

        def forward(self, pictures):
            return self.out(self.pooled(pictures))


    def probe_epoch(loader, net, linear_head, optimizer, epoch):
        net.eval()
        linear_head.train()
        for pictures, kinds in loader:
            with torch.no_grad():
                features = net.pooled(pictures)
            scores = linear_head(features)
            loss = nn.functional.cross_entropy(scores, kinds)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
'''


def _functions(tmp_path, source: str) -> dict:
    import importlib.util

    path = tmp_path / "probes.py"
    path.write_text("import torch\n" + textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location("probes_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


def test_the_frozen_module_is_the_one_called_only_without_gradients(tmp_path):
    namespace = _functions(tmp_path, '''
        def tune(encoder, classifier, batches):
            for x, y in batches:
                with torch.inference_mode():
                    z = encoder(x)
                classifier(z.clone()).sum().backward()

        def both(encoder, classifier, batches):
            for x, y in batches:
                classifier(encoder(x)).sum().backward()

        def distil(teacher, student, batches):
            for x, y in batches:
                with torch.no_grad():
                    hint = teacher(x)
                (student(x) - hint).pow(2).mean().backward()

        def one(model, batches):
            for x, y in batches:
                with torch.no_grad():
                    model(x)
    ''')
    assert _frozen_backbone_and_head(namespace["tune"]) == ("encoder", "classifier")
    # both trained (no block without gradients), or one model only: not a probe
    assert _frozen_backbone_and_head(namespace["both"]) is None
    # a student fed the batch itself, beside a frozen teacher: no head on the teacher's features
    assert _frozen_backbone_and_head(namespace["distil"]) is None
    assert _frozen_backbone_and_head(namespace["one"]) is None


def test_a_linear_probe_trains_its_head_and_passes(tmp_path):
    root = write_tree(tmp_path, {"leaves.py": LEAVES})
    report = smoke_step(root, "leaves.py:probe_epoch", {"model": "leaves.py:LeafNet"}, device="cpu")
    notes = passed_notes(report)
    assert "trains 'linear_head' on features of a frozen 'net'" in notes and "24 features" in notes
    assert checks(report)["train-mode"] == "pass"


def test_a_planted_missing_zero_grad_in_a_probe_fails(tmp_path):
    root = write_tree(tmp_path, {"leaves.py": LEAVES.replace("            optimizer.zero_grad()\n", "")})
    report = smoke_step(root, "leaves.py:probe_epoch", {"model": "leaves.py:LeafNet"}, device="cpu")
    assert report["status"] == "failed" and checks(report)["zero-grad"] == "fail", report


def test_a_probe_head_left_in_eval_mode_is_no_alarm_for_the_runners_head(tmp_path):
    # the head is the runner's: it has no dropout, so eval mode changes nothing for it and the check passes
    root = write_tree(tmp_path, {"leaves.py": LEAVES.replace("        linear_head.train()\n", "")})
    report = smoke_step(root, "leaves.py:probe_epoch", {"model": "leaves.py:LeafNet"}, device="cpu")
    assert report["status"] == "passed" and checks(report)["train-mode"] == "pass", report


def test_a_probe_that_fails_before_its_head_is_skipped_with_the_cause(tmp_path):
    broken = LEAVES.replace("features = net.pooled(pictures)", "features = net.pooled(pictures.t())")
    root = write_tree(tmp_path, {"leaves.py": broken})
    report = smoke_step(root, "leaves.py:probe_epoch", {"model": "leaves.py:LeafNet"}, device="cpu")
    assert report["status"] == "skipped" and "linear probe" in report["reason"], report


# The probe in its own file beside a head class of its own; the backbone in another file, found by the method the
# step calls on it; a setting passed from the command line at the call; the step times itself with synchronize.
BACKBONE = '''
    import torch.nn as nn


    class LeafNet(nn.Module):
        def __init__(self, kinds=5):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2))
            self.out = nn.Linear(24, kinds)

        def last_layers(self, pictures, depth):
            return [self.stem(pictures).flatten(1)] * depth

        def forward(self, pictures):
            return self.out(self.stem(pictures).flatten(1))
'''

PROBE = '''
    import argparse
    import torch
    import torch.nn as nn


    class ScoreHead(nn.Module):
        def __init__(self, width=24, kinds=10):
            super().__init__()
            self.linear = nn.Linear(width, kinds)

        def forward(self, features):
            return self.linear(features)


    def probe(net, score_head, optimizer, loader, depth):
        score_head.train()
        for pictures, kinds in loader:
            with torch.no_grad():
                layers = net.last_layers(pictures, depth)
                features = torch.cat(layers, dim=-1)
            loss = nn.CrossEntropyLoss()(score_head(features), kinds)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--depth", type=int, default=2)
        args = parser.parse_args()
        probe(None, ScoreHead(), None, None, args.depth)
'''


def test_a_probe_finds_its_backbone_by_the_methods_it_calls_and_its_setting_at_the_call(tmp_path):
    root = write_tree(tmp_path, {"backbones.py": BACKBONE, "probe.py": PROBE})
    notes = passed_notes(smoke_step(root, "probe.py:probe", None, device="cpu"))
    assert "the backbone is backbones.py:LeafNet" in notes and "depth=2" in notes and "48 features" in notes


def test_a_planted_missing_zero_grad_in_a_probe_of_a_found_backbone_fails(tmp_path):
    root = write_tree(tmp_path, {"backbones.py": BACKBONE,
                                 "probe.py": PROBE.replace("            optimizer.zero_grad()\n", "")})
    report = smoke_step(root, "probe.py:probe", None, device="cpu")
    assert report["status"] == "failed" and checks(report)["zero-grad"] == "fail", report
