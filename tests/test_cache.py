"""The results cache: a warm run reuses results, and anything a result was computed from invalidates it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from analyzers.cache import CACHE_DIRNAME, DirectoryStore, ResultCache
from analyzers.config import Config
from analyzers.engine import analyze_paths
from analyzers.model import Severity

# the whole catalog at each rule's own severity: these tests are about the cache, and use preview rules as subjects
EVERY_RULE = Config(preview=True, measured_severities=False)

MODEL_SOFTMAX = """import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 3)

    def forward(self, x):
        return torch.softmax(self.fc(x), dim=-1)
"""
MODEL_LOGITS = MODEL_SOFTMAX.replace("torch.softmax(self.fc(x), dim=-1)", "self.fc(x)")
TRAIN = """import torch
from torch import nn
from model import Net

model = Net()
criterion = nn.CrossEntropyLoss()
x = torch.randn(4, 10)
y = torch.randint(0, 3, (4,))
loss = criterion(model(x), y)
"""


@pytest.fixture
def repo(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)  # display paths relative to the repository, as the CLI shows them
    return tmp_path


def run(cache, config=None, jobs=1):
    result = analyze_paths(["."], config or EVERY_RULE, jobs=jobs, cache=cache)
    return result, sorted((f.path, f.rule) for f in result.findings)


def fresh_cache(root: Path) -> ResultCache:
    return ResultCache.in_directory(root / CACHE_DIRNAME)


def test_warm_run_reuses_every_result_and_reports_the_same(repo):
    (repo / "model.py").write_text(MODEL_SOFTMAX)
    (repo / "train.py").write_text(TRAIN)
    (repo / "load.py").write_text("import torch\nstate = torch.load(path)\n")
    # the model and its loss in one file: the finding names forward's softmax as its other site
    (repo / "single.py").write_text(MODEL_SOFTMAX + "\n\n" + TRAIN.replace("from model import Net\n", ""))
    cold, cold_findings = run(fresh_cache(repo))
    assert cold.cached == 0 and ("train.py", "TR401") in cold_findings
    assert any(f.related for f in cold.findings if f.path.endswith("single.py"))
    warm, warm_findings = run(fresh_cache(repo))  # a new process would start like this: nothing in memory
    assert warm.cached == 4
    assert [f.to_dict() for f in warm.findings] == [f.to_dict() for f in cold.findings]  # related sites too
    assert (repo / CACHE_DIRNAME / ".gitignore").read_text().splitlines()[-1] == "*"


def test_changing_the_model_file_invalidates_the_script_that_uses_it(repo):
    (repo / "model.py").write_text(MODEL_SOFTMAX)
    (repo / "train.py").write_text(TRAIN)
    _, findings = run(fresh_cache(repo))
    assert findings == [("train.py", "TR401")]
    (repo / "model.py").write_text(MODEL_LOGITS)  # train.py itself is unchanged
    warm, findings = run(fresh_cache(repo))
    assert findings == [] and warm.cached == 0
    (repo / "model.py").write_text(MODEL_SOFTMAX)
    _, findings = run(fresh_cache(repo))
    assert findings == [("train.py", "TR401")]


def test_a_module_file_that_appears_invalidates_the_importer(repo):
    (repo / "train.py").write_text(TRAIN)  # model.py does not exist yet: Net is unknown
    _, findings = run(fresh_cache(repo))
    assert findings == []
    (repo / "model.py").write_text(MODEL_SOFTMAX)
    warm, findings = run(fresh_cache(repo))
    assert findings == [("train.py", "TR401")]
    assert warm.cached == 0


def test_a_new_sibling_script_invalidates_what_depended_on_the_folder(repo):
    (repo / "evaluate.py").write_text('import torch\n\nstate = torch.load("best.pt")\n')
    _, findings = run(fresh_cache(repo))
    assert findings == [("evaluate.py", "TR601")]
    # a sibling that writes best.pt itself: the checkpoint is the project's own
    (repo / "train.py").write_text('import torch\nfrom torch import nn\n\nmodel = nn.Linear(2, 2)\n'
                                   'torch.save(model.state_dict(), "best.pt")\n')
    warm, findings = run(fresh_cache(repo))
    assert findings == [] and warm.cached == 0


def test_analysis_settings_are_in_the_key_and_exit_settings_are_not(repo):
    (repo / "load.py").write_text("import torch\nstate = torch.load(path)\nx = torch.load(p, weights_only=False)\n")
    base, findings = run(fresh_cache(repo))
    assert findings
    fewer, _ = run(fresh_cache(repo), replace(EVERY_RULE, ignore=("TR601",)))
    assert fewer.cached == 0
    higher, _ = run(fresh_cache(repo), replace(EVERY_RULE, min_severity=Severity.CRITICAL))
    assert higher.cached == 0
    exit_only, again = run(fresh_cache(repo), replace(EVERY_RULE, fail_on=Severity.LOW, max_inline_comments=3))
    assert exit_only.cached == 1 and again == findings


def test_parallel_jobs_share_the_cache(repo):
    for i in range(6):
        (repo / f"m{i}.py").write_text(f"import torch\nx{i} = torch.load('a{i}')\n")
    cold, cold_findings = run(fresh_cache(repo), jobs=2)
    warm, warm_findings = run(fresh_cache(repo), jobs=2)
    assert cold.cached == 0 and warm.cached == 6 and warm_findings == cold_findings
    entries = [p for p in (repo / CACHE_DIRNAME).rglob("*") if p.is_file() and p.name != ".gitignore"]
    assert len(entries) == 6 and not [p for p in entries if p.name.startswith(".tmp-")]


def test_a_damaged_entry_is_a_miss_and_is_rewritten(repo):
    (repo / "load.py").write_text("import torch\nstate = torch.load(path)\n")
    _, findings = run(fresh_cache(repo))
    [entry] = [p for p in (repo / CACHE_DIRNAME).rglob("*") if p.is_file() and p.name != ".gitignore"]
    entry.write_text('{"deps": ')
    warm, again = run(fresh_cache(repo))
    assert warm.cached == 0 and again == findings
    json.loads(entry.read_text())  # whole again


def test_an_edited_file_is_analyzed_again(repo):
    (repo / "load.py").write_text("import torch\nstate = torch.load(path)\n")
    _, findings = run(fresh_cache(repo))
    assert findings == [("load.py", "TR601")]
    (repo / "load.py").write_text("import torch\nstate = torch.load(path, weights_only=True)\n")
    warm, findings = run(fresh_cache(repo))
    assert warm.cached == 0 and findings == []


def test_directory_store_round_trip(tmp_path):
    store = DirectoryStore(tmp_path / "c")
    assert store.get("ab12") is None
    store.put("ab12", b"one")
    store.put("ab12", b"two")  # replaced whole
    assert store.get("ab12") == b"two"


# ---- the CLI ---------------------------------------------------------------------------------------


def cli(*args, cwd):
    exe = Path(sys.executable).with_name("torchreview")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "bot.cli"]
    return subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(Path(__file__).parents[1])})


# a stable rule's high finding (TR816), so the default run fails on it
STABLE_HIGH = "import torch\n\nloss = torch.nn.functional.mse_loss(a, b)\ntotal = loss.data[0]\n"


def test_cli_caches_at_the_repository_root_and_clean_deletes_it(repo):
    (repo / "pkg").mkdir()
    (repo / "pkg" / "load.py").write_text(STABLE_HIGH)
    first = cli("check", "load.py", "--format", "json", cwd=repo / "pkg")
    assert first.returncode == 1, first.stderr
    assert (repo / CACHE_DIRNAME / "v1").is_dir() and not (repo / "pkg" / CACHE_DIRNAME).exists()
    second = cli("check", "load.py", "--format", "json", cwd=repo / "pkg")
    assert json.loads(second.stdout)["findings"] == json.loads(first.stdout)["findings"]
    text = cli("check", "load.py", cwd=repo / "pkg")
    assert "in 1 file (1 from the cache)" in text.stdout.splitlines()[-1]
    cleaned = cli("clean", cwd=repo / "pkg")
    assert cleaned.returncode == 0 and not (repo / CACHE_DIRNAME).exists()


def test_cli_no_cache_writes_nothing(repo):
    (repo / "load.py").write_text(STABLE_HIGH)
    proc = cli("check", ".", "--no-cache", cwd=repo)
    assert proc.returncode == 1 and "TR816" in proc.stdout
    assert not (repo / CACHE_DIRNAME).exists()


def test_cli_clean_refuses_a_folder_that_is_not_a_cache(repo):
    (repo / "precious").mkdir()
    (repo / "precious" / "data.txt").write_text("keep me")
    proc = cli("clean", "--cache-dir", "precious", cwd=repo)
    assert proc.returncode == 2 and (repo / "precious" / "data.txt").exists()


def test_a_dependency_analyzed_first_from_its_decoded_text_still_hits(repo):
    # a.py (BOM, CRLF) is analyzed first, and summarized from its decoded text then; b.py's dependency
    # on it must still be recorded as the file's bytes, or every warm run would miss b.py
    head = ("\n\nclass Head(nn.Module):\n    def forward(self, x):\n"
            "        return torch.softmax(x, dim=-1)\n")
    (repo / "a.py").write_bytes(b"\xef\xbb\xbf" + (TRAIN + head).replace("\n", "\r\n").encode())
    (repo / "model.py").write_text(MODEL_SOFTMAX)
    (repo / "b.py").write_text("import torch\nfrom torch import nn\nfrom a import Head\n\n"
                               "criterion = nn.CrossEntropyLoss()\n"
                               "loss = criterion(Head()(torch.randn(2, 3)), torch.tensor([0, 1]))\n")
    _, findings = run(fresh_cache(repo))
    assert findings == [("a.py", "TR401"), ("b.py", "TR401")]
    warm, again = run(fresh_cache(repo))
    assert warm.cached == 3 and again == findings
