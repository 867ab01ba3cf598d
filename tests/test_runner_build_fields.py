"""gpu_runner.build and gpu_runner.sites: constructor arguments read from what the repository defines (issue 27 item 1).

Each tree holds small classes written for the case: a settings class that needs a data folder to be made, a forward
that unpacks the pair it is given, a constructor that takes the device it runs on."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from gpu_runner import forward_body, sites  # noqa: E402
from gpu_runner.build import Skip, build_subject  # noqa: E402
from gpu_runner.subject import Subject  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401

SETTINGS_AND_CLASSIFIER = """\
    import torch
    from torch import nn

    class Settings:
        def __init__(self, folder, vectors):
            self.labels = [line.strip() for line in open(folder + "/labels.txt")]
            self.table = torch.load(folder + "/" + vectors) if vectors != "none" else None
            self.where = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            self.vocab_size = 0                       # set by the script once it has read the data
            self.width = self.table.size(1) if self.table is not None else 24
            self.n_hidden = 20
            self.n_stacked = 1
            self.num_classes = len(self.labels)

    class Classifier(nn.Module):
        def __init__(self, settings):
            super().__init__()
            if settings.table is not None:
                self.embed = nn.Embedding.from_pretrained(settings.table)
            else:
                self.embed = nn.Embedding(settings.vocab_size, settings.width)
            self.rnn = nn.GRU(settings.width, settings.n_hidden, settings.n_stacked, batch_first=True)
            self.head = nn.Linear(settings.n_hidden, settings.num_classes)
            self.where = settings.where

        def forward(self, ids):
            out, _ = self.rnn(self.embed(ids.to(self.where)))
            return self.head(out[:, -1])
    """


def test_the_fields_a_settings_constructor_assigns_are_read_without_running_it(tmp_path):
    root = write_tree(tmp_path, {"textcls/__init__.py": "", "textcls/gru.py": SETTINGS_AND_CLASSIFIER})
    fields = sites.constructor_fields(root, "textcls/gru.py", "Settings")
    assert fields["table"] is None  # the arm without the file
    assert fields["width"] == 24
    assert fields["n_hidden"] == 20 and fields["vocab_size"] == 0
    assert fields["where"] is sites.RUN_DEVICE
    assert "labels" not in fields and "num_classes" not in fields  # read from a file: not evaluated


def test_a_model_whose_settings_class_needs_a_data_folder_is_built_from_its_fields(tmp_path):
    root = write_tree(tmp_path, {"textcls/__init__.py": "", "textcls/gru.py": SETTINGS_AND_CLASSIFIER})
    subject = build_subject(root, "textcls/gru.py:Classifier", device="cpu")
    assert isinstance(subject, Subject), subject
    model = subject.model
    assert model.embed.num_embeddings > 0  # the size set at run time is guessed by name, not left at 0
    assert model.rnn.hidden_size == 20
    assert any("textcls/gru.py:Settings's constructor assigns, read statically" in n for n in subject.notes), \
        subject.notes


def test_a_settings_class_missing_an_attribute_the_model_reads_is_not_used(tmp_path):
    root = write_tree(tmp_path, {"textcls/__init__.py": "", "textcls/gru.py": SETTINGS_AND_CLASSIFIER.replace(
        "settings.n_stacked", "settings.unheard_of_knob")})
    skipped = build_subject(root, "textcls/gru.py:Classifier", device="cpu")
    assert isinstance(skipped, Skip)
    assert "cannot guess constructor argument 'settings'" in skipped.reason  # its real cause: the model's config


def test_a_constructor_taking_its_device_gets_the_runners(tmp_path):
    root = write_tree(tmp_path, {"critics/__init__.py": "", "critics/judge.py": """\
        import torch
        from torch import nn

        class Judge(nn.Module):
            def __init__(self, num_inputs, hidden_dim, device):
                super().__init__()
                self.device = device
                self.body = nn.Sequential(nn.Linear(num_inputs, hidden_dim), nn.Tanh(), nn.Linear(hidden_dim, 1))
                self.to(device)

            def forward(self, x):
                return self.body(x.to(self.device))
        """})
    subject = build_subject(root, "critics/judge.py:Judge", device="cpu")
    assert isinstance(subject, Subject), subject
    assert subject.model.device == torch.device("cpu")


def test_a_forward_that_unpacks_its_argument_is_given_a_tuple(tmp_path):
    root = write_tree(tmp_path, {"textcls/__init__.py": "", "textcls/bag.py": """\
        import torch
        from torch import nn

        class Bag(nn.Module):
            def __init__(self, vocab_size=50, n_hidden=12, num_classes=3):
                super().__init__()
                self.table = nn.Embedding(vocab_size, n_hidden)
                self.head = nn.Linear(n_hidden, num_classes)

            def forward(self, batch):
                ids, lengths = batch
                return self.head(self.table(ids).mean(1))
        """})
    described = inputs_inferred(root, "textcls/bag.py:Bag")
    assert "2-tuple the forward unpacks" in described, described
    assert "(long [B, 16] in [0, 50), long [B, 16] in [0, 50))" in described, described


def test_an_argument_indexed_by_constants_is_read_as_the_tuple_it_indexes(tmp_path):
    from gpu_runner import forward_body

    class Pair(torch.nn.Module):
        def forward(self, packed, scale):
            first = packed[0] * scale
            return first + packed[1] + scale.sum()

    class Rebinds(torch.nn.Module):
        def forward(self, x):
            x, _ = x
            return x[0]

    class Plain(torch.nn.Module):
        def forward(self, x):
            return x[0] + x.sum()

    assert forward_body.packed_parameters(Pair()) == {"packed": 2}
    assert forward_body.packed_parameters(Rebinds()) == {"x": 2}  # x[0] reads the rebound name, not the argument
    assert forward_body.packed_parameters(Plain()) == {}  # also used whole: a tensor


def inputs_inferred(root, target: str) -> str:
    subject = build_subject(root, target, device="cpu")
    assert isinstance(subject, Subject), subject
    return next(n for n in subject.notes if n.startswith("input inferred"))


RECOGNIZER = """\
    from torch import nn

    class Recognizer(nn.Module):
        def __init__(self, opt):
            super().__init__()
            if opt.Backbone == "small":
                self.body = nn.Sequential(nn.Conv2d(opt.channels, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
                width = 8
            elif opt.Backbone == "large":
                self.body = nn.Sequential(nn.Conv2d(opt.channels, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
                width = 32
            else:
                raise ValueError("no backbone chosen")
            self.head = nn.Linear(width, opt.num_class)

        def forward(self, image):
            return self.head(self.body(image).flatten(1))
    """
RECOGNIZER_SCRIPT = """\
    import argparse
    from recog.net import Recognizer

    parser = argparse.ArgumentParser()
    parser.add_argument("--Backbone", required=True, help="small | large")
    parser.add_argument("--channels", type=int, default=1)
    opt = parser.parse_args()
    opt.num_class = len("0123456789") + 1
    model = Recognizer(opt)
    """


def test_a_required_option_takes_the_constant_its_class_compares_it_with(tmp_path):
    root = write_tree(tmp_path, {"recog/__init__.py": "", "recog/net.py": RECOGNIZER, "train.py": RECOGNIZER_SCRIPT})
    subject = build_subject(root, "recog/net.py:Recognizer", device="cpu")
    assert isinstance(subject, Subject), subject
    assert subject.model.body[0].out_channels == 8  # "small", the first constant compared
    assert subject.model.body[0].in_channels == 1  # the script's default
    assert any("Backbone='small'" in n for n in subject.notes), subject.notes
    assert subject.model.head.out_features == 11  # what the script writes into the namespace after parsing


def test_a_count_named_in_the_singular_is_guessed_as_its_plural():
    from gpu_runner.build import guess_argument

    assert guess_argument("num_class") == guess_argument("num_classes")
    assert guess_argument("num_class")[0]


def test_an_input_whose_batch_the_model_combines_with_itself_is_rejected_for_one_it_was_written_for(tmp_path):
    root = write_tree(tmp_path, {"blocks/__init__.py": "", "blocks/mixer.py": """\
        import torch
        from torch import nn

        class TokenMixer(nn.Module):
            def __init__(self, width=24, groups=4):
                super().__init__()
                self.groups = groups
                self.proj = nn.Linear(width, width)
                self.norm = nn.LayerNorm(width)

            def forward(self, x):
                b = x.size(0)
                y = self.proj(x).view(b * self.groups, -1, x.size(-1) // self.groups)
                y = y.softmax(dim=1).view(b, -1, x.size(-1))
                return self.norm(y + x)  # [B, L, D] + [B, L, D]; a [B, D] input would give [B, B, D]
        """})
    described = inputs_inferred(root, "blocks/mixer.py:TokenMixer")
    assert "float [B, 16, 24]" in described, described
    subject = build_subject(root, "blocks/mixer.py:TokenMixer", device="cpu")
    assert any(n.startswith("rejected the input float [B, 24]") and "batch on axes 0 and 1" in n
               for n in subject.notes), subject.notes


PLACED = """\
    import torch
    from torch import nn

    DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    class Padder(nn.Module):
        def __init__(self, width=12):
            super().__init__()
            self.proj = nn.Linear(width, width)

        def forward(self, x):
            extra = torch.zeros(x.size(0), 2, x.size(-1)).to(WHERE)
            return torch.cat((self.proj(x), extra), dim=1)
    """


@pytest.mark.skipif(torch.cuda.is_available(), reason="the code's own device choice is the CPU only without a GPU")
@pytest.mark.parametrize("where, status", [("DEVICE", "pass"), ('"cpu"', "fail")], ids=["chosen", "hard-coded"])
def test_a_tensor_moved_to_the_device_the_code_chooses_is_placed(tmp_path, where, status):
    from gpu_runner.checks import run_checks

    root = write_tree(tmp_path, {"pads/__init__.py": "", "pads/net.py": PLACED.replace("WHERE", where)})
    subject = build_subject(root, "pads/net.py:Padder", device="cpu")
    assert isinstance(subject, Subject), subject
    report = run_checks(subject, steps=2, batch_size=2)
    (placement,) = [c for c in report.checks if c.name == "device-placement"]
    assert placement.status == status, placement.message


def test_a_packed_pair_of_different_widths_gets_each_item_its_own_tensor(tmp_path):
    root = write_tree(tmp_path, {"coupling.py": """\
        import torch
        from torch import nn

        class Coupler(nn.Module):
            def __init__(self, signal_channels=4, condition_channels=6, hidden=10):
                super().__init__()
                self.enter = nn.Conv1d(signal_channels, hidden, 1)
                self.condition = nn.Conv1d(condition_channels, hidden, 1)
                self.leave = nn.Conv1d(hidden, signal_channels, 1)

            def forward(self, pair):
                signal, cond = pair
                return self.leave(torch.tanh(self.enter(signal) + self.condition(cond)))
        """})
    model = build_subject(root, "coupling.py:Coupler", device="cpu").model
    (signal, cond), = [facts for facts in forward_body.read_packed(model).values()]
    assert signal[0] == "signal" and signal[1].width == 4 and cond[0] == "cond" and cond[1].width == 6
    described = inputs_inferred(root, "coupling.py:Coupler")
    assert "(signal, cond) the forward unpacks" in described, described
    assert "(float [B, 4, " in described and "float [B, 6, " in described, described


def test_weights_returned_beside_the_output_also_show_the_batch_combined_with_itself(tmp_path):
    # pooling over the positions of a [B, P, D] map: a [B, D] map and a [B, H] query broadcast into a [B, B, ...]
    # score table whose softmax mixes samples; the pooled values are [B, D] either way, the weights are not
    root = write_tree(tmp_path, {"pooling.py": """\
        import torch
        from torch import nn

        class QueryPool(nn.Module):
            def __init__(self, map_dim=12, query_dim=10, score_dim=8):
                super().__init__()
                self.keys = nn.Linear(map_dim, score_dim)
                self.query = nn.Linear(query_dim, score_dim)
                self.score = nn.Linear(score_dim, 1)

            def forward(self, features, state):
                scores = self.score(torch.tanh(self.keys(features) + self.query(state).unsqueeze(1))).squeeze(2)
                weights = scores.softmax(dim=1)
                return (features * weights.unsqueeze(2)).sum(dim=1), weights
        """})
    subject = build_subject(root, "pooling.py:QueryPool", device="cpu")
    assert isinstance(subject, Subject), subject
    described = next(n for n in subject.notes if n.startswith("input inferred"))
    assert "float [B, 16, 12]" in described, described  # positions between the batch and the features
    assert any(n.startswith("rejected the input") and "output's tensor 2" in n for n in subject.notes), subject.notes


def test_lengths_sorted_longest_first_reorder_the_batch_and_are_given_as_lengths(tmp_path):
    # a decoder that orders its batch by the lengths it is handed ([B, 1], squeezed) and reads ids through that
    # order: the lengths are sequence lengths, the ids still reach the embedding after the reordering
    root = write_tree(tmp_path, {"captioner.py": """\
        import torch
        from torch import nn

        class Captioner(nn.Module):
            def __init__(self, vocab_size=40, width=12):
                super().__init__()
                self.words = nn.Embedding(vocab_size, width)
                self.cell = nn.GRUCell(width, width)
                self.out = nn.Linear(width, vocab_size)

            def forward(self, ids, spans):
                spans, order = spans.squeeze(1).sort(dim=0, descending=True)
                ids = ids[order]
                embedded = self.words(ids)
                steps = (spans - 1).tolist()
                h = torch.zeros(ids.size(0), self.cell.hidden_size)
                scores = torch.zeros(ids.size(0), max(steps), self.out.out_features)
                for t in range(max(steps)):
                    live = sum(n > t for n in steps)
                    h = self.cell(embedded[:live, t], h[:live])
                    scores[:live, t] = self.out(h)
                return scores
        """})
    model = build_subject(root, "captioner.py:Captioner", device="cpu").model
    facts = forward_body.read_forward(model)
    assert facts["ids"].vocabulary == 40  # through ``ids[order]``
    assert facts["spans"].lengths and facts["spans"].axis_sizes == {1: 1}
    described = inputs_inferred(root, "captioner.py:Captioner")
    assert "long [B, 1] sequence lengths" in described, described


def test_a_signal_cut_into_frames_before_a_permute_has_the_axes_the_permute_names_less_one(tmp_path):
    root = write_tree(tmp_path, {"framer.py": """\
        import torch
        from torch import nn

        class Framer(nn.Module):
            def __init__(self, frame=4, hidden=6):
                super().__init__()
                self.frame = frame
                self.mix = nn.Conv1d(frame, hidden, 1)

            def forward(self, signal):
                frames = signal.unfold(1, self.frame, self.frame).permute(0, 2, 1)
                return self.mix(frames)
        """})
    model = build_subject(root, "framer.py:Framer", device="cpu").model
    assert forward_body.read_forward(model)["signal"].rank == 2
    described = inputs_inferred(root, "framer.py:Framer")
    assert described.startswith("input inferred from the forward body") and "float [B, 16]" in described, described
