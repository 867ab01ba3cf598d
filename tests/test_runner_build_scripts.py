"""gpu_runner: models built as a repository's scripts build them (issue 27 item 1, h27build5).

Each tree is a small repository written for the case: a helper module that sets up a plotting package the runner
lacks, a script that reads its settings from a file its command line names, a namespace the script completes after
parsing, a wrapper whose forward hands its inputs to a list of submodules."""
from __future__ import annotations

import ast
import sys

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from gpu_runner import absent, build, forward_body, sites  # noqa: E402
from gpu_runner.build import build_subject  # noqa: E402
from gpu_runner.subject import Subject  # noqa: E402
from tests.runner_support import write_tree  # noqa: E402

# -- a missing package set up by a statement of its own at import -----------------------------------------------

HELPERS = """\
    import a_missing_charting_pkg
    import a_missing_charting_pkg.figures as figures
    a_missing_charting_pkg.backend("quiet", dpi=72)

    def hidden_width():
        return 12

    def draw(values):
        return figures.line(values)
    """
NET_USING_HELPERS = """\
    from torch import nn
    from helpers import hidden_width

    class Scorer(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(6, hidden_width()), nn.ReLU(), nn.Linear(hidden_width(), 1))

        def forward(self, x):
            return self.body(x)
    """


def test_a_setting_call_of_a_missing_package_at_import_lets_the_model_build(tmp_path):
    root = write_tree(tmp_path, {"helpers.py": HELPERS, "scorer.py": NET_USING_HELPERS})
    subject = build_subject(root, "scorer.py:Scorer", device="cpu")
    assert isinstance(subject, Subject), subject
    assert subject.model.body[0].out_features == 12
    assert not any(name.startswith("a_missing_charting") for name in sys.modules)


@pytest.mark.parametrize("source, used", [
    ("import pkg_gone\npkg_gone.backend('quiet')\n", False),  # a statement of its own: its result is thrown away
    ("import pkg_gone\nif True:\n    pkg_gone.tools.backend('quiet')\n", False),
    ("import pkg_gone\nSTYLE = pkg_gone.backend('quiet')\n", True),  # kept: the module may read it
    ("import pkg_gone\nprint(pkg_gone.backend('quiet'))\n", True),  # handed on as an argument
    ("import pkg_gone\nclass Box:\n    pkg_gone.backend('quiet')\n", True),  # a class body is not the module's
])
def test_which_uses_of_a_missing_package_at_import_count(source, used):
    assert absent.used_when_imported(ast.parse(source), "pkg_gone") is used


def test_a_stand_in_called_for_its_result_still_names_the_package(tmp_path):
    root = write_tree(tmp_path, {"kept.py": "import a_missing_fmt_pkg\nSTYLE = a_missing_fmt_pkg.backend('x')\n"
                                            "from torch import nn\nclass Net(nn.Linear):\n    pass\n"})
    skipped = build_subject(root, "kept.py:Net", device="cpu")
    assert isinstance(skipped, build.Skip) and "a_missing_fmt_pkg" in skipped.reason
    with absent.stand_ins(["a_missing_fmt_pkg"]):
        import a_missing_fmt_pkg  # noqa: F401

        def inside_a_function():
            a_missing_fmt_pkg.backend("x")  # the same statement in a function's body is a real use

        with pytest.raises(absent.MissingPackageError):
            inside_a_function()


# -- settings from a file the command line names ------------------------------------------------------------

VOCODER = """\
    from torch import nn

    class Upsampler(nn.Module):
        def __init__(self, h):
            super().__init__()
            self.pre = nn.Conv1d(4, h.first_channels, 3, padding=1)
            layers = []
            channels = h.first_channels
            for rate in h.rates:
                layers += [nn.ConvTranspose1d(channels, channels // 2, 2 * rate, rate, padding=rate // 2), nn.ReLU()]
                channels //= 2
            self.ups = nn.Sequential(*layers)

        def forward(self, frames):
            return self.ups(self.pre(frames))
    """
VOCODER_TRAIN = """\
    import argparse
    import json
    from vocoder.net import Upsampler

    class Settings(dict):
        def __getattr__(self, key):
            return self[key]

    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--config", required=True)
        a = parser.parse_args()
        with open(a.config) as f:
            h = Settings(json.loads(f.read()))
        run(h)

    def run(h):
        model = Upsampler(h)
    """


def test_a_configuration_object_read_from_the_file_the_command_line_names(tmp_path):
    root = write_tree(tmp_path, {
        "vocoder/__init__.py": "", "vocoder/net.py": VOCODER, "train.py": VOCODER_TRAIN,
        "settings/wide.json": '{"rates": [4, 4, 2], "first_channels": 256, "batch_size": 16}',
        "settings/narrow.json": '{"rates": [2, 2], "first_channels": 16, "batch_size": 16}',
        "notes.json": '{"rates": "not these"}'})  # holds one of the names only
    subject = build_subject(root, "vocoder/net.py:Upsampler", device="cpu")
    assert isinstance(subject, Subject), subject
    assert subject.model.pre.out_channels == 16 and len(subject.model.ups) == 4  # the narrow file, the cheaper
    assert any("settings/narrow.json" in n and "smallest of 2" in n for n in subject.notes), subject.notes


FLOW = """\
    from torch import nn

    class Coupling(nn.Module):
        def __init__(self, n_bands, n_steps, inner):
            super().__init__()
            assert n_bands % 2 == 0
            self.steps = nn.ModuleList(nn.Conv1d(n_bands // 2, n_bands // 2, inner["kernel"], padding=inner["kernel"] // 2)
                                       for _ in range(n_steps))

        def forward(self, x):
            a, b = x.chunk(2, dim=1)
            for step in self.steps:
                b = b + step(a)
            return torch.cat([a, b], 1)

    import torch
    """
FLOW_SETTINGS = """\
{"optim": {"lr": 0.001, "n_steps": 500},
 "model": {"coupling": {"n_bands": 8, "n_steps": 2, "inner": {"kernel": 3}}}}
"""


def test_keyword_arguments_from_a_section_of_a_configuration_file(tmp_path):
    root = write_tree(tmp_path, {"flow.py": FLOW, "setup.json": FLOW_SETTINGS})
    assert [where for where, _ in sites.data_file_sections(root, ["n_bands", "n_steps", "inner"])] == \
        ["setup.json: model.coupling"]
    assert sites.data_file_sections(root, ["n_steps"]) == []  # one name alone chooses nothing
    subject = build_subject(root, "flow.py:Coupling", device="cpu")
    assert isinstance(subject, Subject), subject
    assert len(subject.model.steps) == 2 and subject.model.steps[0].in_channels == 4


# -- a namespace the script completes after parsing -----------------------------------------------------------

TEXT_CONV = """\
    import torch
    from torch import nn

    class TextConv(nn.Module):
        def __init__(self, args):
            super().__init__()
            self.embed = nn.Embedding(args.n_words_seen, args.dim)
            self.convs = nn.ModuleList(nn.Conv1d(args.dim, 4, k) for k in args.sizes)
            self.out = nn.Linear(4 * len(args.sizes), args.n_labels_seen)

        def forward(self, ids):
            x = self.embed(ids).transpose(1, 2)
            return self.out(torch.cat([conv(x).amax(-1) for conv in self.convs], 1))
    """
TEXT_MAIN = """\
    import argparse
    from textconv import TextConv

    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--sizes", type=str, default="2,3")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args()
    words, labels = load_corpus()
    args.n_words_seen = len(words)
    args.n_labels_seen = len(labels) + 1 if args.debug else len(labels)
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    del args.debug
    model = TextConv(args)
    """


def test_the_attributes_a_script_writes_into_its_namespace_after_parsing(tmp_path):
    root = write_tree(tmp_path, {"textconv.py": TEXT_CONV, "main.py": TEXT_MAIN})
    subject = build_subject(root, "textconv.py:TextConv", device="cpu")
    assert isinstance(subject, Subject), subject
    assert [c.kernel_size[0] for c in subject.model.convs] == [2, 3]  # the list the script makes of the string
    assert subject.model.embed.num_embeddings == build.COUNT_GUESS  # len() of what the script loads: any count
    assert subject.model.out.out_features == build.COUNT_GUESS


def test_only_the_writes_that_always_run_before_the_call_count(tmp_path):
    script = """\
        import argparse
        from textconv import TextConv

        parser = argparse.ArgumentParser()
        parser.add_argument("--dim", type=int, default=8)
        parser.add_argument("--sizes", type=str, default="2,3")
        parser.add_argument("--n_words_seen", type=int, default=30)
        parser.add_argument("--n_labels_seen", type=int, default=5)
        args = parser.parse_args()
        if args.dim > 100:
            args.sizes = "7,9"              # a branch that may not run: left out
        args.n_words_seen = tokenizer.size()  # no value here: the default stays
        args.sizes = [int(s) for s in args.sizes.split(",")]
        model = TextConv(args)
        args.dim = 1000                     # after the call
        """
    root = write_tree(tmp_path, {"textconv.py": TEXT_CONV, "main.py": script})
    subject = build_subject(root, "textconv.py:TextConv", device="cpu")
    assert isinstance(subject, Subject), subject
    assert [c.kernel_size[0] for c in subject.model.convs] == [2, 3]
    assert subject.model.embed.num_embeddings == 30 and subject.model.out.out_features == 5


def test_a_comprehension_is_evaluated_item_by_item(tmp_path):
    root = write_tree(tmp_path, {"m.py": "from torch import nn\nclass Net(nn.Module):\n"
                                         "    def __init__(self, widths):\n        super().__init__()\n",
                                 "run.py": "from m import Net\nraw = '4, 8,16'\n"
                                           "net = Net([int(w.strip()) * 2 for w in raw.split(',') if w])\n"
                                           "other = Net([unknown_call(w) for w in raw.split(',')])\n"})
    found = {c.where: c.positional for c in sites.constructions(root, "m.py", "Net")}
    assert found.get("run.py:3") == [[8, 16, 32]], found
    assert found.get("run.py:4", [sites.UNKNOWN]) == [sites.UNKNOWN], found  # one item without a value: none


# -- inputs a wrapper hands to its submodules -------------------------------------------------------------------

PERIODS = """\
    import torch
    from torch import nn

    class PeriodHead(nn.Module):
        def __init__(self, period):
            super().__init__()
            self.period = period
            self.conv = nn.Conv2d(1, 4, (3, 1), padding=(1, 0))
            self.out = nn.Conv2d(4, 1, (3, 1), padding=(1, 0))

        def forward(self, x):
            b, c, t = x.shape
            x = x[:, :, : t - t % self.period].reshape(b, c, -1, self.period)
            features = torch.relu(self.conv(x))
            return torch.flatten(self.out(features), 1), [features]

    class Judges(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleList([PeriodHead(2), PeriodHead(3)])

        def forward(self, real, fake):
            real_scores, fake_scores = [], []
            for i, head in enumerate(self.heads):
                real_scores.append(head(real)[0])
                fake_scores.append(head(fake)[0])
            return real_scores, fake_scores
    """


def test_inputs_read_from_the_submodules_a_forward_hands_them_to(tmp_path):
    root = write_tree(tmp_path, {"judges.py": PERIODS})
    module = build.import_with_stand_ins(root, "judges.py")
    judges = module.Judges()
    handed = forward_body.parameters_handed_to_children(judges)
    assert handed["real"] == (judges.heads[0], 0) and handed["fake"] == (judges.heads[0], 0)
    notes: list[str] = []
    prober = build._Prober(judges, "cpu", torch.float32)
    plan, output = build._input_from_children(judges, prober, notes)
    assert plan is not None and len(plan.args) == 2 and plan.args[0] == plan.args[1], notes
    assert isinstance(output, tuple) and all(isinstance(part, list) for part in output)
    select, note = build._select_primary(output)  # a tuple of lists of scores: the first score of the first list
    assert select(output) is output[0][0] and "element 0" in note


def test_a_parameter_bound_again_before_the_call_is_not_handed_on():
    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x, y):
            x = x * 2
            if y.sum() > 0:
                y = y + 1
            return self.inner(x) + self.inner(y)

    handed = forward_body.parameters_handed_to_children(Outer())
    assert "x" not in handed  # rebound before the call on every path
    assert set(handed) == {"y"}  # a branch may not run


# -- a parent whose smallest settings file chooses another of its block classes ----------------------------------

STACK = """\
    from torch import nn

    class PlainUnit(nn.Module):
        def __init__(self, h, width):
            super().__init__()
            self.conv = nn.Conv1d(width, width, h.span, padding=h.span // 2)

        def forward(self, x):
            return x + self.conv(x)

    class GatedUnit(nn.Module):
        def __init__(self, h, width):
            super().__init__()
            self.value = nn.Conv1d(width, width, h.span, padding=h.span // 2)
            self.gate = nn.Conv1d(width, width, h.span, padding=h.span // 2)

        def forward(self, x):
            return x + self.value(x) * self.gate(x).sigmoid()

    class Stack(nn.Module):
        def __init__(self, h):
            super().__init__()
            unit = GatedUnit if h.unit_kind == "gated" else PlainUnit
            self.pre = nn.Conv1d(3, h.width, 1)
            self.units = nn.ModuleList([unit(h, h.width) for _ in range(h.depth)])

        def forward(self, x):
            x = self.pre(x)
            for u in self.units:
                x = u(x)
            return x
    """
STACK_TRAIN = VOCODER_TRAIN.replace("vocoder.net import Upsampler", "stack.net import Stack").replace(
    "Upsampler(h)", "Stack(h)")


def test_a_parent_built_from_the_next_settings_file_when_the_smallest_holds_no_instance(tmp_path):
    root = write_tree(tmp_path, {
        "stack/__init__.py": "", "stack/net.py": STACK, "train.py": STACK_TRAIN,
        "settings/small.json": '{"unit_kind": "plain", "width": 8, "depth": 2, "span": 3}',
        "settings/large.json": '{"unit_kind": "gated", "width": 32, "depth": 3, "span": 5}'})
    gated = build_subject(root, "stack/net.py:GatedUnit", device="cpu")
    assert isinstance(gated, Subject), gated
    assert gated.model.value.kernel_size == (5,)  # the large file's units, the only ones that are gated
    assert any("built inside Stack" in n for n in gated.notes), gated.notes
    plain = build_subject(root, "stack/net.py:PlainUnit", device="cpu")
    assert isinstance(plain, Subject), plain
    assert plain.model.conv.kernel_size == (3,)  # the smallest file still comes first when it holds one
    assert build._DATA_FILE_CHOICE == [0]


# -- sizes a script reads off the data it loads, passed to a constructor whose names the guess table does not know --

PROBE = """\
    from torch import nn

    class Probe(nn.Module):
        # a linear probe over the columns of a loaded table
        def __init__(self, src_ft, n_kinds):
            super().__init__()
            self.read, self.kinds = nn.Linear(src_ft, n_kinds), n_kinds

        def forward(self, x):
            return self.read(x).view(-1, self.kinds)
    """
PROBE_MAIN = """\
    from probe import Probe

    table, kinds = read_dataset("somewhere")
    n_cols = table.shape[1]
    probe = Probe(n_cols, kinds.shape[-1])
    """


def test_a_size_read_off_loaded_data_is_any_count(tmp_path):
    """``table.shape[1]`` of data the script loads when it runs is a size the code cannot know: any count builds,
    whatever the parameter's name; the same constructor without the script stays unbuilt by guessing."""
    alone = build_subject(write_tree(tmp_path / "alone", {"probe.py": PROBE}), "probe.py:Probe", device="cpu")
    assert isinstance(alone, build.Skip) and "cannot guess constructor argument 'src_ft'" in alone.reason, alone
    root = write_tree(tmp_path / "script", {"probe.py": PROBE, "main.py": PROBE_MAIN})
    subject = build_subject(root, "probe.py:Probe", device="cpu")
    assert isinstance(subject, Subject), subject
    assert (subject.model.read.in_features, subject.model.read.out_features) == (build.COUNT_GUESS,) * 2
    assert any("loads when it runs" in note for note in subject.notes), subject.notes
