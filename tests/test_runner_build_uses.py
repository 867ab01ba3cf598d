"""gpu_runner.build: inputs, skip reasons and sizes read from how a class uses what it is given (issue 27).

Each tree holds one small class written for the case: an attention block whose required mask must broadcast over
its scores, an aggregator that only calls the function its caller hands it, ..."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from gpu_runner.build import Skip, build_subject  # noqa: E402
from gpu_runner.subject import Subject  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401



def inputs_inferred(root, target: str) -> str:
    """The note in which the runner says what inputs it inferred for ``target``, which must build."""
    subject = build_subject(root, target, device="cpu")
    assert isinstance(subject, Subject), subject
    return next(n for n in subject.notes if n.startswith("input inferred"))

def test_a_required_mask_is_offered_in_the_shapes_that_broadcast_over_attention_scores(tmp_path):
    root = write_tree(tmp_path, {"scorers/__init__.py": "", "scorers/block.py": """\
        import torch
        from torch import nn

        class MaskedBlock(nn.Module):
            def __init__(self, width=32, heads=4):
                super().__init__()
                self.heads = heads
                self.qkv = nn.Linear(width, 3 * width)
                self.out = nn.Linear(width, width)

            def forward(self, x, mask):
                b, n, d = x.shape
                q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
                scores = q @ k.transpose(-1, -2)
                scores = scores.masked_fill(mask == 0, -1e9)  # scores [B, heads, N, N]
                return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d))
        """})
    described = inputs_inferred(root, "scorers/block.py:MaskedBlock")
    assert "mask=long [B, 1, 1, 16]" in described or "mask=long [B, 1, 16, 16]" in described, described


def test_masks_handed_to_torch_attention_are_what_torch_takes_and_the_inputs_time_first(tmp_path):
    """A sequence-to-sequence model on ``nn.Transformer`` (time-first by default) whose forward requires the
    attention masks and padding masks it hands on: the attention masks are one [L, L] of False for the whole batch
    (torch hides True and refuses integer masks), the padding masks [B, L], the token sequences [L, B]."""
    root = write_tree(tmp_path, {"seq.py": """\
        from torch import nn

        class Seq2Seq(nn.Module):
            def __init__(self, n_src=40, n_tgt=30, width=32):
                super().__init__()
                self.src_words, self.tgt_words = nn.Embedding(n_src, width), nn.Embedding(n_tgt, width)
                self.core = nn.Transformer(width, 4, 1, 1, 64, 0.0)
                self.head = nn.Linear(width, n_tgt)

            def forward(self, src, tgt, src_mask, tgt_mask, src_key_padding_mask, tgt_key_padding_mask):
                return self.head(self.core(self.src_words(src), self.tgt_words(tgt), src_mask, tgt_mask, None,
                                           src_key_padding_mask, tgt_key_padding_mask))
        """})
    described = inputs_inferred(root, "seq.py:Seq2Seq")
    assert described.endswith(
        "long [16, B] in [0, 40), long [16, B] in [0, 30), src_mask=bool [16, 16] (one for the whole batch) filled "
        "with 0, tgt_mask=bool [16, 16] (one for the whole batch) filled with 0, src_key_padding_mask=bool [B, 16] "
        "filled with 0, tgt_key_padding_mask=bool [B, 16] filled with 0"), described


def test_a_layer_that_only_calls_the_function_it_is_given_skips_as_having_no_parameters(tmp_path):
    root = write_tree(tmp_path, {"pooling/__init__.py": "", "pooling/mean.py": """\
        import torch
        from torch import nn

        class NeighbourMean(nn.Module):
            def __init__(self, lookup, normalise=False):
                super().__init__()
                self.lookup = lookup
                self.normalise = normalise

            def forward(self, ids):
                rows = self.lookup(ids)
                return rows.mean(0)
        """})
    skipped = build_subject(root, "pooling/mean.py:NeighbourMean", device="cpu")
    assert isinstance(skipped, Skip), skipped
    assert "no trainable parameters" in skipped.reason and "'lookup'" in skipped.reason, skipped.reason


def test_a_layer_given_a_function_that_holds_parameters_of_its_own_keeps_the_constructor_reason(tmp_path):
    root = write_tree(tmp_path, {"pooling2/__init__.py": "", "pooling2/weighted.py": """\
        import torch
        from torch import nn

        class WeightedLookup(nn.Module):
            def __init__(self, lookup):
                super().__init__()
                self.lookup = lookup
                self.gain = nn.Parameter(torch.ones(1))

            def forward(self, ids):
                return self.lookup(ids) * self.gain
        """})
    skipped = build_subject(root, "pooling2/weighted.py:WeightedLookup", device="cpu")
    assert isinstance(skipped, Skip), skipped
    assert "cannot guess constructor argument 'lookup'" in skipped.reason, skipped.reason


def test_a_large_size_given_only_as_a_layer_output_width_is_shrunk_whatever_its_name(tmp_path):
    root = write_tree(tmp_path, {"heads/__init__.py": "", "heads/projection.py": """\
        from torch import nn

        class ProjectionHead(nn.Module):
            def __init__(self, in_features=64, prototypes=65536, table_rows=50000):
                super().__init__()
                self.codes = nn.Embedding(table_rows, in_features)
                self.mix = nn.Linear(in_features, in_features)
                self.last = nn.Linear(in_features, prototypes, bias=False)

            def forward(self, x):
                return self.last(self.mix(x) + self.codes.weight[:1])
        """})
    subject = build_subject(root, "heads/projection.py:ProjectionHead", device="cpu")
    assert isinstance(subject, Subject), subject
    assert subject.model.last.out_features == 256 and subject.model.codes.num_embeddings == 256
    assert subject.model.mix.in_features == 64  # an input width is left as it is
    assert any("prototypes=256" in n and "shrunk" in n for n in subject.notes), subject.notes


def test_a_large_output_width_from_the_repository_call_is_shrunk_too(tmp_path):
    root = write_tree(tmp_path, {"heads2/__init__.py": "", "heads2/projection.py": """\
        from torch import nn

        class Prototypes(nn.Module):
            def __init__(self, features, count):
                super().__init__()
                self.last = nn.Linear(features, count)

            def forward(self, x):
                return self.last(x)
        """, "train_heads.py": """\
        from heads2.projection import Prototypes

        head = Prototypes(48, 65536)
        """})
    subject = build_subject(root, "heads2/projection.py:Prototypes", device="cpu")
    assert isinstance(subject, Subject), subject
    assert subject.model.last.out_features == 256 and subject.model.last.in_features == 48, subject.notes


TABULAR = {"tabular/__init__.py": "", "tabular/net.py": """\
    import torch
    from torch import nn

    class PerColumnTables(nn.Module):
        def __init__(self, sizes=(5, 9, 3), width=8):
            super().__init__()
            self.tables = nn.ModuleList([nn.Embedding(n, width) for n in sizes])

        def forward(self, ids):
            if ids.shape[-1] != len(self.tables):
                raise ValueError("one column per table")
            return torch.stack([t(ids[..., j]) for j, t in enumerate(self.tables)], dim=1)

    class PerFeatureScale(nn.Module):
        def __init__(self, count=6, width=8):
            super().__init__()
            self.scale = nn.Parameter(torch.randn(count, width))
            self.shift = nn.Parameter(torch.zeros(count, width))

        def forward(self, x):
            return x[..., None] * self.scale + self.shift

    class Mixed(nn.Module):
        def __init__(self, width=8):
            super().__init__()
            self.numeric = PerFeatureScale(6, width)
            self.categories = PerColumnTables((5, 9, 3), width)
            self.head = nn.Linear(width, 1)

        def forward(self, numbers, codes):
            parts = []
            for label, given, encoder in [("numbers", numbers, self.numeric), ("codes", codes, self.categories)]:
                if given is None:
                    raise ValueError(label)
                parts.append(encoder(given))
            return self.head(torch.cat(parts, dim=1).mean(1))
    """}


def test_a_module_of_per_column_embedding_tables_takes_one_id_per_column(tmp_path):
    root = write_tree(tmp_path, TABULAR)
    subject = build_subject(root, "tabular/net.py:PerColumnTables", device="cpu")
    assert isinstance(subject, Subject), subject
    assert any("long [B, 3] in [0, 3)" in n for n in subject.notes), subject.notes
    # columns are features, not a sequence: no next-token objective that leaves the last column's table untrained
    assert subject.task != "language_model", subject.task
    batch = subject.make_batch(4, 0)
    subject.loss_fn(subject.model(*batch.args), batch.target).backward()
    assert all(t.weight.grad is not None and t.weight.grad.abs().sum() > 0 for t in subject.model.tables)


def test_numeric_and_categorical_inputs_are_read_through_a_loop_over_encoders(tmp_path):
    root = write_tree(tmp_path, TABULAR)
    described = inputs_inferred(root, "tabular/net.py:Mixed")
    assert "float [B, 6], long [B, 3] in [0, 3)" in described, described


STEPS = {"stepper/__init__.py": "", "stepper/net.py": """\
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Scorer(nn.Module):
        def __init__(self, size):
            super().__init__()
            self.size = size
            self.mix = nn.Linear(size * 2, size)
            self.weight = nn.Parameter(torch.rand(size))

        def forward(self, query, memory):
            steps = memory.size(0)
            q = query.repeat(steps, 1, 1).transpose(0, 1)
            memory = memory.transpose(0, 1)
            return self.rank(q, memory)

        def rank(self, q, memory):
            energy = torch.tanh(self.mix(torch.cat([q, memory], 2)))
            return F.softmax((energy * self.weight).sum(2), dim=1).unsqueeze(1)

    class StepDecoder(nn.Module):
        def __init__(self, vocab, size):
            super().__init__()
            self.embed = nn.Embedding(vocab, size)
            self.scorer = Scorer(size)
            self.cell = nn.GRU(size * 2, size)
            self.out = nn.Linear(size, vocab)

        def forward(self, word, previous, memory):
            here = self.embed(word).unsqueeze(0)
            weights = self.scorer(previous[-1], memory)
            context = weights.bmm(memory.transpose(0, 1)).transpose(0, 1)
            output, state = self.cell(torch.cat([here, context], 2), previous)
            return self.out(output.squeeze(0)), state
    """, "stepper/build.py": """\
    from stepper.net import Scorer, StepDecoder

    scorer = Scorer(24)
    decoder = StepDecoder(30, 24)
    """}


def test_a_sequence_the_forward_transposes_to_batch_first_is_given_time_first(tmp_path):
    root = write_tree(tmp_path, STEPS)
    described = inputs_inferred(root, "stepper/net.py:Scorer")
    assert "float [B, 24], float [16, B, 24]" in described, described


def test_a_decoder_step_gets_one_id_per_row_the_rnn_state_and_time_first_memory(tmp_path):
    root = write_tree(tmp_path, STEPS)
    described = inputs_inferred(root, "stepper/net.py:StepDecoder")
    assert "long [B] in [0, 30), float [1, B, 24], float [16, B, 24]" in described, described


SERIES = {"series/__init__.py": "", "series/net.py": """\
    import torch
    from torch import nn

    class ValueCoding(nn.Module):
        def __init__(self, variables, width):
            super().__init__()
            self.conv = nn.Conv1d(variables, width, kernel_size=3, padding=1)

        def forward(self, x):
            return self.conv(x.permute(0, 2, 1)).transpose(1, 2)

    class ClockCoding(nn.Module):
        def __init__(self, fields, width):
            super().__init__()
            self.proj = nn.Linear(fields, width, bias=False)

        def forward(self, x):
            return self.proj(x)

    class Coding(nn.Module):
        def __init__(self, variables, fields, width):
            super().__init__()
            self.value = ValueCoding(variables, width)
            self.clock = ClockCoding(fields, width)

        def forward(self, x, stamps):
            return self.value(x) + self.clock(stamps)

    class Forecaster(nn.Module):
        def __init__(self, variables=5, fields=3, width=16):
            super().__init__()
            self.coding = Coding(variables, fields, width)
            self.head = nn.Linear(width, variables)

        def forward(self, series, stamps):
            return self.head(torch.relu(self.coding(series, stamps)))
    """}


def test_series_read_two_submodules_down_are_channels_last_where_the_body_swaps_them_for_a_conv(tmp_path):
    root = write_tree(tmp_path, SERIES)
    described = inputs_inferred(root, "series/net.py:Forecaster")
    assert "float [B, 16, 5], float [B, 16, 3]" in described, described


def test_a_lone_series_swapped_before_its_conv_is_channels_last(tmp_path):
    # one input, [B, L, C]: a channels-first guess only works when L happens to equal C
    root = write_tree(tmp_path, SERIES)
    described = inputs_inferred(root, "series/net.py:ValueCoding")
    assert "float [B, 16, 5]" in described, described
