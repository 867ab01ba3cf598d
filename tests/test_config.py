from __future__ import annotations

import pytest

from analyzers.config import Config, ConfigError, find_config, parse_toml_config
from analyzers.model import Severity
from analyzers.rules import all_rules


def ids(config):
    return {r.id for r in config.enabled_rules(all_rules())}


def test_defaults_enable_everything():
    assert ids(Config()) == {r.id for r in all_rules()}


def test_select_ignore_by_id_prefix_slug_category():
    config = Config.from_mapping({"select": ["TR6"], "ignore": ["save-whole-model"]})
    assert ids(config) == {"TR601"}
    config = Config.from_mapping({"select": ["serialization"]})
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
    ('select = "TR1"\nignore = [1]', "ignore must be a list of strings"),
    ('select = [', "invalid TOML"),
    ('max_inline_comments = -1', "max_inline_comments must be a whole number"),
    ('max_inline_comments = "5"', "max_inline_comments must be a whole number"),
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
