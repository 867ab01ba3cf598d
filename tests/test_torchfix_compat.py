"""TorchFix compatibility: its codes in select/ignore and ``# noqa``, through analyzers.torchfix_map."""
from __future__ import annotations

import re

import pytest

from analyzers.config import Config, ConfigError, parse_config_text, parse_toml_config
from analyzers.engine import analyze_source
from analyzers.model import Severity
from analyzers.rules import all_rules
from analyzers.torchfix_map import TORCHFIX_CODES, rules_for_torchfix, torchfix_codes_named

UNSAFE_LOAD = "import torch\nstate = torch.load('a.pt')\n"
TYPO = "import torch\nx = torch.zeros(3)\nx.require_grad = True\n"


def enabled(config: Config) -> set[str]:
    """The rules a selection names, whatever their level (tests/test_levels.py covers preview vs stable)."""
    from dataclasses import replace

    return {r.id for r in replace(config, preview=True).enabled_rules(all_rules())}


def test_every_code_maps_to_real_rules_or_says_why_not():
    ours = {r.id for r in all_rules()}
    codes = [entry.code for entry in TORCHFIX_CODES]
    assert len(codes) == len(set(codes)) and all(re.fullmatch(r"TOR\d{3}", c) for c in codes)
    for entry in TORCHFIX_CODES:
        assert set(entry.rules) <= ours, entry.code
        if not entry.rules:
            assert entry.note.startswith("not covered:"), entry.code


def test_prefixes_expand_like_flake8():
    assert [e.code for e in torchfix_codes_named("TOR0")] == ["TOR001", "TOR002", "TOR003", "TOR004"]
    assert rules_for_torchfix("tor102") == ("TR601",)
    assert set(rules_for_torchfix("TOR1")) >= {"TR811", "TR801", "TR601", "TR813", "TR414", "TR412"}
    assert rules_for_torchfix("TOR9") == ("TR903",)
    assert torchfix_codes_named("TOR5") == []


def test_cli_select_and_ignore_with_torchfix_codes():
    assert enabled(Config().merged_with_cli(select=["TOR102"])) == {"TR601"}
    assert enabled(Config().merged_with_cli(select=["TOR0"])) == {"TR810", "TR514", "TR812"}
    assert enabled(Config().merged_with_cli(select=["TOR102", "TR1"])) == \
        {"TR601"} | {r.id for r in all_rules() if r.id.startswith("TR1")}
    left = enabled(Config().merged_with_cli(ignore=["TOR0"]))
    assert not left & {"TR810", "TR514", "TR812"} and "TR601" in left
    # ignoring a code we do not cover is harmless (a migrated flake8 config often does)
    assert enabled(Config().merged_with_cli(ignore=["TOR9"])) == {r.id for r in all_rules() if not r.opt_in}


@pytest.mark.parametrize("select,needle", [
    ("TOR5", "names no TorchFix code"),
    ("TOR999", "names no TorchFix code"),
])
def test_selecting_nothing_is_a_clear_error(select, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        Config().merged_with_cli(select=[select])
    with pytest.raises(ConfigError, match=re.escape(needle)) as info:
        parse_toml_config(f'select = ["{select}"]\n', ".torchreview.toml")
    assert ".torchreview.toml" in str(info.value)


def test_config_files_take_torchfix_codes():
    config = parse_config_text("rules:\n  select: [TOR1, TR514]\n  ignore: [TOR101, TOR4]\n",
                               ".github/torchreview.yml")
    assert "TR601" in enabled(config) and "TR514" in enabled(config)
    assert not enabled(config) & {"TR811", "TR801", "TR810"}
    with pytest.raises(ConfigError, match="ignore: 'TOR77' names no TorchFix code"):
        parse_toml_config('ignore = ["TOR77"]\n', ".torchreview.toml")


def rules_found(code: str) -> list[str]:
    return [f.rule for f in analyze_source(code, "train.py", Config(preview=True)).findings]  # TR601, TR514 are preview


def test_a_torchfix_selector_names_its_rules_as_an_exact_id_does():
    """A migrated `select: [TOR102]` asked for that check: it runs although TR601 is a preview rule. TorchFix has
    no preview level, so its prefix TOR1 asks for every TOR1xx check (our TR1 prefix runs only stable rules)."""
    assert {r.id for r in Config().merged_with_cli(select=["TOR102"]).enabled_rules(all_rules())} == {"TR601"}
    assert "TR601" in {r.id for r in Config().merged_with_cli(select=["TOR1"]).enabled_rules(all_rules())}


def test_torchfix_noqa_suppresses_the_mapped_rules():
    assert rules_found(UNSAFE_LOAD) == ["TR601"]
    assert rules_found(TYPO) == ["TR514"]
    load_line, typo_line = UNSAFE_LOAD.rstrip("\n"), TYPO.rstrip("\n")
    assert rules_found(load_line + "  # noqa: TOR102\n") == []
    assert rules_found(load_line + "  # noqa: TOR1\n") == []  # a prefix, as flake8 reads it
    assert rules_found(load_line + "  # noqa: E501, TOR102\n") == []
    assert rules_found(typo_line + "  # noqa:TOR002\n") == []
    # another code, an uncovered code or another linter's code leaves the finding
    assert rules_found(load_line + "  # noqa: TOR002\n") == ["TR601"]
    assert rules_found(load_line + "  # noqa: TOR901\n") == ["TR601"]
    assert rules_found(load_line + "  # noqa: E501\n") == ["TR601"]
    # in a string it is text, not a suppression
    assert rules_found(load_line + "; note = '# noqa: TOR102'\n") == ["TR601"]


def test_a_file_importing_only_torchvision_is_torch_code():
    # torchvision cannot be used without torch, so torch rules apply without an ``import torch``
    code = "import torchvision\nbackbone = torchvision.models.resnet18(pretrained=True)\n"
    assert rules_found(code) == ["TR814"]
    assert rules_found("import torchvision.models as models\nnet = models.vgg16(pretrained=False)\n") == ["TR814"]
    assert rules_found("import os\nnet = resnet18(pretrained=True)\n") == []


def test_docs_table_matches_the_map():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[1] / "docs" / "torchfix.md").read_text()
    for entry in TORCHFIX_CODES:
        row = next((line for line in docs.splitlines() if line.startswith(f"| {entry.code} |")), None)
        assert row is not None, entry.code
        assert f"| {', '.join(entry.rules) or 'not covered'} |" in row, entry.code


def _table_findings(code: str) -> list:
    from analyzers.rules.mixed_precision_deprecation.deprecated_torch_api import DeprecatedTorchApi
    from analyzers.rules.mixed_precision_deprecation.removed_torch_api import RemovedTorchApi

    return analyze_source(code, "model.py", Config(preview=True), rules=[DeprecatedTorchApi, RemovedTorchApi]).findings


def test_a_fix_never_names_a_module_bound_only_further_down():
    # TorchFix's pytree fixture imports the module under an alias only after the first call: rewriting that
    # call to ``xx.register_pytree_node()`` would raise NameError, so it is reported without a fix
    code = ("from torch.utils._pytree import _register_pytree_node\n"
            "_register_pytree_node(Pair, flat, unflat)\n"
            "from torch.utils import _pytree as xx\n"
            "xx._register_pytree_node(Pair, flat, unflat)\n")
    by_line = {f.line: f for f in _table_findings(code)}
    assert sorted(by_line) == [1, 2, 4]
    assert by_line[1].fix is None and "imports `torch.utils._pytree._register_pytree_node`" in by_line[1].message
    assert by_line[2].fix is None
    assert by_line[4].fix is not None and "xx.register_pytree_node(Pair, flat, unflat)" in by_line[4].fix.apply(code)


def test_a_fix_keeps_the_alias_the_call_was_written_with():
    code = "import torch\nimport torch as la\nA3 = la.chain_matmul(a, b, c)\n"
    (finding,) = _table_findings(code)
    assert finding.fix.apply(code).endswith("A3 = la.linalg.multi_dot([a, b, c])\n")


# ---- TorchFix's scope for a user who selects TorchFix codes --------------------------------------------------------

EVAL_LOADER = "import torch\nfrom torch.utils.data import DataLoader\ntest_loader = DataLoader(test_ds, batch_size=64)\n"


def _found(code: str, config: Config) -> list:
    return analyze_source(code, "loaders.py", config).findings


def test_selecting_a_torchfix_code_gives_torchfix_scope():
    assert _found(EVAL_LOADER, Config(preview=True)) == []  # our default: an evaluation loader in a CPU script
    for selection in (["TOR401"], ["TOR4"], ["TOR"], ["TOR401", "TR1"]):
        (finding,) = [f for f in _found(EVAL_LOADER, Config().merged_with_cli(select=selection)) if f.rule == "TR702"]
        assert finding.severity == Severity.LOW and "TOR401" in finding.message, selection
    # ignoring the code takes the scope back, whatever else selects the rule
    assert Config().merged_with_cli(select=["TOR4", "TR702"], ignore=["TOR401"]).rule_options("TR702") == frozenset()
    assert _found(EVAL_LOADER, Config().merged_with_cli(select=["TR702"])) == []


def test_users_who_select_no_torchfix_code_get_no_option():
    for config in (Config(), Config(preview=True), Config().merged_with_cli(select=["ALL"]),
                   Config().merged_with_cli(select=["TR702", "TR4", "numerics", "private-default-collate"])):
        assert all(config.rule_options(rule.id) == frozenset() for rule in all_rules())


def test_every_option_is_declared_by_its_rule_and_turned_on_by_a_code():
    by_id = {r.id: r for r in all_rules()}
    declared = {(r.id, option) for r in all_rules() for option in r.OPTIONS}
    mapped = {pair for entry in TORCHFIX_CODES for pair in entry.scope}
    assert declared == mapped
    for entry in TORCHFIX_CODES:
        assert all(rule_id in entry.rules for rule_id, _ in entry.scope), entry.code
    assert all(by_id[rule_id].OPTIONS for rule_id, _ in mapped)


def _widened_examples():
    for rule in all_rules():
        for example in rule.INVALID:
            if rule.OPTIONS and getattr(example, "select", ()):
                yield pytest.param(rule, example, id=f"{rule.id}-{rule.INVALID.index(example)}")


@pytest.mark.parametrize("rule,example", list(_widened_examples()))
def test_what_only_torchfix_scope_reports_is_low_and_absent_by_default(rule, example):
    import textwrap

    code = textwrap.dedent(example.code)
    selected = [f for f in analyze_source(code, "example.py", Config().merged_with_cli(select=list(example.select)),
                                          rules=[rule]).findings]
    default = analyze_source(code, "example.py", Config(), rules=[rule]).findings
    widened = [f for f in selected if (f.line, f.message) not in {(d.line, d.message) for d in default}]
    assert widened and len(default) < len(selected)
    assert all(f.severity == Severity.LOW for f in widened)


def test_opt_in_rules_run_only_when_chosen():
    opt_in = {r.id for r in all_rules() if r.opt_in}
    assert opt_in == {"TR729", "TR823", "TR903"}
    everything = Config().merged_with_cli(select=["ALL"], preview=True)
    assert not {r.id for r in everything.enabled_rules(all_rules())} & opt_in
    assert not enabled(Config().merged_with_cli(select=["TR7", "device-performance"])) & opt_in
    assert "TR729" in {r.id for r in Config().merged_with_cli(select=["TOR402"]).enabled_rules(all_rules())}
    assert "TR729" in {r.id for r in Config().merged_with_cli(select=["TR729"]).enabled_rules(all_rules())}
    assert "TR729" in {r.id for r in Config().merged_with_cli(select=["zero-grad-fills-zeros"]).enabled_rules(all_rules())}
    assert "TR823" in {r.id for r in Config().merged_with_cli(select=["TOR2"]).enabled_rules(all_rules())}
    zero_grad = "import torch\noptimizer.zero_grad(set_to_none=False)\n"
    assert [f.rule for f in analyze_source(zero_grad, "t.py", everything).findings] == []
    assert [f.rule for f in analyze_source(zero_grad, "t.py", Config().merged_with_cli(select=["TOR402"])).findings] \
        == ["TR729"]
