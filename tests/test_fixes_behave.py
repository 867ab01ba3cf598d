"""A fix marked safe keeps behaviour: every rule example whose code runs as it is is run again as fixed, and
what it computed must be the same (values, dtype, device, shapes). Examples that cannot run alone (undefined
names, files, a GPU) are skipped; enough must run for this to mean something."""
from __future__ import annotations

import textwrap
import warnings

import pytest

torch = pytest.importorskip("torch")

from analyzers.config import Config  # noqa: E402
from analyzers.fixer import fix_source  # noqa: E402
from analyzers.rules import all_rules  # noqa: E402
from analyzers.rules.base import Invalid  # noqa: E402


def _execute(_key: str, code: str):
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        exec(compile(code, "<example>", "exec"), namespace)  # noqa: S102 - our own rule examples
    return {k: v for k, v in namespace.items() if not k.startswith("__") and not callable(v)
            and not isinstance(v, (type(torch), type)) and _picklable(v)}


def _picklable(value) -> bool:
    import pickle

    try:
        pickle.dumps(value)
    except Exception:  # noqa: BLE001 - an object that cannot leave the child is not compared
        return False
    return True


def _run(code: str):
    """The example in a forked child: it may change torch's global state (torch.set_default_dtype) as it likes."""
    from analyzers.isolation import run_isolated

    def attempt(key: str, text: str):
        try:
            return "ran", _execute(key, text)
        except Exception as exc:  # noqa: BLE001 - the example needs what a snippet does not have
            return "failed", f"{type(exc).__name__}: {exc}"

    outcome = run_isolated([("example", code)], attempt, lambda key, kind, message: ("failed", message),
                           seconds=120)["example"]
    if outcome[0] != "ran":
        raise RuntimeError(outcome[1])
    return outcome[1]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and a.device == b.device \
            and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if a is None or isinstance(a, (bool, int, float, str, bytes, torch.dtype, torch.device)):
        return type(a) is type(b) and a == b
    return True  # other objects (a module, a scaler) have no value equality to compare


def _safe_fix_examples():
    for rule in all_rules():
        for i, example in enumerate(rule.INVALID):
            if isinstance(example, Invalid) and example.fixed is not None and example.requirements is None:
                yield pytest.param(rule, example, id=f"{rule.id}-{i}")


def test_safe_fixes_compute_what_the_code_computed():
    ran, compared = [], 0
    for param in _safe_fix_examples():
        rule, example = param.values
        code = textwrap.dedent(example.code)
        fixed = fix_source(code, "example.py", Config(select=(rule.id,)), unsafe=False)
        if not fixed.changed:
            continue  # its fix is unsafe: applied only with --unsafe-fixes, and said to change behaviour
        try:
            before = _run(code)
        except Exception:  # noqa: BLE001 - the example needs what a snippet does not have (names, files, a GPU)
            continue
        after = _run(fixed.text)
        ran.append(param.id)
        for name, value in before.items():
            assert name in after, f"{param.id}: the fixed code no longer defines {name}"
            assert _same(value, after[name]), f"{param.id}: {name} differs after the fix:\n{fixed.text}"
            compared += 1
    assert len(ran) >= 5 and compared >= 5, ran  # not vacuous: the rules' runnable examples were run


def test_the_old_range_fix_would_have_been_caught():
    """The comparison sees a dtype change: torch.range's old fix (torch.arange(0, 10)) made int64 from float32."""
    assert not _same(_run("import torch\nxs = torch.range(0, 9)\n")["xs"], _run("import torch\nxs = torch.arange(0, 10)\n")["xs"])
    assert _same(_run("import torch\nxs = torch.range(0, 9)\n")["xs"],
                 _run("import torch\nxs = torch.arange(0, 10, dtype=torch.get_default_dtype())\n")["xs"])
