"""Version-dependent rules read the repository's pins and say which release they assumed (issue 26, item 3); a pin
that changes the verdict changes the finding."""
from __future__ import annotations

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
