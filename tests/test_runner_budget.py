"""The per-target time budget (issue 27 item 6): after the batch and the steps, the input's resolution or sequence
length is halved, down to a floor the forward still takes; and skip reasons that name the real cause."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from gpu_runner.build import MAX_STAND_INS, BuildError, Skip, build_subject  # noqa: E402
from gpu_runner.checks import run_checks  # noqa: E402
from gpu_runner.subject import Subject  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401

IMAGE_MODEL = """\
    from torch import nn

    class Painter(nn.Module):
        def __init__(self, image_size=32, smallest=0):
            super().__init__()
            self.image_size, self.smallest = image_size, smallest
            self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
            self.head = nn.Linear(8, 10)

        def forward(self, images):
            assert images.shape[-1] >= self.smallest, "too small for the stem"
            return self.head(self.features(images).flatten(1))
    """

SEQUENCE_MODEL = """\
    from torch import nn

    class Reader(nn.Module):
        def __init__(self, vocab_size=100, dim=16, seq_len=32):
            super().__init__()
            self.embed = nn.Embedding(vocab_size, dim)
            self.head = nn.Linear(dim, vocab_size)

        def forward(self, tokens):
            return self.head(self.embed(tokens))
    """


def _subject(root: Path, target: str) -> Subject:
    subject = build_subject(root, target, device="cpu")
    assert isinstance(subject, Subject), subject
    return subject


def test_an_image_model_over_budget_is_checked_at_halved_resolution_down_to_the_floor(tmp_path):
    subject = _subject(write_tree(tmp_path, {"paint.py": IMAGE_MODEL}), "paint.py:Painter")
    side = subject.make_batch(2, 0).args[0].shape[-1]
    assert side >= 32
    report = run_checks(subject, steps=2, budget_s=0.0)  # nothing fits: batch, steps, then resolution are cut
    assert report.status == "passed", report
    assert any("resolution halved to 8 x 8" in note and "checked on batches of 2" in note for note in report.notes), \
        report.notes
    roomy = run_checks(subject, steps=2, budget_s=3600.0)
    assert not any("halved" in note for note in roomy.notes)


def test_the_floor_is_the_smallest_size_the_forward_takes(tmp_path):
    source = IMAGE_MODEL.replace("smallest=0", "smallest=16")
    subject = _subject(write_tree(tmp_path, {"paint.py": source}), "paint.py:Painter")
    report = run_checks(subject, steps=2, budget_s=0.0)
    assert any("resolution halved to 16 x 16" in note for note in report.notes), report.notes
    assert not any("8 x 8" in note for note in report.notes)


def test_a_sequence_model_over_budget_is_checked_on_shorter_sequences(tmp_path):
    subject = _subject(write_tree(tmp_path, {"read.py": SEQUENCE_MODEL}), "read.py:Reader")
    length = subject.make_batch(2, 0).args[0].shape[-1]
    report = run_checks(subject, steps=2, budget_s=0.0)
    assert report.status == "passed", report
    assert any("sequence length halved to 4" in note for note in report.notes), (length, report.notes)


# ---- skip reasons that name the real cause ------------------------------------------------------------------

def _script_importing(packages: list[str]) -> str:
    imports = "".join(f"import {name}\n" for name in packages)
    uses = "".join(f"    {name}.run()\n" for name in packages)
    return imports + "from torch import nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n" \
        "        super().__init__()\n        self.fc = nn.Linear(4, 2)\n\n    def forward(self, x):\n" \
        "        return self.fc(x)\n\n\ndef main():\n" + uses


def test_stand_ins_up_to_the_cap_build_and_past_it_the_reason_names_the_cap(tmp_path):
    packages = [f"absent_helper_{index}" for index in range(MAX_STAND_INS + 1)]
    within = build_subject(write_tree(tmp_path / "within", {"net.py": _script_importing(packages[:-1])}),
                           "net.py:Net", device="cpu")
    assert isinstance(within, Subject), within
    over = build_subject(write_tree(tmp_path / "over", {"net.py": _script_importing(packages)}), "net.py:Net",
                         device="cpu")
    assert isinstance(over, Skip)
    assert f"than the {MAX_STAND_INS} it replaces with stand-ins" in over.reason
    assert "the cap on stand-ins stopped it, not a use of 'absent_helper_8'" in over.reason, over.reason


PACKAGE_WITH_INIT = {
    "coders/__init__.py": "from .base import BaseCoder\nfrom .loaders import make_loader\n",
    "coders/base.py": "from torch import nn\n\n\nclass BaseCoder(nn.Module):\n    width = 6\n",
    # a package no runner has (torchvision would be installed on some: a GPU image has it)
    "coders/loaders.py": "import visionkit_nobody_has\n\n\ndef make_loader():\n    return visionkit_nobody_has.datasets.MNIST('.')\n",
    "coders/plain.py": """\
        from torch import nn
        from coders import BaseCoder


        class PlainCoder(BaseCoder):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(self.width, 3)

            def forward(self, x):
                return self.fc(x)
        """,
}


def test_a_package_init_that_imports_a_missing_package_keeps_what_it_defines(tmp_path):
    subject = build_subject(write_tree(tmp_path, PACKAGE_WITH_INIT), "coders/plain.py:PlainCoder", device="cpu")
    assert isinstance(subject, Subject), subject
    assert any("stand-ins for 'visionkit_nobody_has'" in note for note in subject.notes), subject.notes


def test_a_package_init_that_uses_a_missing_package_is_named_with_the_line_that_failed(tmp_path):
    files = {**PACKAGE_WITH_INIT,
             "coders/loaders.py": "import visionkit_nobody_has\n\nTO_TENSOR = visionkit_nobody_has.transforms.ToTensor()\n"}
    skipped = build_subject(write_tree(tmp_path / "missing", files), "coders/plain.py:PlainCoder", device="cpu")
    assert isinstance(skipped, Skip)
    assert skipped.reason.startswith("importing coders/plain.py needs 'visionkit_nobody_has', which is not installed on the "
                                     "smoke runner: coders/__init__.py uses it when imported"), skipped.reason
    assert "(at coders/loaders.py:3)" in skipped.reason and "cannot import name 'BaseCoder'" in skipped.reason
    files["coders/loaders.py"] = "raise RuntimeError('set DATA_ROOT first')\n"  # a failure of the tree's own code
    with pytest.raises(BuildError) as info:
        build_subject(write_tree(tmp_path / "raises", files), "coders/plain.py:PlainCoder", device="cpu")
    text = str(info.value)
    assert "cannot import name 'BaseCoder' from 'coders'" in text
    assert "coders/__init__.py, which would have provided it, could not be imported: RuntimeError: set DATA_ROOT " \
           "first (at coders/loaders.py:1)" in text, text


def test_a_model_over_budget_is_never_timed_on_the_full_batch_and_one_that_fits_only_on_the_smallest(tmp_path, monkeypatch):
    """The smallest batch is timed first: a step that already overruns there rules out the bigger batches (they
    cost at least as much), and one cheap enough that the full batch fits even at a proportional cost is not
    timed on the full batch either."""
    from gpu_runner import checks

    subject = _subject(write_tree(tmp_path, {"paint.py": IMAGE_MODEL}), "paint.py:Painter")
    timed_sizes: list[int] = []
    real = checks._timed_step

    def recording(subject, batch_size, seed):
        timed_sizes.append(batch_size)
        return real(subject, batch_size, seed)

    monkeypatch.setattr(checks, "_timed_step", recording)
    batch, steps, note, step = checks._scaled_to_budget(subject, 10, 8, 0.0, 0)
    assert 8 not in timed_sizes and 4 not in timed_sizes and timed_sizes[0] == 2
    assert (batch, steps) == (2, checks.FEWEST_STEPS) and "checks and measures on 8 would take at least" in note
    timed_sizes.clear()
    assert step > 0 and checks._scaled_to_budget(subject, 10, 8, 3600.0, 0)[:3] == (8, 10, "")
    assert timed_sizes == [2]


def test_a_target_killed_at_the_timeout_is_reported_with_the_phase_that_took_the_time(tmp_path):
    """A constructor that hangs times out 'during the import and build of the model'; a forward that hangs once
    the checks are under way names the check (or the budget's timing) it hung in, not only the timeout."""
    from gpu_runner.runner import TargetRequest, run_targets
    from gpu_runner.sandbox import SandboxLimits

    root = write_tree(tmp_path, {"slow.py": """\
        import time
        import torch.nn as nn

        class Hangs(nn.Module):
            def __init__(self):
                super().__init__()
                time.sleep(120)

            def forward(self, x):
                return x


        class Late(nn.Module):
            calls = 0

            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 4)

            def forward(self, x):
                Late.calls += 1
                if Late.calls > 40:
                    time.sleep(120)
                return self.fc(x)
        """})
    reports, _ = run_targets(root, [TargetRequest("slow.py:Hangs"), TargetRequest("slow.py:Late")], device="cpu",
                             steps=2, seed=0, limits=SandboxLimits(timeout_s=20), sandbox=False)
    assert [r["status"] for r in reports] == ["error", "error"]
    assert "timed out after 20s (smoke.timeout) during the import and build of the model" in reports[0]["reason"]
    assert " during " in reports[1]["reason"] and "building" not in reports[1]["reason"], reports[1]["reason"]
    assert any(what in reports[1]["reason"] for what in ("check on batches of", "the timing of a training step", "the measures")), \
        reports[1]["reason"]


def test_a_target_that_cannot_fit_even_at_its_smallest_leaves_out_the_checks_that_only_warn(tmp_path):
    subject = _subject(write_tree(tmp_path, {"paint.py": IMAGE_MODEL}), "paint.py:Painter")
    tight = run_checks(subject, steps=2, budget_s=0.0)
    health = next(c for c in tight.checks if c.name == "gradient-health")
    assert health.status == "skip" and "does not fit its time budget" in health.message
    # the reason names the real cause: the step's time at the input it was shrunk to, and the budget left
    assert "at input (2, 3, 8, 8) (after shrinking its input (resolution halved to 8 x 8" in health.message, \
        health.message
    assert "one training step took" in health.message and "more than the 0.0s left of it" in health.message
    assert next(c for c in tight.checks if c.name == "gradients").status == "pass"  # the checks that fail still run
    roomy = run_checks(subject, steps=2, budget_s=3600.0)
    assert "time budget" not in next(c for c in roomy.checks if c.name == "gradient-health").message


# ---- counts that only set how many times the forward loops -------------------------------------------------

UNROLLED_MODEL = """\
    from torch import nn

    class Refine(nn.Module):
        def __init__(self, width, passes=4):
            super().__init__()
            self.passes = passes
            self.mix = nn.Conv2d(width, width, 3, padding=1)

        def forward(self, x):
            y = self.mix(x)
            for _ in range(self.passes):
                y = self.mix(x + y)
            return y

    class Stage(nn.Module):
        def __init__(self, c_in, c_out, passes=4):
            super().__init__()
            self.entry = nn.Conv2d(c_in, c_out, 1)
            self.body = nn.Sequential(Refine(c_out, passes=passes), Refine(c_out, passes))

        def forward(self, x):
            x = self.entry(x)
            return x + self.body(x)

    class Looped(nn.Module):
        def __init__(self, channels=3, passes=6, hops=5, blocks=3, gate=7, slices=4):
            super().__init__()
            self.stage = Stage(channels, 8, passes=passes)
            self.hops, self.blocks, self.gate, self.slices = hops, blocks, gate, slices
            self.layers = nn.ModuleList(nn.Conv2d(8, 8, 1) for _ in range(blocks))
            self.head = nn.Linear(8, 4)

        def forward(self, x):
            x = self.stage(x)
            for _ in range(1, self.hops - 1):
                x = x * 0.5
            for layer in self.layers:
                x = layer(x)
            if self.gate > 3:
                x = x + 1
            for _ in range(self.gate):
                x = x * 0.9
            x = sum(x[:, k] for k in range(self.slices)).unsqueeze(1) + x
            return self.head(x.mean((2, 3)))
    """


def test_a_count_read_only_as_a_forward_loop_count_is_shrunk_through_the_classes_it_is_handed_to(tmp_path):
    """``passes`` only sets how often Refine's forward loops (handed on through Stage): shrunk to 1; ``hops`` is
    read inside arithmetic in ``range``: 2 keeps the loop's body running; ``blocks`` builds layers in the
    constructor, ``gate`` is also a condition and ``slices`` indexes the data (``x[:, k]``): all kept (the decision is how each value is used, not its
    name)."""
    from gpu_runner import guess

    root = write_tree(tmp_path, {"looped.py": UNROLLED_MODEL})
    subject = _subject(root, "looped.py:Looped")
    model = subject.model
    assert [block.passes for block in model.stage.body] == [1, 1]
    assert model.hops == 2 and len(model.layers) == 3 and model.gate == 7 and model.slices == 4
    assert any("passes=1 (default 6, shrunk)" in note for note in subject.notes), subject.notes
    import looped

    usage = guess.argument_usage(looped.Looped.__init__, looped, looped.Looped)
    assert {name: usage[name].loop_floor for name in usage} == \
        {"channels": None, "passes": 1, "hops": 2, "blocks": None, "gate": None, "slices": None}


def test_loop_counts_are_read_in_methods_whose_lines_mix_tabs_and_spaces(tmp_path):
    source = ("from torch import nn\n\nclass Mixed(nn.Module):\n    def __init__(self, rounds=3):\n"
              "        super().__init__()\n        self.rounds = rounds\n        self.fc = nn.Sequential(\n"
              "\t\t\tnn.Linear(4, 4))\n\n    def forward(self, x):\n        for _ in range(self.rounds):\n"
              "            x = self.fc(x)\n        return x\n")
    root = tmp_path
    (root / "mixed.py").write_text(source)
    subject = _subject(root, "mixed.py:Mixed")
    assert subject.model.rounds == 1, subject.notes


def test_a_target_whose_smallest_plan_runs_past_its_timeout_is_skipped_with_the_cause(tmp_path):
    """Over the budget at its smallest, a model is still checked while the plan fits before its timeout; past
    that, it is skipped with the step's time and the input it was shrunk to, not killed without a report."""
    subject = _subject(write_tree(tmp_path, {"paint.py": IMAGE_MODEL}), "paint.py:Painter")
    killed = run_checks(subject, steps=2, budget_s=0.0, limit_s=0.0)
    assert killed.status == "skipped" and not killed.checks, killed
    assert killed.reason.startswith("too slow to check before its timeout, even shrunk: one training step took")
    assert "at input (2, 3, 8, 8) (after shrinking its input (resolution halved to 8 x 8" in killed.reason, \
        killed.reason
    assert "left before its timeout" in killed.reason and "smoke.timeout" in killed.reason
    roomy = run_checks(subject, steps=2, budget_s=0.0, limit_s=3600.0)
    assert roomy.status == "passed" and roomy.checks
