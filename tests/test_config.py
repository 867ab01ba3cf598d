from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from analyzers import levels
from analyzers.config import (CONFIG_FILES_IN_ORDER, Config, ConfigError, find_config, load_config_file,
                              parse_config_text, parse_toml_config)
from analyzers.model import Severity
from analyzers.rules import all_rules


def ids(config):
    return {r.id for r in config.enabled_rules(all_rules())}


def test_defaults_enable_the_stable_rules_and_preview_enables_everything():
    stable = {r.id for r in all_rules() if levels.level_of(r.id) == levels.STABLE}
    assert stable and ids(Config()) == stable
    # but the opt-in rules, which run only when a selection names them (TorchFix's codes)
    everything = {r.id for r in all_rules() if not r.opt_in}
    assert ids(Config(preview=True)) == everything and everything < {r.id for r in all_rules()}
    assert ids(Config.from_mapping({"preview": True})) == everything


def test_a_preview_rule_runs_when_selected_by_its_exact_id_or_slug_not_by_a_prefix_or_category():
    assert levels.level_of("TR601") == levels.PREVIEW  # the subject of this test
    assert "TR601" not in ids(Config(select=("TR6",))) and "TR601" not in ids(Config(select=("serialization",)))
    assert "TR601" in ids(Config(select=("TR601",))) and "TR601" in ids(Config(select=("unsafe-torch-load",)))
    assert "TR601" in ids(Config().merged_with_cli(select=["TR6"], preview=True))


def test_a_merged_rule_is_selected_and_ignored_by_its_old_id():
    assert ids(Config(select=("TR721",))) == {"TR962"}
    assert "TR962" not in ids(Config(preview=True, ignore=("TR721",)))
    assert "TR962" in ids(Config(select=("shuffle-with-sampler",)))


@pytest.mark.parametrize("old_slug, rule_id, new_slug", [
    ("per-step-sync-for-logging", "TR105", "loss-item-every-step"),
    ("per-step-synchronize-for-logging", "TR115", "synchronize-every-step"),
])
def test_a_renamed_slug_still_selects_ignores_and_names_its_rule(old_slug, rule_id, new_slug, tmp_path):
    from analyzers.config import selector_problem
    from analyzers.rules import get_rule

    assert get_rule(old_slug) is get_rule(new_slug) is get_rule(rule_id)
    assert ids(Config(select=(old_slug,))) == ids(Config(select=(new_slug,))) == {rule_id}
    assert rule_id not in ids(Config(preview=True, ignore=(old_slug,)))
    assert selector_problem(old_slug, selecting=True) is None and selector_problem(old_slug, selecting=False) is None
    written = tmp_path / "torchreview.yml"
    written.write_text(f"rules:\n  ignore: [{old_slug}]\npreview: true\n")
    assert rule_id not in ids(load_config_file(written))


def test_aliases_point_at_live_rules_and_shadow_none():
    from analyzers.rules import RULE_ALIASES, get_rule

    live = {r.id for r in all_rules()} | {r.slug for r in all_rules()}
    for alias, target in RULE_ALIASES.items():
        assert alias not in live, f"{alias} is an alias and a live rule's id or slug"
        assert target in {r.id for r in all_rules()} and get_rule(alias).id == target


def test_select_ignore_by_id_prefix_slug_category():
    config = Config.from_mapping({"select": ["TR6"], "ignore": ["save-whole-model"], "preview": True})
    assert ids(config) == {r.id for r in all_rules() if r.id.startswith("TR6")} - {"TR602"}
    assert "TR601" in ids(config)
    config = Config.from_mapping({"select": ["serialization"], "preview": True})
    assert "TR601" in ids(config) and all(i.startswith("TR6") for i in ids(config))


def test_pyproject_section(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname="x"\n\n[tool.torchreview]\nignore=["TR602"]\nfail_on="medium"\n'
        'severity={TR601="critical"}\nexclude=["tests/**"]\n')
    sub = tmp_path / "src"
    sub.mkdir()
    config = find_config(sub)
    assert config.fail_on is Severity.MEDIUM
    assert config.severity["TR601"] is Severity.CRITICAL
    assert config.path_excluded("tests/test_a.py") and not config.path_excluded("src/a.py")
    assert "pyproject.toml" in config.source


def test_dot_torchreview_toml_wins(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / ".torchreview.toml").write_text('min_severity = "high"\n')
    (tmp_path / "pyproject.toml").write_text('[tool.torchreview]\nmin_severity = "low"\n')
    assert find_config(tmp_path).min_severity is Severity.HIGH


@pytest.mark.parametrize("text,needle", [
    ('selct = ["TR1"]', "unknown key 'selct'"),
    ('select = ["TR999"]', "'TR999' matches no rule"),
    ('fail_on = "urgent"', "fail_on: unknown severity 'urgent'"),
    ('severity = {TR999 = "low"}', "'TR999' is not a rule id"),
    ('select = "TR1"\nignore = [1]', "ignore: must be a list of strings"),
    ('select = [', "invalid TOML"),
    ('max_inline_comments = -1', "max_inline_comments: must be a whole number"),
    ('max_inline_comments = "5"', "max_inline_comments: must be a whole number"),
])
def test_bad_config_is_a_clear_error(text, needle):
    with pytest.raises(ConfigError) as info:
        parse_toml_config(text, ".torchreview.toml")
    assert needle in str(info.value) and ".torchreview.toml" in str(info.value)


def test_include_globs():
    config = Config.from_mapping({"include": ["src/**"], "exclude": ["src/vendor/**"]})
    assert config.path_included("src/a/b.py")
    assert not config.path_included("scripts/x.py")
    assert not config.path_included("src/vendor/x.py")


# ---- repository policy: YAML, nested forms, new keys ---------------------------------------

POLICY_YAML = """\
preview: true
rules:
  select: [TR1, serialization]
  ignore: [save-whole-model]
  severity: {TR601: critical}
paths:
  include: ["src/**"]
  exclude: ["src/vendor/**"]
fail_on: medium
review_event: request_changes
filter: {diff_context: 5}
skip:
  drafts: false
  labels: [no-review]
  title_markers: ["[wip]"]
  bots: false
cleanup: delete
smoke:
  enabled: true
  targets: [train.py]
  memory: 2048
  regression: {step_time: 0.1}
"""


def test_yaml_file_with_nested_forms():
    config = parse_config_text(POLICY_YAML, ".github/torchreview.yml")
    assert "TR601" in ids(config) and "TR602" not in ids(config) and not any(i.startswith("TR2") for i in ids(config))
    assert config.severity == {"TR601": Severity.CRITICAL}
    assert config.path_included("src/a.py") and not config.path_included("src/vendor/a.py")
    assert config.fail_on is Severity.MEDIUM and config.review_event == "request_changes"
    assert (config.filter, config.diff_context_lines) == ("diff_context", 5)
    assert (config.skip_drafts, config.skip_labels, config.skip_title_markers, config.skip_bots) == \
        (False, ("no-review",), ("[wip]",), False)
    assert config.cleanup == "delete"
    assert config.smoke == {"enabled": True, "targets": ("train.py",), "steps": (), "timeout": 300, "max_targets": 16,
                            "memory": 2048,
                            "device": "auto", "trust": "collaborators",
                            "regression": {"step_time": 0.1, "memory": 0.25}}
    assert config.source == ".github/torchreview.yml"


def test_defaults_of_the_new_keys():
    config = Config()
    assert (config.review_event, config.filter, config.diff_context_lines, config.cleanup) == \
        ("comment", "introduced", 3, "resolve")
    assert config.skip_drafts and config.skip_bots and config.skip_labels == ("torchreview:skip",)
    assert config.skip_title_markers == ("[skip torchreview]", "[torchreview skip]")
    assert config.smoke["enabled"] is False and config.smoke["timeout"] == 300
    assert config.describe_source().startswith("defaults")


def test_nested_and_flat_forms_mean_the_same():
    flat = Config.from_mapping({"select": ["TR6"], "ignore": ["TR602"], "severity": {"TR601": "low"},
                                "include": ["a/**"], "exclude": ["b/**"]})
    nested = Config.from_mapping({"rules": {"select": ["TR6"], "ignore": ["TR602"], "severity": {"TR601": "low"}},
                                  "paths": {"include": ["a/**"], "exclude": ["b/**"]}})
    assert flat == nested


def test_filter_forms():
    assert Config.from_mapping({"filter": "file"}).filter == "file"
    config = Config.from_mapping({"filter": "diff_context", "diff_context_lines": 10})
    assert (config.filter, config.diff_context_lines) == ("diff_context", 10)
    config = parse_toml_config("filter = { diff_context = 0 }\n", ".torchreview.toml")
    assert (config.filter, config.diff_context_lines) == ("diff_context", 0)


def test_empty_yaml_means_defaults():
    config = parse_config_text("# nothing configured yet\n", ".github/torchreview.yml")
    assert config == Config(source=".github/torchreview.yml")


def test_parse_config_text_dispatches_on_the_name():
    assert parse_config_text('fail_on = "low"\n', ".torchreview.toml").fail_on is Severity.LOW
    assert parse_config_text("fail_on: low\n", ".github/torchreview.yaml").fail_on is Severity.LOW
    assert parse_config_text('[project]\nname = "x"\n', "pyproject.toml") is None
    assert parse_config_text('[tool.torchreview]\nfail_on = "low"\n', "pyproject.toml").fail_on is Severity.LOW
    with pytest.raises(ConfigError, match="settings.json"):
        parse_config_text("{}", "settings.json")


def test_precedence_yaml_then_dot_toml_then_pyproject(tmp_path):
    assert CONFIG_FILES_IN_ORDER == (".github/torchreview.yml", ".github/torchreview.yaml",
                                     ".torchreview.toml", "pyproject.toml")
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.torchreview]\nfail_on = "low"\n')
    assert find_config(tmp_path).fail_on is Severity.LOW
    (tmp_path / ".torchreview.toml").write_text('fail_on = "medium"\n')
    assert find_config(tmp_path).fail_on is Severity.MEDIUM
    (tmp_path / ".github").mkdir()
    (tmp_path / ".github" / "torchreview.yaml").write_text("fail_on: critical\n")
    assert find_config(tmp_path).fail_on is Severity.CRITICAL
    (tmp_path / ".github" / "torchreview.yml").write_text("fail_on: high\n")
    config = find_config(tmp_path / ".github")  # found walking up from a subdirectory too
    assert config.fail_on is Severity.HIGH and config.source.endswith("torchreview.yml")


def test_cli_uses_yaml_config(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / ".github").mkdir()
    (tmp_path / ".github" / "torchreview.yml").write_text("rules:\n  ignore: [TR601]\n")
    assert "TR601" not in ids(find_config(tmp_path))
    assert load_config_file(tmp_path / ".github" / "torchreview.yml").ignore == ("TR601",)


def test_yaml_syntax_error_names_file_and_line():
    with pytest.raises(ConfigError) as info:
        parse_config_text("fail_on: high\nrules:\n  select: [TR1\n  ignore: []\n", ".github/torchreview.yml")
    message = str(info.value)
    assert message.startswith(".github/torchreview.yml:4: invalid YAML:") and "column" in message


def test_toml_syntax_error_names_file_and_line():
    with pytest.raises(ConfigError) as info:
        parse_toml_config('fail_on = "high"\nselect = = 1\n', ".torchreview.toml")
    assert str(info.value).startswith(".torchreview.toml:2: invalid TOML:") and "column" in str(info.value)


def test_unknown_nested_key_names_file_and_line():
    with pytest.raises(ConfigError) as info:
        parse_config_text("fail_on: high\nskip:\n  drafts: true\n  draft: false\n", ".github/torchreview.yml")
    assert str(info.value).startswith(".github/torchreview.yml:4: skip.draft: unknown key 'draft'")
    with pytest.raises(ConfigError) as info:
        parse_toml_config('fail_on = "high"\n\n[skip]\ndraft = false\n', ".torchreview.toml")
    assert str(info.value).startswith(".torchreview.toml:4: skip.draft: unknown key 'draft'")


def test_semantic_error_line_in_pyproject_section():
    text = '[project]\nname = "x"\n\n[tool.torchreview]\nmin_severity = "low"\nfail_on = "urgent"\n'
    with pytest.raises(ConfigError) as info:
        parse_toml_config(text, "pyproject.toml")
    assert str(info.value).startswith("pyproject.toml:6: fail_on: unknown severity 'urgent'")


@pytest.mark.parametrize("text,needle", [
    ("select: [TR1]\nrules:\n  select: [TR6]\n", ":3: rules.select: also given as the top-level 'select'"),
    ("exclude: [a]\npaths:\n  exclude: [b]\n", ":3: paths.exclude: also given as the top-level 'exclude'"),
    ("filter: {diff_context: 2}\ndiff_context_lines: 4\n", ":2: diff_context_lines: also given as filter.diff_context"),
])
def test_flat_and_nested_forms_together_are_an_error(text, needle):
    with pytest.raises(ConfigError) as info:
        parse_config_text(text, ".github/torchreview.yml")
    assert needle in str(info.value)


@pytest.mark.parametrize("text,needle", [
    ("rules: [TR1]", "rules: must be a table"),
    ("paths:\n  includes: [a]", "paths.includes: unknown key 'includes'"),
    ("rules:\n  severity: {TR999: low}", "'TR999' is not a rule id"),
    ("review_event: approve", "review_event: must be one of comment, request_changes, got 'approve'"),
    ("filter: everything", "filter: must be one of added, diff_context, file, introduced, got 'everything'"),
    ("filter: {lines: 3}", "filter.lines: unknown key 'lines'"),
    ("filter: {}", "filter: a table must be {diff_context: N}"),
    ("filter: {diff_context: 51}", "filter.diff_context: must be a whole number from 0 to 50"),
    ("diff_context_lines: -1", "diff_context_lines: must be a whole number from 0 to 50"),
    ("skip: true", "skip: must be a table"),
    ("skip:\n  drafts: sometimes", "skip.drafts: must be true or false"),
    ("skip:\n  bots: 1", "skip.bots: must be true or false"),
    ("skip:\n  labels: [1]", "skip.labels: must be a list of strings"),
    ("skip:\n  title_markers: {a: b}", "skip.title_markers: must be a list of strings"),
    ("cleanup: archive", "cleanup: must be one of delete, resolve, got 'archive'"),
    ("smoke: yes", "smoke: must be a table"),
    ("smoke:\n  gpus: 2", "smoke.gpus: unknown key 'gpus'"),
    ("smoke:\n  enabled: on-demand", "smoke.enabled: must be true or false"),
    ("smoke:\n  targets: 3", "smoke.targets: must be a list of target strings or tables"),
    ("smoke:\n  timeout: 0", "smoke.timeout: must be a whole number from 1 to 3600"),
    ("smoke:\n  timeout: 3601", "smoke.timeout: must be a whole number from 1 to 3600"),
    ("smoke:\n  max_targets: 0", "smoke.max_targets: must be a whole number from 1 to 100"),
    ("smoke:\n  max_targets: 500", "smoke.max_targets: must be a whole number from 1 to 100"),
    ("smoke:\n  memory: lots", "smoke.memory: must be a size such as \"4GiB\" or a number of MiB"),
    ("smoke:\n  memory: -5", "smoke.memory: must be a size"),
    ("smoke:\n  device: tpu", "smoke.device: must be one of auto, cpu, cuda"),
    ("smoke:\n  trust: strangers", "smoke.trust: must be one of collaborators, everyone, maintainers"),
    ("smoke:\n  regression: {step_time: -0.1}", "smoke.regression.step_time: must be a non-negative fraction"),
    ("smoke:\n  regression: {latency: 0.1}", "smoke.regression.latency: unknown key 'latency'"),
    ("- a list", "configuration: must be a table"),
    ("fail_on_errors: sometimes", "fail_on_errors: must be true or false"),
    ("group_across_files: per-file", "group_across_files: must be true or false"),
    ("group_rule_from_files: -1", "group_rule_from_files: must be a whole number"),
])
def test_bad_new_values_are_clear_errors(text, needle):
    with pytest.raises(ConfigError) as info:
        parse_config_text(text, ".github/torchreview.yml")
    message = str(info.value)
    assert needle in message and message.startswith(".github/torchreview.yml")


def test_to_dict_is_the_full_nested_configuration_and_round_trips():
    for config in (Config(), parse_config_text(POLICY_YAML, ".github/torchreview.yml")):
        data = config.to_dict()
        assert set(data) == {"rules", "paths", "preview", "measured_severities", "context_severity", "min_severity", "fail_on",
                             "max_inline_comments",
                             "group_across_files", "group_rule_from_files", "review_event", "filter",
                             "diff_context_lines", "skip", "cleanup", "fail_on_errors", "file_timeout", "smoke"}
        assert set(data["skip"]) == {"drafts", "labels", "title_markers", "bots"}
        assert yaml.safe_load(yaml.safe_dump(data)) == data  # plain types only
        assert Config.from_mapping(data) == replace(config, source="<config>")


def test_every_bad_key_is_reported_in_file_order():
    text = ("fail_on: urgent\nselct: [TR1]\nskip:\n  drafts: maybe\n  draft: true\nsmoke:\n  timeout: 0\n"
            "  device: tpu\nfail_on_errors: 1\n")
    with pytest.raises(ConfigError) as info:
        parse_config_text(text, ".github/torchreview.yml")
    lines = str(info.value).splitlines()
    assert [line.split(": ", 2)[:2] for line in lines] == [
        [".github/torchreview.yml:1", "fail_on"], [".github/torchreview.yml:2", "selct"],
        [".github/torchreview.yml:4", "skip.drafts"], [".github/torchreview.yml:5", "skip.draft"],
        [".github/torchreview.yml:7", "smoke.timeout"], [".github/torchreview.yml:8", "smoke.device"],
        [".github/torchreview.yml:9", "fail_on_errors"]]


def test_fail_on_errors_defaults_to_true():
    assert Config().fail_on_errors is True
    assert parse_config_text("fail_on_errors: false\n", ".github/torchreview.yml").fail_on_errors is False


def test_grouping_across_files_defaults_on_and_can_be_switched_off():
    assert (Config().group_across_files, Config().group_rule_from_files) == (True, 3)
    config = parse_config_text("group_across_files = false\ngroup_rule_from_files = 0\n", ".torchreview.toml")
    assert (config.group_across_files, config.group_rule_from_files) == (False, 0)
