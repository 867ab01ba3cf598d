"""The GitHub Action: bot/action.py against a scratch repository and a real pull_request payload, and
action.yml's own steps run as the runner runs them (the install step needs the package index)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

from github_emulator.contract import require
from tests.test_precommit import _git, snapshot_of_checkout

ROOT = Path(__file__).resolve().parents[1]

# TR810 (removed API, a stable rule at high) is the finding that fails; TR803 (eval.py's Variable) is a preview
# rule the repository opts into (PREVIEW_CONFIG), low, never failing
BASE_TRAIN = "import torch\n\nold = torch.symeig(a)\n\n\ndef train(model):\n    return model\n"
HEAD_TRAIN = BASE_TRAIN + "\n\ndef resume(path):\n    return torch.symeig(path)\n"
PREVIEW_CONFIG = "preview = true\n"
NEW_FILE = "import torch\nfrom torch.autograd import Variable\nx = Variable(torch.ones(2))\n"


@pytest.fixture
def pull_request(tmp_path):
    """A repository whose HEAD is a PR: train.py gains an unsafe load (one was there before), eval.py is new."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git("init", "-q", "-b", "main", cwd=repo)
    (repo / "train.py").write_text(BASE_TRAIN)
    (repo / "untouched.py").write_text("import torch\nstate = torch.symeig(x)\n")
    (repo / ".torchreview.toml").write_text(PREVIEW_CONFIG)
    (repo / "README.md").write_text("hello\n")
    _git("add", "-A", cwd=repo)
    _git("commit", "-q", "-m", "base", cwd=repo)
    base = _git("rev-parse", "HEAD", cwd=repo)
    (repo / "train.py").write_text(HEAD_TRAIN)
    (repo / "eval.py").write_text(NEW_FILE)
    (repo / "README.md").write_text("hello again\n")
    _git("add", "-A", cwd=repo)
    _git("commit", "-q", "-m", "head", cwd=repo)
    head = _git("rev-parse", "HEAD", cwd=repo)
    payload = json.loads(require("webhooks/pull_request.opened.json").read_text())
    payload["pull_request"]["base"]["sha"], payload["pull_request"]["head"]["sha"] = base, head
    event = tmp_path / "event.json"
    event.write_text(json.dumps(payload))
    github = {"GITHUB_EVENT_NAME": "pull_request", "GITHUB_EVENT_PATH": str(event), "GITHUB_WORKSPACE": str(repo),
              "GITHUB_OUTPUT": str(tmp_path / "output"), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary")}
    return repo, base, github


def _outputs(github) -> dict:
    return dict(line.split("=", 1) for line in Path(github["GITHUB_OUTPUT"]).read_text().splitlines())


def run_action(repo, github, **inputs):
    env = {**os.environ, **github, "NO_COLOR": "1", **{f"INPUT_{k.upper()}": v for k, v in inputs.items()}}
    return subprocess.run([sys.executable, "-c", "import sys; from bot.action import main; sys.exit(main())"],
                          cwd=repo, env=env, capture_output=True, text=True)


def test_pull_request_reports_changed_lines_only(pull_request):
    repo, base, github = pull_request
    proc = run_action(repo, github, sarif_file="out/results.sarif")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a HIGH finding, the default fail_on
    annotations = [line for line in proc.stdout.splitlines() if line.startswith("::")]
    # the load the PR adds (line 11), the Variable of the new file; not the old load, not untouched.py
    assert [re.match(r"::(\w+) file=([^,]+),line=(\d+)", a).groups() for a in annotations] == [
        ("notice", "eval.py", "3"), ("error", "train.py", "11")]
    sarif = json.loads((repo / "out/results.sarif").read_text())
    results = sarif["runs"][0]["results"]
    assert sorted((r["ruleId"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]) for r in results) == [
        ("TR803", "eval.py"), ("TR810", "train.py")]
    assert _outputs(github) == {"sarif-file": "out/results.sarif", "findings": "2", "base": base}
    assert "2 findings in 2 changed files" in Path(github["GITHUB_STEP_SUMMARY"]).read_text()


def test_a_checkpoint_the_pull_request_adds_is_scanned(pull_request):
    repo, _, github = pull_request
    # a pickle whose loading calls os.system (posix.system), written as its opcodes: GLOBAL, args, REDUCE
    (repo / "weights.pkl").write_bytes(b"\x80\x02cposix\nsystem\nX\x02\x00\x00\x00id\x85R.")
    _git("add", "-A", cwd=repo)
    _git("commit", "-q", "-m", "weights", cwd=repo)
    proc = run_action(repo, github)
    assert "::error file=weights.pkl,line=1" in proc.stdout and "TR620" in proc.stdout, proc.stdout + proc.stderr


def test_fail_on_decides_the_exit_status(pull_request):
    repo, _, github = pull_request
    assert run_action(repo, github, fail_on="critical").returncode == 0
    assert run_action(repo, github, fail_on="low").returncode == 1
    never = run_action(repo, github, fail_on="never")
    assert never.returncode == 0 and "::error file=train.py" in never.stdout  # reported, not failing
    bad = run_action(repo, github, fail_on="sometimes")
    assert bad.returncode == 2 and "::error title=torchreview::fail-on" in bad.stdout


def test_no_python_changes_writes_an_empty_sarif(pull_request):
    repo, _, github = pull_request
    head = _git("rev-parse", "HEAD", cwd=repo)
    proc = run_action(repo, github, base=head)  # nothing changed since the head itself
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sarif = json.loads((repo / "torchreview.sarif").read_text())
    assert sarif["version"] == "2.1.0" and sarif["runs"][0]["results"] == []
    assert _outputs(github)["findings"] == "0"


def test_push_without_a_previous_head_checks_every_file(pull_request):
    repo, _, github = pull_request
    Path(github["GITHUB_EVENT_PATH"]).write_text(json.dumps({"before": "0" * 40, "after": "x"}))
    proc = run_action(repo, {**github, "GITHUB_EVENT_NAME": "push"}, fail_on="never")
    files = {re.search(r"file=([^,]+)", line).group(1) for line in proc.stdout.splitlines() if line.startswith("::")}
    assert files == {"train.py", "untouched.py", "eval.py"}
    assert _outputs(github)["base"] == ""


def test_missing_base_commit_is_fetched_from_origin(pull_request, tmp_path):
    # actions/checkout fetches only the head: a shallow clone lacks the base until the action fetches it
    repo, base, github = pull_request
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth=1", f"file://{repo}", str(clone)], check=True)
    assert subprocess.run(["git", "cat-file", "-e", f"{base}^{{commit}}"], cwd=clone).returncode != 0
    proc = run_action(clone, github)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "::error file=train.py,line=11" in proc.stdout and _outputs(github)["findings"] == "2"


def _expand(text: str, values: dict) -> str:
    def one(match):
        key = match.group(1).strip()
        if key not in values:
            raise AssertionError(f"action.yml uses ${{{{ {key} }}}}, which this test does not provide")
        return values[key]
    return re.sub(r"\$\{\{\s*([^}]+?)\s*\}\}", one, text)


@pytest.mark.packaging
def test_action_yml_steps_install_and_run(pull_request, tmp_path):
    """Run action.yml's shell steps as the runner does: the action's directory pip-installed (a
    snapshot commit of this checkout, as `uses: owner/torchreview@ref` checks it out), then the check."""
    repo, base, github = pull_request
    action_path = tmp_path / "action"
    action_path.mkdir()
    snapshot_of_checkout(action_path)
    action = yaml.safe_load((action_path / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    python = tmp_path / "python"  # stands in for the runner's python (actions/setup-python is not run here)
    venv.EnvBuilder(with_pip=True).create(python)
    inputs = {name: spec.get("default", "") for name, spec in action["inputs"].items()}
    inputs.update({"fail-on": "critical", "sarif-file": "checks/torchreview.sarif"})
    values = {"github.action_path": str(action_path), **{f"inputs.{k}": v for k, v in inputs.items()}}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(github, PATH=f"{python / 'bin'}{os.pathsep}{env['PATH']}")
    ran, used = [], []
    for number, step in enumerate(action["runs"]["steps"]):
        if "uses" in step:  # the runner's own actions, not run here; what they are given is checked below
            given = {k: _expand(str(v), values) for k, v in step.get("with", {}).items()}
            used.append((step["uses"].split("@")[0], given))
            continue
        assert step["shell"] == "bash"
        # as the runner does: each step appends to an output file of its own, read back as steps.ID.outputs
        github_output = tmp_path / f"output-{number}"
        github_output.touch()
        step_env = {**env, **{k: _expand(str(v), values) for k, v in step.get("env", {}).items()},
                    "GITHUB_OUTPUT": str(github_output)}
        proc = subprocess.run(["bash", "-e", "-c", _expand(step["run"], values)], cwd=repo, env=step_env,
                              capture_output=True, text=True, timeout=900)
        step_outputs = dict(line.split("=", 1) for line in github_output.read_text().splitlines())
        values.update({f"steps.{step['id']}.outputs.{k}": v for k, v in step_outputs.items()} if "id" in step else {})
        ran.append((step.get("name"), proc, step_outputs))
    (_, cache, cached), (_, install, _), (_, check, outputs) = ran
    assert [name for name, _ in used] == ["actions/setup-python", "actions/cache"]
    # pip's cache is restored and saved by actions/cache, keyed on the action's pyproject.toml
    assert cache.returncode == 0, cache.stderr
    assert used[1][1] == {"path": cached["dir"], "key": cached["key"]} and cached["dir"]
    assert re.fullmatch(r"torchreview-pip-Linux-3\.\d+\.\d+-[0-9a-f]{16}", cached["key"]), cached
    assert install.returncode == 0, install.stdout + install.stderr
    # the base install only: none of the App's server stack, no torch
    listed = subprocess.run([str(python / "bin" / "python"), "-m", "pip", "list", "--format", "json"], env=env,
                            capture_output=True, text=True, check=True)
    names = {re.sub(r"[-_.]+", "-", p["name"]).lower() for p in json.loads(listed.stdout)}
    assert "torchreview" in names and not names & {"flask", "celery", "gunicorn", "sqlalchemy", "pygithub", "torch"}
    # fail-on: critical reached the check: the HIGH finding the PR adds is reported, not failing
    assert check.returncode == 0, check.stdout + check.stderr
    assert "::error file=train.py,line=11" in check.stdout
    assert json.loads((repo / "checks/torchreview.sarif").read_text())["runs"][0]["results"]
    assert outputs["base"] == base and outputs["findings"] == "2"
    assert {o: _expand(spec["value"], {f"steps.check.outputs.{k}": v for k, v in outputs.items()})
            for o, spec in action["outputs"].items()} == outputs
    # the installed script, not this checkout: the check ran the torchreview pip put into the runner's python
    assert (python / "bin" / "torchreview-action").exists()


def test_a_file_whose_analysis_stalls_is_cut_off_and_the_rest_is_reported(pull_request):
    """A rule caught in a loop (tests/fixtures/stalling_rule) costs the Action one file, never the job's hours."""
    from tests.test_bounded_analysis import STALL, stalling_env

    repo, base, github = pull_request
    (repo / "slow.py").write_text(STALL)
    (repo / ".torchreview.toml").write_text(PREVIEW_CONFIG + "file_timeout = 2\n")
    _git("add", "-A", cwd=repo)
    _git("commit", "-q", "-m", "a file the analysis stalls on", cwd=repo)
    proc = subprocess.run([sys.executable, "-c", "import sys; from bot.action import main; sys.exit(main())"],
                          cwd=repo, env=stalling_env(**github, INPUT_SARIF_FILE="out.sarif"), capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the file could not be analyzed, and train.py's HIGH
    assert "::warning file=slow.py,title=torchreview timeout::analysis took over 2 s; stopped" in proc.stdout
    assert "::error file=train.py,line=11" in proc.stdout
    notes = json.loads((repo / "out.sarif").read_text())["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert [n["message"]["text"] for n in notes] == ["slow.py: timeout: analysis took over 2 s; stopped"]
