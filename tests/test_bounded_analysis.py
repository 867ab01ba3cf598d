"""No analysis can hang: following values always ends, and every file's analysis is bounded in each front end.

The front ends run with tests/fixtures/stalling_rule on PYTHONPATH: a rule that never finishes on a file
holding STALL_THE_ANALYSIS, the stand-in for any rule caught in a loop."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from analyzers.config import Config, ConfigError, parse_config_text
from analyzers.engine import analyze_source
from analyzers.isolation import run_isolated
from analyzers.program.roles import constructs_module
from tests.test_precommit import _git
from tests.test_program_model import context, first

ROOT = Path(__file__).resolve().parents[1]
STALLING_RULE = ROOT / "tests" / "fixtures" / "stalling_rule"
STALL = "import torch\n# STALL_THE_ANALYSIS\nstate = torch.load('a.pt')\n"
UNSAFE_LOAD = "import torch\nstate = torch.load('a.pt')\n"  # TR601, with an (unsafe) fix

# The five lines that hung `torchreview check` (issue 30): a model rebound from its own `.to()`, then saved.
REBOUND_AND_SAVED = """\
import torch
import torch.nn as nn
model = nn.Linear(2, 2)
model = model.to("cpu")
torch.save(model, "m.pt")
"""


def bounded(source: str, seconds: float = 30):
    """The engine on ``source`` with every rule, in a child: (findings, errors) or a timeout error."""
    def analyze(path, text):
        result = analyze_source(text, path, Config(preview=True))
        return [f.rule for f in result.findings], [(e.kind, e.message) for e in result.errors]

    return run_isolated([("program.py", source)], analyze, lambda path, kind, message: ([], [(kind, message)]),
                        seconds=seconds)["program.py"]


def test_a_model_rebound_from_its_own_move_and_saved_is_analyzed():
    rules, errors = bounded(REBOUND_AND_SAVED)
    assert errors == []
    assert rules == ["TR602"]  # the whole module is pickled: found, not hung on


# Values that refer to themselves, directly or around a cycle, through every kind of binding the model follows.
SELF_REFERENCES = {
    "rebound from its own call": "model = nn.Linear(2, 2)\nmodel = model.to(device)\nmodel = model.cuda()\n"
                                 "torch.save(model, 'm.pt')\nout = model(x)\n",
    "rebound through a function": "model = nn.Linear(2, 2)\nmodel = wrap(model)\nmodel = model.to(device)\n"
                                  "torch.save(model, 'm.pt')\n",
    "two names around a cycle": "a = nn.Linear(2, 2)\nb = a.to(device)\na = b.to(device)\nb = a.to(device)\n"
                                "torch.save(b, 'm.pt')\nloss = b(x).sum()\nloss.backward()\n",
    "swapped through a tuple": "a = nn.Linear(2, 2)\nb = nn.Linear(2, 2)\na, b = b, a\na, b = b.to(device), a.cuda()\n"
                               "torch.save(a, 'm.pt')\n",
    "a bare self-assignment": "model = model\nmodel = model.to(device)\ntorch.save(model, 'm.pt')\n",
    "augmented and walrus": "x = torch.zeros(2)\nx += x\n(x := x.to(device))\ntotal = x\ntotal += total\n"
                            "torch.save(x, 'x.pt')\n",
    "a loop over itself": "batch = loader\nfor batch in batch:\n    batch = batch.to(device)\n    model(batch)\n",
    "attributes of self": textwrap.dedent("""\
        class Trainer:
            def __init__(self, device):
                self.model = nn.Linear(2, 2)
                self.model = self.model.cuda()
                self.a = self.b = self.model
                self.a = self.b.to(device)
                self.b = self.a.to(device)

            def save(self):
                self.model = self.model.to("cpu")
                torch.save(self.model, "m.pt")
                torch.save(self.b, "b.pt")
        """),
    "a parameter passed around a cycle of calls": textwrap.dedent("""\
        def train(model, loader):
            model = model.to(device)
            for batch in loader:
                evaluate(model, loader)

        def evaluate(model, loader):
            train(model, loader)
            torch.save(model, "m.pt")

        train(nn.Linear(2, 2), DataLoader(data))
        """),
}


@pytest.mark.parametrize("name", sorted(SELF_REFERENCES))
def test_values_that_refer_to_themselves_are_followed_to_an_end(name):
    source = "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader\n" + SELF_REFERENCES[name]
    _, errors = bounded(source)
    assert errors == []  # neither a timeout nor a rule that broke on it


def code(ctx, node) -> str:
    return ctx.module.code_for_node(node)


def test_a_name_read_in_its_own_assignment_is_the_binding_before_it():
    ctx = context("""
        import torch.nn as nn
        model = nn.Linear(2, 2)
        model = model.to("cpu")
        a = nn.Conv2d(1, 1, 3)
        b = a.cuda()
        a = b.float()
    """)
    moved = first(ctx, cst.Call, lambda c: isinstance(c.func, cst.Attribute) and c.func.attr.value == "to")
    # where the program stands now, `model` is the moved one; inside the move it is still the Linear
    assert ctx.assigned_value("model") is moved
    assert code(ctx, ctx.assigned_value(moved.func.value)) == "nn.Linear(2, 2)"
    assert constructs_module(ctx, moved, "model")
    # around the cycle a -> b -> a, each step goes back in the source: b.float() reads b = a.cuda(), which reads
    # the Conv2d, not the a = b.float() after it
    floated = first(ctx, cst.Call, lambda c: isinstance(c.func, cst.Attribute) and c.func.attr.value == "float")
    cuda = ctx.assigned_value(floated.func.value)
    assert code(ctx, cuda) == "a.cuda()"
    assert code(ctx, ctx.assigned_value(cuda.func.value)) == "nn.Conv2d(1, 1, 3)"
    assert code(ctx, ctx.origin(floated.func.value, depth=50)) == "a.cuda()"


# ---- the isolation every front end analyzes through ------------------------------------------------------

def _behave(key, item):
    import ctypes
    import time

    if item == "segfault":
        ctypes.string_at(0)
    if item == "stall":
        time.sleep(3600)
    if item == "hog":
        bytearray(64 << 30)
    return f"analyzed {key}"


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="counts child processes through /proc")
def test_parallel_children_each_bound_their_file_and_leave_nothing_behind():
    items = [(f"ok{i}", "ok") for i in range(8)] + [("b", "segfault"), ("d", "stall"), ("e", "hog"),
                                                      ("d2", "stall")]
    before = set(_children_of(os.getpid()))
    results = run_isolated(items, _behave, lambda key, kind, message: (kind, message), seconds=2, memory=1 << 30,
                           jobs=3)
    assert {key: results[key] for key in results if key.startswith("ok")} == {
        f"ok{i}": f"analyzed ok{i}" for i in range(8)}
    assert results["b"] == ("parser-crash", "the analysis crashed (SIGSEGV); not analyzed")
    assert results["d"] == results["d2"] == ("timeout", "analysis took over 2 s; stopped")
    assert results["e"] == ("parser-crash", "the analysis needed over 1024 MiB; not analyzed")
    assert set(_children_of(os.getpid())) <= before


def test_file_timeout_is_validated_in_the_configuration_and_on_the_command_line():
    assert parse_config_text("file_timeout: 5\n", ".github/torchreview.yml").file_timeout == 5
    for bad in ("0", "601", "'soon'", "true"):
        with pytest.raises(ConfigError, match="file_timeout: must be a whole number from 1 to 600"):
            parse_config_text(f"file_timeout: {bad}\n", ".github/torchreview.yml")
    with pytest.raises(ConfigError, match="--file-timeout: must be from 1 to 600"):
        Config().merged_with_cli(file_timeout=0)


# ---- each front end, with a rule that never finishes --------------------------------------------------------

def stalling_env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(STALLING_RULE), str(ROOT)]), "NO_COLOR": "1", **extra}


def cli(*args, cwd) -> subprocess.CompletedProcess:
    # `check --preview`: the stalling rule (TR999, unmeasured) and TR601 are preview rules
    args = (args[0], "--preview", *args[1:]) if args and args[0] == "check" else args
    return subprocess.run([sys.executable, "-m", "bot.cli", *args], cwd=cwd, env=stalling_env(),
                          capture_output=True, text=True, timeout=240)


def test_the_cli_reports_a_stalled_file_as_a_timeout_and_goes_on(tmp_path):
    (tmp_path / "slow.py").write_text(STALL)
    (tmp_path / "fast.py").write_text(UNSAFE_LOAD)
    for jobs in ("1", "2"):
        proc = cli("check", ".", "--format", "json", "--no-cache", "--file-timeout", "2", "--jobs", jobs, cwd=tmp_path)
        assert proc.returncode == 1, proc.stderr
        report = json.loads(proc.stdout)
        assert report["errors"] == [{"path": "slow.py", "kind": "timeout",
                                     "message": "analysis took over 2 s; stopped"}]
        assert [(f["path"], f["rule"]) for f in report["findings"]] == [("fast.py", "TR601")]


def test_the_limit_comes_from_the_configuration_file_too(tmp_path):
    (tmp_path / "slow.py").write_text(STALL)
    (tmp_path / ".torchreview.toml").write_text("file_timeout = 1\n")
    proc = cli("check", "slow.py", "--format", "json", "--no-cache", cwd=tmp_path)
    assert json.loads(proc.stdout)["errors"][0]["kind"] == "timeout", proc.stderr


def test_fixing_leaves_a_stalled_file_as_it_was_and_fixes_the_others(tmp_path):
    (tmp_path / "slow.py").write_text(STALL)
    (tmp_path / "fast.py").write_text(UNSAFE_LOAD)
    proc = cli("check", ".", "--fix", "--unsafe-fixes", "--format", "json", "--file-timeout", "2", cwd=tmp_path)
    assert json.loads(proc.stdout)["errors"][0] == {"path": "slow.py", "kind": "timeout",
                                                    "message": "analysis took over 2 s; stopped"}
    assert (tmp_path / "slow.py").read_text() == STALL
    assert "weights_only=True" in (tmp_path / "fast.py").read_text()


def test_diff_mode_bounds_the_analysis_of_the_base_revision(tmp_path):
    """`--diff REF` analyzes each changed file at REF too, to keep only what the change introduced."""
    _git("init", "-q", cwd=tmp_path)
    (tmp_path / "train.py").write_text(STALL)
    _git("add", "-A", cwd=tmp_path)
    _git("commit", "-q", "-m", "base", cwd=tmp_path)
    (tmp_path / "train.py").write_text(UNSAFE_LOAD)  # the head no longer stalls; its base does
    proc = cli("check", "train.py", "--diff", "HEAD", "--format", "json", "--no-cache", "--file-timeout", "2",
               cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert [f["rule"] for f in report["findings"]] == ["TR601"], proc.stderr  # what the base had is unknown: kept


def test_analyses_started_from_several_threads_at_once_all_finish():
    """The language server analyzes from worker threads: a child forked for one analysis must not hold another's
    pipes open (that child would never see the end of its input, and its parent would wait for it forever)."""
    import threading

    results: dict[int, dict] = {}

    def analyze(n: int) -> None:
        results[n] = run_isolated([(f"{n}-{i}", "ok") for i in range(3)], _behave,
                                  lambda key, kind, message: (kind, message), seconds=60, jobs=2)

    threads = [threading.Thread(target=analyze, args=(n,), daemon=True) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert results == {n: {f"{n}-{i}": f"analyzed {n}-{i}" for i in range(3)} for n in range(6)}


def test_pools_run_by_two_threads_at_once_do_not_wait_for_each_others_children(tmp_path):
    """The language server analyzes in threads, each a pool of its own: a child of one pool must not hold the
    other pool's pipes open, or that pool's child never sees its end of input and its parent waits forever."""
    import threading
    import time

    def wait_for_file(name: str) -> None:
        deadline = time.monotonic() + 300
        while not (tmp_path / name).exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def first(key, item):
        (tmp_path / "first-started").touch()
        wait_for_file("go")
        return key

    def second(key, item):  # busy for as long as the test says: it holds whatever its fork inherited
        (tmp_path / "second-started").touch()
        wait_for_file("release")
        return key

    results = {}

    def run(name, analyze):
        results[name] = run_isolated([(name, None)], analyze, lambda key, kind, message: (kind, message), seconds=600)

    threads = {name: threading.Thread(target=run, args=(name, analyze), daemon=True)
               for name, analyze in (("first", first), ("second", second))}
    try:
        threads["first"].start()
        wait_for_file("first-started")  # the first pool's pipes are open
        threads["second"].start()
        wait_for_file("second-started")  # forked while they were
        (tmp_path / "go").touch()
        threads["first"].join(120)  # the second's child is still busy
        assert not threads["first"].is_alive(), "the first pool waits for the second pool's child"
        assert results["first"] == {"first": "first"}
    finally:
        (tmp_path / "release").touch()
        (tmp_path / "go").touch()
        for thread in threads.values():
            thread.join(120)
    assert results["second"] == {"second": "second"}
