"""The CLI as users run it: the installed ``torchreview`` entry point, in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# two findings of a stable rule at high (TR810): the default set fails on them
BAD = "import torch\nvalues = torch.symeig(a)\nx = torch.solve(b, a)\n"
# a preview rule's findings (TR601): reported with --preview, never failing the run
PREVIEW_ONLY = "import torch\nstate = torch.load('model.pt')\nmodel = torch.load(path, weights_only=False)\n"


def run(*args, cwd=None, check=None):
    exe = Path(sys.executable).with_name("torchreview")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "bot.cli"]
    proc = subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})
    if check is not None:
        assert proc.returncode == check, proc.stdout + proc.stderr
    return proc


@pytest.fixture
def project(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "train.py").write_text(BAD)
    (tmp_path / "clean.py").write_text("import torch\nstate = torch.load('m.pt', weights_only=True)\n")
    (tmp_path / "util.py").write_text("def load(x):\n    return x\n")
    return tmp_path


def test_json_contract(project):
    proc = run("check", ".", "--format", "json", cwd=project, check=1)
    data = json.loads(proc.stdout)
    assert set(data) == {"findings", "errors", "stats"}
    assert data["stats"]["files"] == 3 and data["stats"]["seconds"] >= 0
    keys = {"path", "line", "column", "end_line", "end_column", "rule", "slug", "category", "severity", "message", "fix", "related"}
    for finding in data["findings"]:
        assert set(finding) == keys
        assert finding["severity"] in {"critical", "high", "medium", "low"}
        assert finding["fix"] is None or set(finding["fix"]) == {"start_line", "end_line", "replacement", "safe"}
    assert [(f["path"], f["line"], f["rule"]) for f in data["findings"]] == [("train.py", 2, "TR810"), ("train.py", 3, "TR810")]


def test_exit_codes(project):
    run("check", "clean.py", cwd=project, check=0)
    run("check", "train.py", cwd=project, check=1)
    # below the fail level: reported but exit 0
    proc = run("check", "train.py", "--fail-on", "critical", "--format", "json", cwd=project, check=0)
    assert json.loads(proc.stdout)["findings"]
    run("check", "missing.py", cwd=project, check=2)
    run("check", "--select", "TR999", cwd=project, check=2)
    run("check", "--format", "xml", cwd=project, check=2)


def test_bad_config_exit_2_with_message(project):
    (project / ".torchreview.toml").write_text('fail_on = "sometimes"\n')
    proc = run("check", ".", cwd=project, check=2)
    assert "fail_on" in proc.stderr and ".torchreview.toml" in proc.stderr


def test_select_ignore_min_severity(project):
    out = json.loads(run("check", ".", "--format", "json", "--ignore", "TR810", cwd=project, check=0).stdout)
    assert out["findings"] == []
    out = json.loads(run("check", ".", "--format", "json", "--min-severity", "critical", cwd=project).stdout)
    assert all(f["severity"] == "critical" for f in out["findings"])


def test_text_output_is_grouped_with_summary(project):
    proc = run("check", ".", "--color", "never", cwd=project, check=1)
    lines = proc.stdout.splitlines()
    assert lines[0] == "train.py"
    assert "TR810 removed-torch-api" in proc.stdout
    assert "2 findings" in lines[-1] and "3 files" in lines[-1]


def test_sarif(project):
    proc = run("check", ".", "--format", "sarif", cwd=project, check=1)
    sarif = json.loads(proc.stdout)
    assert sarif["version"] == "2.1.0"
    driver = sarif["runs"][0]["tool"]["driver"]
    assert {r["id"] for r in driver["rules"]} >= {"TR810"}
    result = sarif["runs"][0]["results"][0]
    assert result["ruleId"] == "TR810"
    region = result["locations"][0]["physicalLocation"]["region"]
    assert region["startLine"] == 2 and region["startColumn"] >= 1
    assert driver["rules"][result["ruleIndex"]]["id"] == "TR810"


def test_github_format(project):
    proc = run("check", "train.py", "--format", "github", cwd=project, check=1)
    first = proc.stdout.splitlines()[0]
    assert first.startswith("::error file=train.py,line=2,")
    assert "TR810" in first


def test_preview_rules_run_on_opt_in_and_never_fail_the_run(project):
    (project / "load.py").write_text(PREVIEW_ONLY)
    assert json.loads(run("check", "load.py", "--format", "json", cwd=project, check=0).stdout)["findings"] == []
    for opt_in in (["--preview"], ["--select", "TR601"], ["--select", "unsafe-torch-load"]):
        proc = run("check", "load.py", "--format", "json", "--fail-on", "low", *opt_in, cwd=project, check=0)
        found = json.loads(proc.stdout)["findings"]
        assert [(f["rule"], f.get("preview")) for f in found] == [("TR601", True), ("TR601", True)], opt_in
    text = run("check", "load.py", "--preview", "--color", "never", cwd=project, check=0).stdout
    assert "TR601 unsafe-torch-load (preview):" in text
    (project / ".torchreview.toml").write_text("preview = true\n")
    assert json.loads(run("check", "load.py", "--format", "json", cwd=project, check=0).stdout)["findings"]
    # a stable rule's finding beside them still fails the run
    run("check", "load.py", "train.py", cwd=project, check=1)


def test_rules_and_rule_docs():
    proc = run("rules", "--format", "json", check=0)
    rules = json.loads(proc.stdout)
    assert any(r["id"] == "TR601" for r in rules)
    assert len(rules) >= 70
    by_id = {r["id"]: r for r in rules}
    assert by_id["TR601"]["fix"] == "unsafe" and by_id["TR803"]["fix"] == "safe" and by_id["TR101"]["fix"] is None
    # each rule's level and its measured holdout precision (analyzers/rules/levels.json)
    assert by_id["TR816"]["level"] == "stable" and by_id["TR601"]["level"] == "preview"
    assert by_id["TR816"]["holdout"]["judged"] >= 15 and by_id["TR816"]["holdout"]["precision"] >= 0.9
    categories = [r["category"] for r in rules]
    assert categories == sorted(categories, key=categories.index)  # grouped: each category in one run
    text = run("rules", check=0).stdout
    assert "Training loop" in text and "Serialization & security" in text
    assert "stable (run by default)" in text and "preview" in text
    proc = run("rule", "TR601", check=0)
    assert "## Why is this bad?" in proc.stdout or "Why is this bad?" in proc.stdout
    assert "Level: preview, holdout precision" in proc.stdout
    assert "Level: stable, holdout precision" in run("rule", "TR816", check=0).stdout
    assert "# TR962 dataloader-exclusive-options" in run("rule", "TR721", check=0).stdout  # folded into TR962
    run("rule", "unsafe-torch-load", check=0)
    run("rule", "TR999", check=2)


def test_diff_reports_only_changed_lines(tmp_path):
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "train.py").write_text("import torch\nold = torch.symeig(a)\n")
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=tmp_path, check=True)
    (tmp_path / "train.py").write_text("import torch\nold = torch.symeig(a)\nnew = torch.symeig(b)\n")
    (tmp_path / "fresh.py").write_text("import torch\nx = torch.symeig(c)\n")  # untracked: all lines new
    data = json.loads(run("check", ".", "--diff", "HEAD", "--format", "json", cwd=tmp_path, check=1).stdout)
    assert sorted((f["path"], f["line"]) for f in data["findings"]) == [("fresh.py", 2), ("train.py", 3)]
    run("check", ".", "--diff", "no-such-ref", cwd=tmp_path, check=2)


def test_diff_reports_what_a_deletion_causes(tmp_path):
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", str(tmp_path)], check=True)
    loop = ("import torch\n\ndef train(model, loader, optimizer):\n    for x, y in loader:\n"
            "        optimizer.zero_grad()\n        model(x).sum().backward()\n        optimizer.step()\n")
    (tmp_path / "train.py").write_text(loop)
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=tmp_path, check=True)
    (tmp_path / "train.py").write_text(loop.replace("        optimizer.zero_grad()\n", ""))
    # TR101 is a preview rule: selected by its id it runs, and its finding does not fail the run
    data = json.loads(run("check", ".", "--diff", "HEAD", "--select", "TR101", "--format", "json", cwd=tmp_path,
                          check=0).stdout)
    assert [f["rule"] for f in data["findings"]] == ["TR101"]  # on the untouched step() line
    (tmp_path / ".torchreview.toml").write_text('filter = "added"\npreview = true\n')
    data = json.loads(run("check", ".", "--diff", "HEAD", "--format", "json", cwd=tmp_path, check=0).stdout)
    assert data["findings"] == []  # only changed lines: nothing was added


def test_example_shows_real_findings():
    root = Path(__file__).resolve().parents[1]
    # the stable TR816 in buggy_train.py fails the run; --preview shows the rest of the catalog
    data = json.loads(run("check", "examples", "--preview", "--format", "json", cwd=root, check=1).stdout)
    rules = {f["rule"] for f in data["findings"]}
    assert len(rules) >= 10, rules
    assert data["errors"] == []


SMALL = '''import torch.nn as nn


class Net(nn.Module):
    def __init__(self, in_features=16, hidden=HIDDEN, num_classes=4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.body(x)


class Broken(nn.Module):
    def __init__(self, in_features=16, num_classes=4):
        super().__init__()
        self.encoder = nn.Linear(in_features, 32)
        self.head = nn.Linear(32, num_classes)

    def forward(self, x):
        return self.head(self.encoder(x).detach())
'''


def test_smoke_cli_compares_against_a_base_revision(tmp_path):
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "models.py").write_text(SMALL.replace("HIDDEN", "32"))
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=tmp_path, check=True)
    (tmp_path / "models.py").write_text(SMALL.replace("HIDDEN", "64"))
    proc = run("smoke", "models.py:Net", "--base", "HEAD", "--format", "json", "--steps", "50", cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(proc.stdout)
    (target,) = data["targets"]
    assert target["status"] == "passed" and target["base"]["status"] == "passed"
    params = next(row for row in target["comparison"] if row["measure"] == "parameters")
    assert params["head"] > params["base"]  # hidden 32 -> 64

    proc = run("smoke", "models.py:Broken", "--format", "json", cwd=tmp_path, check=1)
    broken = json.loads(proc.stdout)["targets"][0]
    failed = {c["name"]: c["message"] for c in broken["head"]["checks"] if c["status"] == "fail"}
    assert "gradients" in failed and "encoder.weight" in failed["gradients"]
    run("smoke", "missing.py", cwd=tmp_path, check=2)


def test_version_and_help_without_arguments():
    from analyzers.output import tool_version

    proc = run("--version", check=0)
    assert proc.stdout.strip() == f"torchreview {tool_version()}"
    proc = run(check=2)
    assert proc.stderr.startswith("usage: torchreview") and "check" in proc.stderr and "smoke" in proc.stderr


def test_diff_outside_a_git_repository_is_one_line(tmp_path):
    (tmp_path / "train.py").write_text(BAD)
    proc = run("check", ".", "--diff", "HEAD", cwd=tmp_path, check=2)
    assert proc.stderr.splitlines() == [f"torchreview: error: --diff needs a git repository: {tmp_path} is not inside one"]
    assert proc.stdout == ""


def test_a_file_that_cannot_be_analyzed_fails_the_run(project):
    (project / "broken.py").write_text("import torch\ndef f(:\n    pass\n")
    proc = run("check", "clean.py", "broken.py", "--format", "json", cwd=project, check=1)
    assert json.loads(proc.stdout)["errors"] == [
        {"path": "broken.py", "kind": "syntax-error", "message": "line 2, column 7: invalid syntax"}]
    run("check", "clean.py", "broken.py", "--exit-zero-on-errors", cwd=project, check=0)
    (project / ".torchreview.toml").write_text("fail_on_errors = false\n")
    run("check", "clean.py", "broken.py", cwd=project, check=0)
    run("check", "train.py", "broken.py", cwd=project, check=1)  # findings still fail it


def test_every_config_problem_is_listed(project):
    (project / ".torchreview.toml").write_text('fail_on = "sometimes"\nselct = ["TR1"]\nmin_severity = 3\n')
    proc = run("check", ".", cwd=project, check=2)
    file = ".torchreview.toml"  # as found from the working directory
    assert proc.stderr.splitlines() == [
        f"torchreview: error: {file}:1: fail_on: unknown severity 'sometimes' (choose one of low, medium, "
        "high, critical)",
        f"torchreview: error: {file}:2: selct: unknown key 'selct' (known keys: " + KNOWN_KEYS + ")",
        f"torchreview: error: {file}:3: min_severity: unknown severity 3 (choose one of low, medium, high, "
        "critical)",
    ]


KNOWN_KEYS = ("cleanup, context_severity, diff_context_lines, exclude, fail_on, fail_on_errors, file_timeout, filter, group_across_files, "
              "group_rule_from_files, ignore, include, max_inline_comments, measured_severities, min_severity, paths, "
              "preview, review_event, rules, select, severity, skip, smoke")


def test_sarif_fingerprints_do_not_move_with_lines(project):
    def fingerprints():
        sarif = json.loads(run("check", "train.py", "--format", "sarif", cwd=project, check=1).stdout)
        return [(r["locations"][0]["physicalLocation"]["region"]["startLine"], r["partialFingerprints"])
                for r in sarif["runs"][0]["results"]]

    before = fingerprints()
    (project / "train.py").write_text("# a comment\n\n" + BAD)
    after = fingerprints()
    assert [line for line, _ in after] == [line + 2 for line, _ in before]
    assert [prints for _, prints in after] == [prints for _, prints in before]
    assert len({json.dumps(prints) for _, prints in after}) == 2


def test_smoke_names_what_is_missing(tmp_path):
    (tmp_path / "models.py").write_text(SMALL.replace("HIDDEN", "32"))
    proc = run("smoke", "models.py:NoSuchClass", cwd=tmp_path, check=2)
    assert proc.stderr.strip() == ("torchreview: error: models.py: no class or function 'NoSuchClass'; "
                                   "nn.Module classes in it: Net, Broken")
    proc = run("smoke", "nosuch.py", cwd=tmp_path, check=2)
    assert proc.stderr.strip() == "torchreview: error: nosuch.py: no such file"
