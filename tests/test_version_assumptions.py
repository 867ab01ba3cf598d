"""Version-dependent rules read the repository's pins and say which release they assumed (issue 26, item 3); a pin
that changes the verdict changes the finding."""
from __future__ import annotations

import textwrap

from analyzers.engine import analyze_source
from analyzers.program.modules import index_for
from analyzers.rules import get_rule


def _findings(tmp_path, code: str, rule: str, pins: dict[str, str], script: str = "train.py"):
    (tmp_path / ".git").mkdir(parents=True, exist_ok=True)
    for name, text in pins.items():
        (tmp_path / name).write_text(text)
    path = tmp_path / script
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code)
    return analyze_source(code, str(path), rules=[get_rule(rule)], repository=index_for(path)).findings


SOLVE = "import torch\nX, LU = torch.solve(B, A)\n"
QR = "import torch\nq, r = torch.qr(A)\n"


def test_without_a_pin_the_message_says_it_assumed_a_current_torch():
    [finding] = analyze_source(QR, "train.py", rules=[get_rule("TR811")]).findings
    assert finding.message.endswith("(no torch pin found; assuming a current torch)")


def test_the_pin_is_named_and_changes_the_verdict(tmp_path):
    # torch.solve was removed in 1.13: on a repository that may run 1.13 or newer it raises (TR810) ...
    [removed] = _findings(tmp_path / "new", SOLVE, "TR810", {"requirements.txt": "torch>=1.10\n"})
    assert "has since been removed" in removed.message and removed.message.endswith(
        "(torch>=1.10 per requirements.txt)")
    # ... on one pinned below 1.13 it still runs: not TR810's, only deprecated (TR811), said with the pin
    assert _findings(tmp_path / "old", SOLVE, "TR810", {"requirements.txt": "torch==1.12.1\n"}) == []
    [deprecated] = _findings(tmp_path / "old", SOLVE, "TR811", {"requirements.txt": "torch==1.12.1\n"})
    assert deprecated.message.endswith("(torch==1.12.1 per requirements.txt)")
    # and below the release that deprecated it, nothing at all
    assert _findings(tmp_path / "older", QR, "TR811", {"requirements.txt": "torch<1.9\n"}) == []


def test_a_scaler_for_the_torch_the_repository_runs(tmp_path):
    code = ("import torch\nfor x, y in loader:\n    with torch.autocast('cuda'):\n        loss = criterion(model(x), y)\n"
            "    loss.backward()\n")
    [current] = _findings(tmp_path / "a", code, "TR710", {"pyproject.toml": '[project]\ndependencies = ["torch>=2.3"]\n'})
    assert '`torch.amp.GradScaler("cuda")` (torch>=2.3 per pyproject.toml' in current.message
    [old] = _findings(tmp_path / "b", code, "TR710", {"requirements.txt": "torch>=1.10,<2.0\n"})
    assert "`torch.cuda.amp.GradScaler()` (torch>=1.10,<2.0 per requirements.txt" in old.message


def test_code_in_a_legacy_folder_is_said_to_assume_an_old_release(tmp_path):
    code = ("import torch\nfor x, y in loader:\n    with torch.autocast('cuda'):\n        loss = criterion(model(x), y)\n"
            "    loss.backward()\n")
    [finding] = _findings(tmp_path, code, "TR710", {"requirements.txt": "torch>=2.4\n"}, script="legacy/train.py")
    assert "`torch.cuda.amp.GradScaler()` (code in a legacy folder; assuming an old torch" in finding.message


def test_every_rule_that_reads_pins_names_them_in_each_message():
    """A rule declares the library its verdict rests on (``pinned_package``); every finding of its examples
    ends with what it assumed about that library, once."""
    from analyzers.rules import all_rules

    pinned = [rule for rule in all_rules() if rule.pinned_package]
    assert {"TR812", "TR814", "TR817", "TR822"} <= {rule.id for rule in pinned}
    for rule in pinned:
        for example in rule.INVALID:
            if getattr(example, "requirements", None):
                continue  # examples with pins of their own name those (tested above)
            code = example.code if hasattr(example, "code") else example
            for finding in analyze_source(textwrap.dedent(code), "train.py", rules=[rule]).findings:
                assumed = f"no {rule.pinned_package} pin found; assuming a current {rule.pinned_package}"
                assert finding.message.count(assumed) == 1, (rule.id, finding.message)


def test_a_numpy_pin_below_the_alias_removal_silences_it_and_one_above_is_named(tmp_path):
    code = "import numpy as np\nimport torch\nmask = np.zeros(3, dtype=np.bool)\n"
    assert _findings(tmp_path / "old", code, "TR817", {"requirements.txt": "numpy<1.24\n"}) == []
    [finding] = _findings(tmp_path / "new", code, "TR817", {"requirements.txt": "numpy>=1.24\n"})
    assert finding.message.endswith("(numpy>=1.24 per requirements.txt)")


def test_a_removed_module_names_the_pin_of_its_own_package(tmp_path):
    # TR820 judges each import by its package's pins (here torchvision's, not torch's)
    code = "import torch\nfrom torchvision.transforms.functional_tensor import rgb_to_grayscale\n"
    findings = _findings(tmp_path, code, "TR820", {"requirements.txt": "torch>=2.0\ntorchvision>=0.17\n"})
    assert findings and all(f.message.endswith("(torchvision>=0.17 per requirements.txt)") for f in findings)


PYPROJECT = """
[project]
name = "demo"
dependencies = ["numpy>=1.20", "torch>=2.4"]

[project.optional-dependencies]
vision = ["torchvision>=0.19"]

[tool.hatch.envs.ci.scripts]
# how one CI job installs, not what the project supports
gpu = ["pip install torch==2.0.1+cu118 --index-url https://download.pytorch.org/whl/cu118"]
"""


def test_pyproject_pins_are_its_declared_requirements_not_every_line_naming_a_package(tmp_path):
    from analyzers.program.versions import _pyproject_requirements

    assert _pyproject_requirements(PYPROJECT).splitlines() == ["numpy>=1.20", "torch>=2.4", "torchvision>=0.19"]
    # the CI script's torch==2.0.1 would cap torch below 2.4 and silence the deprecation: it is not read
    code = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
    [finding] = _findings(tmp_path, code, "TR801", {"pyproject.toml": PYPROJECT})
    assert finding.message.endswith("(torch>=2.4 per pyproject.toml)") and finding.fix is not None
    # an unreadable pyproject.toml pins nothing
    assert _pyproject_requirements("[project\ndependencies = [") == ""


def test_poetry_versions_read_as_pins():
    from analyzers.program.versions import _pyproject_requirements

    poetry = ('[tool.poetry.dependencies]\npython = "^3.10"\ntorch = "^2.1"\nnumpy = {version = "1.26.4"}\n'
              '[tool.poetry.group.dev.dependencies]\nscipy = ">=1.10,<2"\n')
    assert _pyproject_requirements(poetry).splitlines() == ["python >=3.10", "torch >=2.1", "numpy ==1.26.4",
                                                            "scipy >=1.10,<2"]
