"""Which loops run a model for its results: a loop over data that keeps only the numbers of each forward pass
(``.detach()``, ``.numpy()``, ``.item()``) while nothing around it trains is an inference loop, whatever it and
its function are called (program.evaluation, program.graphs)."""
from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from analyzers.engine import analyze_source
from analyzers.program.flow import subtree
from analyzers.program.graphs import output_taken_off_graph
from analyzers.rules import all_rules
from tests.test_program_model import context

RULES = [r for r in all_rules() if r.id in ("TR201", "TR202")]


def _rules_hit(code: str) -> list[tuple[str, int]]:
    result = analyze_source(textwrap.dedent(code), "features.py", rules=RULES)
    assert not result.errors, result.errors
    return sorted((f.rule, f.line) for f in result.findings)


_HEADER = """
    import torch
    from torch import nn

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.3)
            self.fc = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc(self.drop(x))
"""


@pytest.mark.parametrize("loop", [
    # the output bound to a name, read later into numpy
    """
    def embed_all(batches):
        encoder = Tagger()
        rows = []
        for batch in batches:
            part = encoder(batch)
            rows.append(part.detach().cpu().numpy())
        return rows
    """,
    # read straight off the call, through a view
    """
    def collect(items):
        tagger_model = Tagger()
        found = []
        for number, item in enumerate(items):
            found.append(tagger_model(item).squeeze(0).tolist())
        return found
    """,
])
def test_a_loop_that_keeps_only_the_numbers_of_each_forward_runs_the_model_for_inference(loop):
    hits = _rules_hit(_HEADER + loop)
    assert {rule for rule, _ in hits} == {"TR201", "TR202"}, hits


@pytest.mark.parametrize("loop", [
    # the function trains: the numbers are kept for logging beside a backward pass
    """
    def fit(batches, optimizer):
        tagger_model = Tagger()
        for batch, target in batches:
            out = tagger_model(batch)
            loss = ((out - target) ** 2).mean()
            loss.backward()
            optimizer.step()
            history.append(out.detach().numpy())
    """,
    # the output stays on the graph (a loss built from it later)
    """
    def gather(batches):
        tagger_model = Tagger()
        outs = []
        for batch in batches:
            outs.append(tagger_model(batch))
        return torch.stack(outs)
    """,
    # a count, not data
    """
    def time_it(x, n):
        tagger_model = Tagger()
        for _ in range(n):
            tagger_model(x).detach()
    """,
    # put in eval mode and under no_grad already
    """
    @torch.no_grad()
    def embed_all(batches):
        tagger_model = Tagger().eval()
        for batch in batches:
            rows.append(tagger_model(batch).numpy())
    """,
])
def test_loops_that_train_keep_the_graph_count_or_are_already_set_up_are_not_reported(loop):
    assert _rules_hit(_HEADER + loop) == []


def test_output_taken_off_graph_follows_the_name_the_output_is_bound_to():
    ctx = context("""
        for x in data:
            y = net(x)
            keep.append(y.data)
        for x in data:
            z = net(x)
            keep.append(z * 2)
    """)
    calls = [n for n in subtree(ctx.module) if isinstance(n, cst.Call) and getattr(n.func, "value", None) == "net"]
    loops = [n for n in subtree(ctx.module) if isinstance(n, cst.For)]
    assert output_taken_off_graph(calls[0], loops[0].body, ctx)
    assert not output_taken_off_graph(calls[1], loops[1].body, ctx)


_OWN_METHOD = _HEADER + """
        def label(self, x):
{body}
"""


@pytest.mark.parametrize("body, expected", [
    # the module puts itself in eval mode: the method is its inference API, and runs with autograd on
    ("            self.eval()\n            return self.forward(x).argmax(-1)", [("TR202", 16)]),
    ("            if self.training:\n                self.eval()\n            return self(x).argmax(-1)",
     [("TR202", 17)]),
    # already under no_grad
    ("            self.eval()\n            with torch.no_grad():\n                return self(x)", []),
    # no eval(): the caller decides the mode, as for any forward pass
    ("            return self.forward(x).argmax(-1)", []),
    # a shape check on a random tensor
    ("            self.eval()\n            return self(torch.randn(2, 16)).shape", []),
])
def test_a_module_method_that_puts_the_module_in_eval_mode_runs_it_for_inference(body, expected):
    assert _rules_hit(_OWN_METHOD.format(body=body)) == expected


@pytest.mark.parametrize("loop", [
    # the output feeds a loss as well as a detached copy: the loop trains (its backward in a helper)
    """
    def fit(batches, scaler_step):
        tagger_model = Tagger()
        for batch, target in batches:
            out = tagger_model(batch)
            loss = (out - out.detach().mean()).pow(2).sum()
            scaler_step(loss)
    """,
    # a model an object holds: whoever built the object decides its mode
    """
    class Runner:
        def features(self, batches):
            return [self.net(batch).numpy() for batch in batches] + [
                self.net(batch).detach() for batch in batches]

        def extract(self, batches):
            rows = []
            for batch in batches:
                rows.append(self.net(batch).detach().numpy())
            return rows
    """,
])
def test_an_output_that_also_feeds_a_computation_or_a_model_held_by_an_object_is_not_an_inference_loop(loop):
    assert _rules_hit(_HEADER + loop) == []


def test_a_repository_decorator_that_puts_the_model_in_eval_mode_covers_the_function_it_wraps():
    body = """
    def in_eval_mode(fn):
        def wrapper(net, *args):
            before = net.training
            net.eval()
            result = fn(net, *args)
            net.train(before)
            return result
        return wrapper

    @in_eval_mode
    @torch.no_grad()
    def predict(tagger_model, start):
        return tagger_model(start).argmax(-1)
    """
    assert _rules_hit(_HEADER + body) == []
    assert _rules_hit(_HEADER + body.replace("            net.eval()\n", "")) == [("TR201", 25)]


def test_a_helper_handed_its_model_only_by_other_files_is_said_one_step_lower():
    from analyzers.config import Config
    from analyzers.model import Severity

    code = textwrap.dedent("""
        import torch
        def evaluate(net, batches):
            with torch.no_grad():
                for x, y in batches:
                    print((net(x).argmax(1) == y).float().mean())
        def report(net, batches):
            evaluate(net, batches)
        def local(batches):
            net = build()
            evaluate(net, batches)
    """)
    config = Config(preview=True, measured_severities=False, context_severity=False)

    def severities(source: str) -> list[Severity]:
        result = analyze_source(source, "helpers.py", config, rules=[r for r in RULES if r.id == "TR201"])
        return [f.severity for f in result.findings]

    # a caller of this file hands it a model built here: the rule's own severity
    assert severities(code) == [Severity.HIGH]
    # no caller here, or only one that passes on its own parameter, which no caller here fills: callers elsewhere
    without_local = code.split("def local")[0]
    assert severities(without_local) == [Severity.MEDIUM]
    assert severities(without_local.split("def report")[0]) == [Severity.MEDIUM]
