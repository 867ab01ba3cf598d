"""What a call runs and what it is passed when both go through a name: a function chosen at run time
(``read = a if fast else b``) and options unpacked from a dict (``**options``) (program.values)."""
from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from analyzers.engine import analyze_source
from analyzers.program.flow import subtree
from analyzers.program.values import called_functions, unpacked_keyword
from analyzers.rules import all_rules
from tests.test_program_model import context


def _last_call(code: str, name: str):
    ctx = context(code)
    calls = [n for n in subtree(ctx.module) if isinstance(n, cst.Call) and getattr(n.func, "value", None) == name]
    return ctx, calls[-1]


def test_a_name_bound_to_a_choice_of_functions_may_call_either():
    ctx, call = _last_call("""
        import pickle
        import json
        reader = json.loads if text else pickle.loads
        reader(blob)
    """, "reader")
    assert set(called_functions(ctx, call)) == {"json.loads", "pickle.loads"}
    ctx, call = _last_call("import json\nreader = pick()\nreader(blob)\n", "reader")
    assert called_functions(ctx, call) == ()


@pytest.mark.parametrize("options, expected", [
    ('{"strict": False, "mode": "r"}', "False"),
    ('{} if plain else {"strict": True}', "True"),
    ('dict(mode="r", strict=flag)', "flag"),
    ('{"mode": "r"}', None),
    ('settings()', None),
])
def test_a_keyword_passed_through_unpacked_options(options, expected):
    ctx, call = _last_call(f"options = {options}\nopen_it(path, **options)\n", "open_it")
    found = unpacked_keyword(ctx, call, "strict")
    assert (cst.Module([]).code_for_node(found) if found is not None else None) == expected


TR601 = [r for r in all_rules() if r.id == "TR601"]


@pytest.mark.parametrize("options, reported", [
    ('{} if use_safetensors else {"map_location": "cpu"}', True),
    ('{} if use_safetensors else {"map_location": "cpu", "weights_only": True}', False),
])
def test_a_checkpoint_read_through_a_chosen_loader_and_unpacked_options(options, reported):
    code = textwrap.dedent(f"""
        import sys
        import torch
        from safetensors.torch import load_file

        def restore(net, path, use_safetensors):
            read = load_file if use_safetensors else torch.load
            options = {options}
            net.load_state_dict(read(path, **options))

        restore(build(), sys.argv[1], False)
    """)
    result = analyze_source(code, "restore.py", rules=TR601)
    assert [f.line for f in result.findings] == ([9] if reported else [])
    assert all(f.fix is None for f in result.findings)  # the call may run load_file: no edit of it fits both
