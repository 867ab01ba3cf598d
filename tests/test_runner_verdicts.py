"""The runner's verdicts on models it has never seen, built from small trees in tmp dirs the way the child does:
no FAIL from the runner's own guesses (inputs, batch sizes, float32 rounding, sampling by design), and no miss
of what the run shows (a backward the model's graph breaks, layers in a plain list)."""
from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch")

from gpu_runner.child import smoke_one  # noqa: E402
from tests.runner_support import single_thread, write_tree  # noqa: E402,F401 (autouse fixtures)

STEPS = 20


def smoke(tmp_path, source: str, target: str = "net.py:Net", config: dict | None = None) -> dict:
    root = write_tree(tmp_path, {"net.py": source})
    return smoke_one(root, target, config, "cpu", STEPS, 0)


def linear_net(forward_body: str) -> str:
    """net.py of a Net of one Linear(16, 4) whose forward(self, x) is ``forward_body``: line 11 is the ``def``."""
    return ("import torch\nimport torch.nn.functional as F\nfrom torch import nn\n\n\nclass Net(nn.Module):\n"
            "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(16, 4)\n\n"
            "    def forward(self, x):\n" + textwrap.indent(textwrap.dedent(forward_body).lstrip("\n"), " " * 8))


def checks(report: dict) -> dict:
    return {check["name"]: check for check in report["checks"]}


def fails(report: dict) -> list[str]:
    return [check["name"] for check in report["checks"] if check["status"] == "fail"]


def undecided(report: dict, name: str) -> str:
    """The message of check ``name``, asserted undecided (a skip that says why), and the report not failed by it."""
    result = checks(report)[name]
    assert result["status"] == "skip" and result["details"]["undecided"], result["message"]
    assert name not in fails(report)
    return result["message"]


# written for batches of at most 4 (the sizes the builder probes): the runner's batches of 8 make it raise
BATCH_BOUND = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 4)
            self.row_bias = nn.Parameter(torch.zeros(4, 4))

        def forward(self, x):
            return self.fc(x) + self.row_bias[: x.shape[0]]
"""


def test_the_model_raising_on_guessed_inputs_is_undecided_never_a_fail(tmp_path):
    report = smoke(tmp_path, BATCH_BOUND)
    assert report["status"] == "passed", fails(report)
    contract = checks(report)["forward-contract"]
    assert contract["status"] == "skip" and contract["details"]["undecided"]
    assert "on the runner's guessed input" in contract["message"] and "net.py:12" in contract["message"]


def test_the_same_model_on_configured_inputs_fails_and_the_fail_reproduces(tmp_path):
    report = smoke(tmp_path, BATCH_BOUND, config={"input": {"shape": [16]}})
    assert report["status"] == "failed"
    contract = checks(report)["forward-contract"]
    assert contract["status"] == "fail" and "net.py:12" in contract["details"]["where"]
    assert contract["details"]["reproduced"] == {"batch_size": 6, "seed": 1}


def test_a_fail_that_only_one_batch_shows_is_not_reported(tmp_path):
    # rows mix only in a batch of exactly 8 (eval mode): the second batch size and seed clear the model
    report = smoke(tmp_path, linear_net("""
                out = self.fc(x)
                if x.shape[0] == 8 and not self.training:
                    out = out + out.mean(0, keepdim=True)
                return out
    """), config={"input": {"shape": [16]}})
    assert report["status"] == "passed", fails(report)
    determinism = checks(report)["eval-determinism"]
    assert determinism["status"] == "skip" and determinism["details"]["undecided"]
    assert "not on a batch of 6 (seed 1)" in determinism["message"]


def test_sampling_by_design_is_recognised_and_its_determinism_skipped(tmp_path):
    report = smoke(tmp_path, """
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.encode = nn.Linear(16, 8)
                self.decode = nn.Linear(4, 16)

            def forward(self, x):
                mu, log_var = self.encode(x).chunk(2, dim=1)
                z = mu + torch.randn_like(mu) * torch.exp(0.5 * log_var)
                return self.decode(z)
    """, config={"input": {"shape": [16]}, "task": "regression"})
    determinism = checks(report)["eval-determinism"]
    assert determinism["status"] == "skip" and determinism["details"]["stochastic"]
    assert "stochastic by design" in determinism["message"] and "net.py:13" in determinism["message"]


def test_dropout_left_on_in_eval_is_still_a_fail(tmp_path):
    report = smoke(tmp_path, linear_net("""
                return self.fc(F.dropout(x, 0.5))
    """), config={"input": {"shape": [16]}})
    determinism = checks(report)["eval-determinism"]
    assert determinism["status"] == "fail" and "net.py:12" in determinism["message"]


def test_float32_rounding_beyond_the_old_tolerance_passes_when_float64_agrees(tmp_path):
    # stands in for float32 rounding that depends on the batch (InceptionV4: 1.4e-4 between 4 rows alone and in a
    # batch of 8, 1e-16 in float64)
    from gpu_runner import checks as checks_module

    report = smoke(tmp_path, linear_net("""
                out = self.fc(x)
                if out.dtype == torch.float32 and out.shape[0] == 8:
                    out = out * (1 + 3e-4)
                return out
    """), config={"input": {"shape": [16]}})
    determinism = checks(report)["eval-determinism"]
    assert determinism["status"] == "pass", determinism["message"]
    assert determinism["details"]["batch_size_difference"] > checks_module.OUTPUT_MATCH_TOLERANCE
    assert determinism["details"]["float64_batch_size_difference"] <= checks_module.FLOAT64_MATCH_TOLERANCE
    assert "rounding" in determinism["message"]


def test_tolerance_scales_with_the_output_dtype():
    from gpu_runner.checks import OUTPUT_MATCH_TOLERANCE, _match_tolerance

    assert _match_tolerance(torch.zeros(1)) == OUTPUT_MATCH_TOLERANCE
    assert _match_tolerance(torch.zeros(1, dtype=torch.float16)) == pytest.approx(100 * torch.finfo(torch.float16).eps)
    assert _match_tolerance(torch.zeros(1, dtype=torch.bfloat16)) > 0.5


def test_an_in_place_change_that_breaks_backward_is_a_finding_at_the_models_line(tmp_path):
    report = smoke(tmp_path, linear_net("""
                output = self.fc(x)
                norm = output.norm(dim=1, keepdim=True)
                output /= norm
                return output
    """))
    assert report["status"] == "failed"
    gradients = checks(report)["gradients"]
    assert gradients["status"] == "fail", gradients["message"]
    assert "net.py:13" in gradients["details"]["where"] and "modified by an inplace operation" in gradients["message"]
    assert not any("runner error" in check["message"] for check in report["checks"])


def test_a_detached_output_is_a_finding_at_the_models_forward(tmp_path):
    report = smoke(tmp_path, linear_net("""
                return self.fc(x).detach()
    """), config={"input": {"shape": [16]}})
    assert report["status"] == "failed"
    failed = [check for check in report["checks"] if check["status"] == "fail"]
    assert any("does not require grad" in check["message"] and "net.py:11 in Net.forward" in check["details"].get("where", "")
               for check in failed), [check["message"] for check in report["checks"]]
    assert not any("runner error" in check["message"] for check in report["checks"])


def test_layers_in_a_plain_list_fail_registration_instead_of_being_skipped(tmp_path):
    report = smoke(tmp_path, """
        import torch
        from torch import nn

        class FeedForward(nn.Module):
            def __init__(self, dim=16):
                super().__init__()
                self.layers = [nn.Linear(dim, dim * 2), nn.GELU(), nn.Linear(dim * 2, dim)]

            def forward(self, x):
                for layer in self.layers:
                    x = layer(x)
                return x
    """, target="net.py:FeedForward")
    assert report["status"] == "failed", report["reason"]
    (registration,) = report["checks"]
    assert registration["name"] == "module-registration" and registration["status"] == "fail"
    assert "self.layers" in registration["message"]


def test_a_plain_list_of_layers_also_registered_with_add_module_is_registered():
    """The list is only a handle: each head is registered under its own name, so the optimizer sees it."""
    from gpu_runner.checks import registration_result

    class MultiHead(torch.nn.Module):
        def __init__(self, dim=8, heads=3):
            super().__init__()
            self.heads = [torch.nn.Linear(dim, dim) for _ in range(heads)]
            for i, head in enumerate(self.heads):
                self.add_module(f"head_{i}", head)
            self.loose = [torch.nn.Linear(dim, 2)]  # this one is nobody's: still reported

        def forward(self, x):
            return torch.cat([head(x) for head in self.heads], dim=1)

    result = registration_result(MultiHead())
    assert result.status == "fail" and result.details["unregistered"] == [("loose", 18)]

    class Registered(torch.nn.Module):
        def __init__(self, dim=8):
            super().__init__()
            self.heads = [torch.nn.Linear(dim, dim) for _ in range(2)]
            for i, head in enumerate(self.heads):
                self.add_module(f"head_{i}", head)

    assert registration_result(Registered()).status == "pass"


def test_a_model_without_parameters_is_still_skipped(tmp_path):
    report = smoke(tmp_path, """
        import torch
        from torch import nn

        class Act(nn.Module):
            def forward(self, x):
                return torch.relu(x)
    """, target="net.py:Act")
    assert report["status"] == "skipped" and "no trainable parameters" in report["reason"]


# --- checks whose outcome the runner's own choices decide (issue 27 item 2, the runner corpus's false FAILs) ----

RANDOM_DEPTH = """
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())

        def forward(self, x):
            # the body survives a training step with probability one half, and always counts in eval
            if self.training and bool(torch.rand(()) < 0.5):
                return x
            return x + self.body(x)

    class Net(nn.Module):
        def __init__(self, dim=16):
            super().__init__()
            self.blocks = nn.Sequential(*[Block(dim) for _ in range(4)])
            self.head = nn.Linear(dim, 4)

        def forward(self, x):
            return self.head(self.blocks(x))
"""


def test_parameters_a_random_drop_leaves_without_gradient_are_undecided(tmp_path):
    report = smoke(tmp_path, RANDOM_DEPTH, config={"input": {"shape": [16]}})
    assert "at random" in undecided(report, "gradients")
    assert checks(report)["gradients"]["details"]["gradient_varies_with_seed"]


@pytest.mark.parametrize("draw", ["random.random() < 0.5", "numpy.random.rand() < 0.5"])
def test_a_random_drop_drawn_outside_torch_is_never_a_fail(tmp_path, draw):
    # the runner seeds only torch for the first forward, so whether a block drops there is not ours to fix
    source = "import random\nimport numpy\n" + textwrap.dedent(RANDOM_DEPTH).replace("bool(torch.rand(()) < 0.5)", draw)
    report = smoke(tmp_path, source, config={"input": {"shape": [16]}})
    gradients = checks(report)["gradients"]
    assert gradients["status"] == "pass" or gradients["details"].get("gradient_varies_with_seed"), gradients["message"]
    assert "gradients" not in fails(report)


NEVER_CALLED = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 4)
            self.skip = nn.Linear(16, 4)  # registered, and no method but __init__ names it

        def forward(self, x):
            skip = self.fc(x)
            return self.fc(x) + skip
"""


def test_a_parameter_that_never_gets_a_gradient_whatever_the_seed_still_fails(tmp_path):
    report = smoke(tmp_path, NEVER_CALLED, config={"input": {"shape": [16]}})
    gradients = checks(report)["gradients"]
    assert gradients["status"] == "fail", gradients["message"]
    assert "skip.weight" in gradients["message"] and not gradients["details"].get("untaken_branches")


def test_a_branch_the_input_does_not_take_is_a_warning_about_ddp_not_a_fail(tmp_path):
    report = smoke(tmp_path, """
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self, dim=16):
                super().__init__()
                self.fc = nn.Linear(dim, 4)
                self.resize = nn.Linear(8, dim)  # for inputs of another width

            def forward(self, x):
                if x.shape[-1] != self.fc.in_features:
                    x = self.resize(x)
                return self.fc(x)
    """, config={"input": {"shape": [16]}})
    gradients = checks(report)["gradients"]
    assert gradients["status"] == "warn", gradients["message"]
    assert "Net.resize" in gradients["message"] and "find_unused_parameters" in gradients["message"]
    assert report["status"] == "passed", fails(report)


FLATTENS_ROWS = """
    import torch
    from torch import nn

    class Net(nn.Module):
        '''Normalizes [batch, dim] feature vectors through a 2-d batch norm.'''

        def __init__(self, dim=32):
            super().__init__()
            self.dim = dim
            self.bn = nn.BatchNorm2d(dim)

        def forward(self, x):
            x = x.view(-1, self.dim, 1, 1)
            return self.bn(x).view(-1, self.dim)
"""


def test_an_output_without_the_batch_dim_on_a_guessed_input_is_undecided(tmp_path):
    report = smoke(tmp_path, FLATTENS_ROWS)
    assert "guessed input" in undecided(report, "forward-contract")


def test_an_output_without_the_batch_dim_on_a_configured_input_still_fails(tmp_path):
    report = smoke(tmp_path, FLATTENS_ROWS, config={"input": {"shape": [32, 2, 2]}})
    contract = checks(report)["forward-contract"]
    assert contract["status"] == "fail" and "does not start with the batch size" in contract["message"]


def embedding_net(head: str) -> str:
    return f"""
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self, vocab=50, dim=32, length=12):
                super().__init__()
                self.token = nn.Embedding(vocab, dim)
                self.position = nn.Parameter(torch.randn(1, length, dim))
                self.norm = nn.LayerNorm(dim)
                self.drop = nn.Dropout(0.1)
                self.head = nn.Linear(dim, vocab)

            def forward(self, tokens):
                x = self.drop(self.norm(self.token(tokens) + self.position[:, : tokens.shape[1]]))
                return {head}
    """


def test_overfitting_an_embedding_sum_to_a_guessed_target_is_undecided(tmp_path):
    report = smoke(tmp_path, embedding_net("x"), config={"input": {"shape": [12], "dtype": "long", "high": 50}})
    assert "embedding lookups" in undecided(report, "overfit-batch")


def test_a_head_that_cannot_fit_one_batch_is_still_judged(tmp_path):
    # the same embeddings, then a learned head and a softmax before the runner's cross-entropy: a double softmax
    report = smoke(tmp_path, embedding_net("torch.softmax(self.head(x), dim=-1)"),
                   config={"input": {"shape": [12], "dtype": "long", "high": 50}})
    overfit = checks(report)["overfit-batch"]
    assert not overfit["details"].get("undecided"), overfit["message"]
    assert overfit["status"] == "fail" and "double softmax" in overfit["message"]


TIME_FIRST = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self, vocab=40, dim=16):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.gru = nn.GRU(dim, dim, bidirectional=True)  # time first: [length, batch, dim], both directions

        def forward(self, tokens):
            outputs, hidden = self.gru(self.embed(tokens))
            return outputs
"""


def test_a_time_first_layer_fed_the_guessed_batch_first_input_is_undecided_on_rows(tmp_path):
    report = smoke(tmp_path, TIME_FIRST)
    assert "sequence-first" in undecided(report, "eval-determinism")


def test_rows_that_mix_in_a_batch_first_model_still_fail_on_a_guessed_input(tmp_path):
    report = smoke(tmp_path, linear_net("""
                out = self.fc(x)
                if not self.training:
                    out = out + out.mean(0, keepdim=True)
                return out
    """))
    determinism = checks(report)["eval-determinism"]
    assert determinism["status"] == "fail" and "depend on the batch" in determinism["message"]
