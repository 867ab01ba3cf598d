"""bench/torchfix_fixtures.py on a small fixture tree laid out as TorchFix's (written here, in our words)."""
from __future__ import annotations

import json

import pytest

from bench.torchfix_fixtures import main


def test_reports_flagged_lines_and_fixes(tmp_path, capsys):
    checker = tmp_path / "security" / "checker"
    checker.mkdir(parents=True)
    (checker / "loads.py").write_text("import torch\nstate = torch.load('a.pt')\nother = torch.zeros(2)\n"
                                      "x = torch.ones(3)\nx.zero_grad(set_to_none=False)\n")
    (checker / "loads.txt").write_text("2:9 TOR102 `torch.load` without `weights_only`\n"
                                       "5:1 TOR402 gradient set to zero\n")
    codemod = tmp_path / "misc" / "codemod"
    codemod.mkdir(parents=True)
    (codemod / "typo.in.py").write_text("import torch\nw = torch.zeros(2)\nw.require_grad = True\n")
    (codemod / "typo.out.py").write_text("import torch\nw = torch.zeros(2)\nw.requires_grad = True\n")
    (codemod / "ranges.in.py").write_text("import torch\nr = torch.range(0, 4)\n")
    (codemod / "ranges.out.py").write_text("import torch\nr = torch.arange(0, 5)\n")
    assert main(["--fixtures", str(tmp_path), "--json", str(tmp_path / "rows.json")]) == 0
    out = capsys.readouterr().out
    default, torchfix = out.split("our default scope")[1].split("every TorchFix code selected")
    # TOR402's rule runs only when its code is selected
    assert "flag through the map: 1/2 = 50.0 %" in default and "TOR402 security/checker/loads.py:5" in default
    assert "flag through the map: 2/2 = 100.0 %" in torchfix and "loads.py:5" not in torchfix.split("fix differs")[0]
    assert "make the same: 1/2 = 50.0 %" in default and "misc/codemod/ranges.in.py:2" in out
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [(r["code"], r["default"], r["torchfix"]) for r in rows["flags"]] == \
        [("TOR102", ["TR601"], ["TR601"]), ("TOR402", [], ["TR729"])]


def test_rejects_a_directory_without_fixtures(tmp_path):
    with pytest.raises(SystemExit):
        main(["--fixtures", str(tmp_path)])
    (tmp_path / "x" / "checker").mkdir(parents=True)
    (tmp_path / "x" / "checker" / "a.py").write_text("import torch\n")
    (tmp_path / "x" / "checker" / "a.txt").write_text("not what TorchFix writes\n")
    with pytest.raises(SystemExit, match="unexpected line"):
        main(["--fixtures", str(tmp_path)])


def test_a_fix_counts_as_the_same_only_where_torchfix_makes_it(tmp_path, capsys):
    # TorchFix's replacement text already stands two lines up; ours (which keeps torch.range's float dtype)
    # differs at the line TorchFix changes, so the change is not ours even though its text is in our output
    checker = tmp_path / "misc" / "checker"
    checker.mkdir(parents=True)
    (checker / "none.py").write_text("import torch\n")
    (checker / "none.txt").write_text("")
    codemod = tmp_path / "misc" / "codemod"
    codemod.mkdir(parents=True)
    (codemod / "again.in.py").write_text("import torch\nr = torch.arange(0, 5)\nprint(r)\nr = torch.range(0, 4)\n")
    (codemod / "again.out.py").write_text("import torch\nr = torch.arange(0, 5)\nprint(r)\nr = torch.arange(0, 5)\n")
    assert main(["--fixtures", str(tmp_path), "--json", str(tmp_path / "rows.json")]) == 0
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert rows["fixes"] == [{"fixture": "misc/codemod/again.in.py", "line": 4, "wanted": ["r = torch.arange(0, 5)"],
                              "default": False, "torchfix": False}]
