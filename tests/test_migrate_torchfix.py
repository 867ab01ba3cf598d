"""`torchreview migrate-torchfix`: TorchFix's flake8 settings, CI step and pre-commit hook rewritten into ours."""
from __future__ import annotations

import textwrap
from pathlib import Path

import yaml

from analyzers.config import find_config
from analyzers.rules import all_rules
from bot.cli import main


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))


def selected(root: Path) -> set[str]:
    return {r.id for r in find_config(root).enabled_rules(all_rules())}


def run(root: Path, capsys, *extra: str) -> tuple[int, str, str]:
    code = main(["migrate-torchfix", str(root), *extra])
    out, err = capsys.readouterr()
    return code, out, err


FLAKE8_SETUP_CFG = """\
    [metadata]
    name = demo

    [flake8]
    max-line-length = 120
    select = E,W,F,TOR
    extend-ignore =
        E203,
        TOR1,
        TOR203
    """
WORKFLOW = """\
    name: lint
    on: [push]
    jobs:
      lint:
        runs-on: ubuntu-latest
        steps:
          - uses: actions/checkout@v4
          - run: pip install flake8 "torchfix==0.7.0"
          # torchfix runs twice: through flake8 and alone
          - name: Run torchfix
          - run: |
              flake8 --select=E9,F63,TOR0 src tests
              python -m torchfix --show-stderr src
    """
PRECOMMIT = """\
    repos:
      - repo: https://github.com/psf/black
        rev: 24.4.0
        hooks:
          - id: black
      - repo: https://github.com/pytorch-labs/torchfix
        rev: v0.7.0
        hooks:
          - id: torchfix
            args: [--select, ALL]
      - repo: https://github.com/pycqa/flake8
        rev: 7.0.0
        hooks:
          - id: flake8
    """

FLAKE8_HOOK = """\
repos:
  - repo: https://github.com/pycqa/flake8
    rev: 7.0.0
    hooks:
    - id: flake8
"""


def test_prints_the_diff_and_writes_nothing_without_write(tmp_path, capsys):
    write(tmp_path, {"setup.cfg": FLAKE8_SETUP_CFG})
    before = (tmp_path / "setup.cfg").read_text()
    code, out, err = run(tmp_path, capsys)
    assert code == 0
    assert "-select = E,W,F,TOR\n+select = E,W,F\n" in out
    assert "-    TOR1,\n" in out and "-    TOR203\n" in out and "     E203,\n" in out
    assert "+++ b/.torchreview.toml" in out and "--write" in err
    assert (tmp_path / "setup.cfg").read_text() == before and not (tmp_path / ".torchreview.toml").exists()


def test_flake8_selection_becomes_ours(tmp_path, capsys):
    write(tmp_path, {"setup.cfg": FLAKE8_SETUP_CFG})
    assert run(tmp_path, capsys, "--write")[0] == 0
    cfg = (tmp_path / "setup.cfg").read_text()
    assert "TOR" not in cfg and "select = E,W,F\n" in cfg and "max-line-length = 120" in cfg
    # TOR0 + TOR2 (TOR1 and TOR203 ignored; TOR4/TOR9 off by default); TOR202 is TR811's, TOR203 has no rule
    assert selected(tmp_path) == {"TR810", "TR514", "TR812", "TR814", "TR811"}
    # the rewrite is idempotent: a second run finds nothing left
    code, _out, err = run(tmp_path, capsys)
    assert code == 2 and "no TorchFix configuration found" in err


def test_extend_select_of_an_off_by_default_family_and_dot_flake8(tmp_path, capsys):
    write(tmp_path, {".flake8": "[flake8]\nextend-select = TOR4\nignore = TOR0 TOR2\n"})
    assert run(tmp_path, capsys, "--write")[0] == 0
    assert (tmp_path / ".flake8").read_text() == "[flake8]\n"
    assert selected(tmp_path) == {"TR811", "TR801", "TR601", "TR813", "TR414", "TR412", "TR702", "TR729"}
    # the codes themselves are selected, so the rules run with TorchFix's scope for them
    assert (tmp_path / ".torchreview.toml").read_text().endswith(
        'select = ["TOR101", "TOR102", "TOR103", "TOR104", "TOR105", "TOR106", "TOR107", "TOR108", "TOR401", "TOR402"]\n')
    config = find_config(tmp_path)
    assert config.rule_options("TR702") == {"every-loader"} and config.rule_options("TR414") == {"any-precision"}
    assert config.rule_options("TR813") == {"each-call"} and config.rule_options("TR601") == frozenset()


def test_ci_step_and_install_become_torchreview(tmp_path, capsys):
    write(tmp_path, {".github/workflows/lint.yml": WORKFLOW})
    assert run(tmp_path, capsys, "--write")[0] == 0
    workflow = (tmp_path / ".github/workflows/lint.yml").read_text()
    assert 'pip install flake8 "torchreview"' in workflow
    assert "flake8 --select=E9,F63 src tests && torchreview check src tests\n" in workflow
    assert "torchreview check src\n" in workflow
    assert "- name: Run torchfix\n" in workflow and "# torchfix runs twice" in workflow
    yaml.safe_load(workflow)
    # `torchfix` without --select ran its defaults: TOR0, TOR1, TOR2
    assert selected(tmp_path) == {rule for code in ("TOR0", "TOR1", "TOR2")
                                  for rule in _rules(code)}


def _rules(selector):
    from analyzers.torchfix_map import rules_for_torchfix

    return rules_for_torchfix(selector)


def test_precommit_hook_replaced(tmp_path, capsys):
    write(tmp_path, {".pre-commit-config.yaml": PRECOMMIT})
    code, _out, err = run(tmp_path, capsys, "--write")
    assert code == 0 and "pre-commit autoupdate --freeze" in err
    config = yaml.safe_load((tmp_path / ".pre-commit-config.yaml").read_text())
    assert [r["repo"] for r in config["repos"]] == [
        "https://github.com/psf/black", "https://github.com/torchreview/torchreview", "https://github.com/pycqa/flake8"]
    assert config["repos"][1]["hooks"] == [{"id": "torchreview"}]
    assert "TR702" in selected(tmp_path)  # its args selected ALL, TOR401 included


def test_torchfix_as_a_flake8_hook_dependency(tmp_path, capsys):
    write(tmp_path, {".pre-commit-config.yaml": FLAKE8_HOOK + "      additional_dependencies: [flake8-bugbear, torchfix]\n",
                     "tox.ini": "[tox]\nenvlist = py3\n\n[flake8]\nextend-select = TOR102\n"})
    assert run(tmp_path, capsys, "--write")[0] == 0
    config = yaml.safe_load((tmp_path / ".pre-commit-config.yaml").read_text())
    assert config["repos"][0]["repo"] == "https://github.com/torchreview/torchreview"
    assert config["repos"][1]["hooks"][0]["additional_dependencies"] == ["flake8-bugbear"]
    assert (tmp_path / "tox.ini").read_text() == "[tox]\nenvlist = py3\n\n[flake8]\n"
    assert "TR601" in selected(tmp_path) and "TR702" not in selected(tmp_path)


def test_flake8_plugin_dependency_alone_runs_torchfix_defaults(tmp_path, capsys):
    write(tmp_path, {".pre-commit-config.yaml": FLAKE8_HOOK + "      additional_dependencies:\n        - torchfix==0.7.0\n"})
    assert run(tmp_path, capsys, "--write")[0] == 0
    config = yaml.safe_load((tmp_path / ".pre-commit-config.yaml").read_text())
    assert config["repos"][1]["hooks"] == [{"id": "flake8"}]
    assert selected(tmp_path) == set(_rules("TOR0")) | set(_rules("TOR1")) | set(_rules("TOR2"))


def test_existing_configuration_is_left_alone(tmp_path, capsys):
    write(tmp_path, {"setup.cfg": FLAKE8_SETUP_CFG, ".torchreview.toml": 'min_severity = "high"\n'})
    code, out, err = run(tmp_path, capsys, "--write")
    assert code == 0 and ".torchreview.toml already configures torchreview" in err and '"TOR001"' in err
    assert (tmp_path / ".torchreview.toml").read_text() == 'min_severity = "high"\n'
    assert "+select = E,W,F" in out


def test_nothing_to_migrate_and_nothing_covered_are_errors(tmp_path, capsys):
    write(tmp_path, {"setup.cfg": "[flake8]\nselect = E,W\n"})
    code, _out, err = run(tmp_path, capsys)
    assert code == 2 and "no TorchFix configuration found" in err
    # codes whose rules run only when selected are migrated like the others
    write(tmp_path, {"setup.cfg": "[flake8]\nselect = E,TOR203,TOR901\n"})
    assert run(tmp_path, capsys, "--write")[0] == 0
    assert selected(tmp_path) == {"TR823", "TR903"}
    code, _out, err = run(tmp_path / "absent", capsys)
    assert code == 2 and "not a directory" in err
