"""bench/realbugs.py: the pairs file, and a buggy/fixed pair in a real git repository replayed both ways."""
from __future__ import annotations

import subprocess
from dataclasses import replace
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import realbugs  # noqa: E402

FIXED = """\
import torch
from torch import nn

model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    optimizer.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    optimizer.step()
"""
BUGGY = FIXED.replace("    optimizer.zero_grad()\n", "")
HEADER = "\t".join(realbugs.COLUMNS) + "\n"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def history(tmp_path):
    """A mirror directory holding me+demo.git, whose history fixes a missing zero_grad()."""
    work = tmp_path / "work"
    work.mkdir()
    _git(work, "init", "-q")
    (work / "train.py").write_text(BUGGY)
    _git(work, "add", ".")
    _git(work, "commit", "-qm", "train")
    buggy = _git(work, "rev-parse", "HEAD")
    (work / "train.py").write_text(FIXED)
    _git(work, "commit", "-qam", "fix: zero the gradients")
    fixed = _git(work, "rev-parse", "HEAD")
    mirrors = tmp_path / "mirrors"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(mirrors / "me+demo.git")], check=True)
    return mirrors, buggy, fixed


def _pairs(tmp_path: Path, *rows: str) -> Path:
    path = tmp_path / "pairs.tsv"
    path.write_text(HEADER + "".join(row + "\n" for row in rows))
    return path


def test_a_missing_zero_grad_is_caught_on_the_pr_that_introduces_it_and_the_fix_draws_nothing(tmp_path, history,
                                                                                             capsys):
    mirrors, buggy, fixed = history
    caught = f"zg\tme/demo\t{fixed}\t{buggy}\ttrain.py\t6-9\tmissing zero_grad\tTR101\ttest"
    wrong_rule = f"zg-other\tme/demo\t{fixed}\t{buggy}\ttrain.py\t6-9\tmissing zero_grad\tTR201\ttest"
    wrong_place = f"zg-far\tme/demo\t{fixed}\t{buggy}\ttrain.py\t1-2\tmissing zero_grad\tTR101\ttest"
    scope = f"zg-oos\tme/demo\t{fixed}\t{buggy}\ttrain.py\t6-9\tmissing zero_grad\tout-of-scope\ttest"
    json_out = tmp_path / "out.json"
    code = realbugs.main(["--pairs", str(_pairs(tmp_path, caught, wrong_rule, wrong_place, scope)),
                          "--mirrors", str(mirrors), "--json", str(json_out)])
    out = capsys.readouterr().out
    assert code == 0
    import json

    results = {r["id"]: r for r in json.loads(json_out.read_text())}
    assert results["zg"]["caught"] and results["zg"]["introducing_other"] == []
    assert results["zg"]["fixing"] == []  # adding zero_grad() draws no finding
    assert not results["zg-other"]["caught"] and results["zg-other"]["introducing_other"] == ["train.py:9 TR101"]
    assert not results["zg-far"]["caught"]
    assert not results["zg-oos"]["caught"]
    assert "caught 1 / in scope 3 / all 4" in out


def test_a_pair_whose_commit_no_mirror_has_is_reported_not_replayed(tmp_path, history, capsys):
    mirrors, buggy, _ = history
    row = f"gone\tme/demo\t{'1' * 40}\t{buggy}\ttrain.py\t6\tmissing zero_grad\tTR101\ttest"
    assert realbugs.main(["--pairs", str(_pairs(tmp_path, row)), "--mirrors", str(mirrors)]) == 1
    assert "not replayed (1): gone (no mirror has the commit)" in capsys.readouterr().out


@pytest.mark.parametrize("row, message", [
    ("a\to/r\tnot-a-sha\t" + "1" * 40 + "\tt.py\t3\tk\tTR101\tn", "40-digit commits"),
    ("a\to/r\t" + "1" * 40 + "\t" + "2" * 40 + "\tt.py\tthree\tk\tTR101\tn", "is not N, N-M"),
    ("a\to/r\t" + "1" * 40 + "\t" + "2" * 40 + "\tt.py\t3\tk\tzero-grad\tn", "neither a rule id"),
    ("a\to/r", "expected the columns"),
])
def test_pairs_file_errors_name_the_line(tmp_path, row, message):
    with pytest.raises(realbugs.PairError, match=message):
        realbugs.read_pairs(_pairs(tmp_path, row))


def test_notebook_lines_carry_their_cell(tmp_path):
    row = "nb\to/r\t" + "1" * 40 + "\t" + "2" * 40 + "\tn.ipynb\t4:2-5\tk\tTR202\tn"
    (pair,) = realbugs.read_pairs(_pairs(tmp_path, row))
    assert (pair.cell, pair.first, pair.last, pair.in_scope) == (4, 2, 5, True)


def test_a_finding_counts_at_the_bug_when_one_of_its_related_sites_is_there():
    from analyzers.model import Finding, Location, Severity
    pair = realbugs.Pair("p", "me/demo", "f" * 40, "b" * 40, "net.py", None, 10, 10, "kind", "TR401")
    far = Finding(rule="TR401", path="net.py", line=40, column=1, end_line=40, end_column=9, message="m",
                  severity=Severity.HIGH, slug="s", category="numerics")
    assert not realbugs._hits(pair, far)
    assert realbugs._hits(pair, replace(far, related=(Location(11, 5, 11, 20, "softmax here"),)))
    assert not realbugs._hits(pair, replace(far, rule="TR402", related=(Location(11, 5, 11, 20, "softmax here"),)))
