"""The review mode adds no noise of its own (`torchreview check --diff REF`): errors of files the change did not
touch never fail it, a finding is new only when the file at REF, analyzed in the tree at REF (its other files and
pins), did not have it, and a coding cookie naming a codec we lack is read as UTF-8 with a note."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from analyzers.engine import analyze_paths, decode_source

from tests.test_cli import run

GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
# TR413 depends on the pins: on torch 1.6 ``/`` of an integer count raises; from 1.7 it divides truly
RATIO = "import torch as T\nacc = T.sum(preds == labels) / labels.size(0)\n"


def commit(root: Path, files: dict[str, str], message: str = "change") -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    subprocess.run([*GIT, "add", "."], cwd=root, check=True)
    subprocess.run([*GIT, "commit", "-qm", message], cwd=root, check=True)


def repository(root: Path, files: dict[str, str]) -> Path:
    subprocess.run([*GIT, "init", "-q", str(root)], check=True)
    commit(root, files, "base")
    return root


# The rules these tests use (TR413, TR402, TR601) are preview rules: they run with --preview and their findings
# never fail a run (tests/test_levels.py), so the exit codes below are about file errors only.
def check_diff(root: Path, *args: str, check: int) -> tuple[dict, str]:
    proc = run("check", ".", "--diff", "HEAD", "--format", "json", "--fail-on", "medium", "--preview", *args, cwd=root,
               check=check)
    return json.loads(proc.stdout), proc.stderr


def test_unchanged_files_errors_neither_listed_nor_failing(tmp_path):
    root = repository(tmp_path, {"model.py": "import torch\ndef broken(:\n",  # a syntax error, already at the base
                                 "train.py": "import torch\nfrom model import broken\n"})
    (root / "train.py").write_text("import torch\nfrom model import broken\nx = torch.zeros(3)\n")
    data, stderr = check_diff(root, check=0)
    assert data["errors"] == [] and data["findings"] == []
    assert "1 file not changed since HEAD could not be fully analyzed; not reported" in stderr
    # without --diff the broken file is the run's business: listed, and the run fails
    data = json.loads(run("check", ".", "--format", "json", cwd=root, check=1).stdout)
    assert [(e["path"], e["kind"]) for e in data["errors"]] == [("model.py", "syntax-error")]
    # a changed file's own syntax error is the change's: listed, failing
    (root / "train.py").write_text("import torch\ndef f(:\n")
    data, _ = check_diff(root, check=1)
    assert [(e["path"], e["kind"]) for e in data["errors"]] == [("train.py", "syntax-error")]
    # --fix --diff: the same
    (root / "train.py").write_text("import torch\nx = torch.zeros(3)\n")
    proc = run("check", ".", "--diff", "HEAD", "--fix", "--format", "json", cwd=root, check=0)
    assert json.loads(proc.stdout)["errors"] == []


def test_a_pinned_finding_of_an_edited_file_is_not_new(tmp_path):
    root = repository(tmp_path, {"requirements.txt": "torch==1.6.0\n", "train.py": RATIO})
    data = json.loads(run("check", ".", "--format", "json", "--fail-on", "medium", "--preview", cwd=root,
                          check=0).stdout)
    assert [f["rule"] for f in data["findings"]] == ["TR413"]  # the pin makes it a finding
    (root / "train.py").write_text("# evaluation\n" + RATIO + "print(acc)\n")
    data, _ = check_diff(root, check=0)
    assert data["findings"] == []  # the base, with its pins, had it already


def test_a_finding_a_pin_change_causes_is_new(tmp_path):
    root = repository(tmp_path, {"requirements.txt": "torch>=1.8\n", "train.py": RATIO})
    run("check", ".", "--fail-on", "medium", "--preview", cwd=root, check=0)
    (root / "requirements.txt").write_text("torch==1.6.0\n")  # the change lowers the pin...
    (root / "train.py").write_text("# evaluation\n" + RATIO)  # ...and edits the file
    data, _ = check_diff(root, check=0)
    assert [(f["path"], f["rule"], f["line"]) for f in data["findings"]] == [("train.py", "TR413", 3)]


def test_the_base_is_read_in_its_own_tree_from_a_subfolder(tmp_path):
    root = repository(tmp_path, {"requirements.txt": "torch==1.6.0\n", "src/train.py": RATIO})
    (root / "src" / "train.py").write_text(RATIO + "print(acc)\n")
    proc = run("check", ".", "--diff", "HEAD", "--format", "json", "--fail-on", "medium", "--preview",
               cwd=root / "src", check=0)
    assert json.loads(proc.stdout)["findings"] == []
    # the working tree's pins are not the base's: a pin lowered in the working tree makes the finding new
    (root / "requirements.txt").write_text("torch>=2.0\n")
    commit(root, {}, "raise the pin")
    (root / "requirements.txt").write_text("torch==1.6.0\n")
    (root / "src" / "train.py").write_text(RATIO)
    proc = run("check", ".", "--diff", "HEAD", "--format", "json", "--fail-on", "medium", "--preview",
               cwd=root / "src", check=0)
    assert [f["rule"] for f in json.loads(proc.stdout)["findings"]] == ["TR413"]


def test_a_coding_cookie_naming_a_codec_we_lack_is_read_as_utf8(tmp_path):
    source = "# -*- coding: future_fstrings -*-\nimport torch\nname = 'café'\nstate = torch.load(f'{name}.pt')\n"
    text, note = decode_source(source.encode(), "train.py")
    assert text == source
    assert note.kind == "unknown-codec" and "'future_fstrings'" in note.message and "UTF-8" in note.message
    assert not note.unanalyzed
    # a known codec is still honoured, and bytes that are not UTF-8 under a codec we lack are still an error
    assert decode_source("# coding: latin-1\nx = 'é'\n".encode("latin-1"), "a.py") == ("# coding: latin-1\nx = 'é'\n", None)
    text, error = decode_source(b"# coding: future_fstrings\nx = '\xe9'\n", "a.py")
    assert text is None and error.kind == "decode-error"
    (tmp_path / ".git").mkdir()
    (tmp_path / "train.py").write_bytes(source.encode())
    from analyzers.config import Config

    run_result = analyze_paths([str(tmp_path / "train.py")], Config(preview=True))
    assert [f.rule for f in run_result.findings] == ["TR601"]  # analyzed
    assert [e.kind for e in run_result.errors] == ["unknown-codec"]
    # the CLI lists the note and does not fail for it (TR601 is below --fail-on critical here)
    proc = run("check", "train.py", "--fail-on", "critical", "--format", "json", "--preview", cwd=tmp_path)
    data = json.loads(proc.stdout)
    assert [e["kind"] for e in data["errors"]] == ["unknown-codec"] and data["findings"]


# TR402 depends on another file: the model whose forward ends in a sigmoid is in model.py
MODEL = ("import torch.nn as nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
         "        self.fc = nn.Linear(4, 1)\n        self.sig = nn.Sigmoid()\n\n    def forward(self, x):\n"
         "        return self.sig(self.fc(x))\n")
TRAIN = ("import torch.nn as nn\nfrom model import Net\n\nnet = Net()\ncriterion = nn.BCELoss()\nfor x, y in loader:\n"
         "    out = net(x)\n    loss = criterion(out.squeeze(), y)\n")


def test_a_finding_another_file_causes_is_new_only_when_the_change_makes_it(tmp_path):
    root = repository(tmp_path, {"model.py": MODEL, "train.py": TRAIN})
    (root / "train.py").write_text("# training\n" + TRAIN)  # edited, the finding as it was
    data, _ = check_diff(root, check=0)
    assert data["findings"] == []
    # the change adds the sigmoid in model.py: the finding in the edited train.py is the change's
    root = repository(tmp_path / "second", {"model.py": MODEL.replace("self.sig(self.fc(x))", "self.fc(x)"),
                                            "train.py": TRAIN})
    run("check", ".", "--fail-on", "medium", "--preview", cwd=root, check=0)
    (root / "model.py").write_text(MODEL)
    (root / "train.py").write_text("# training\n" + TRAIN)
    data, _ = check_diff(root, check=0)
    assert [(f["path"], f["rule"]) for f in data["findings"]] == [("train.py", "TR402")]


def test_the_results_cache_is_not_reused_when_the_pins_change(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(RATIO)
    (tmp_path / "requirements.txt").write_text("torch>=1.8\n")

    def rules() -> list[str]:
        proc = run("check", ".", "--format", "json", "--fail-on", "critical", "--preview", cwd=tmp_path, check=0)
        return [f["rule"] for f in json.loads(proc.stdout)["findings"]]

    assert rules() == [] and rules() == []  # the second run from the cache
    (tmp_path / "requirements.txt").write_text("torch==1.6.0\n")  # a pin file's contents
    assert rules() == ["TR413"]
    (tmp_path / "requirements.txt").unlink()  # removed
    assert rules() == []
    (tmp_path / "src" / "requirements-dev.txt").write_text("torch<1.7\n")  # added, nearer the file
    assert rules() == ["TR413"]


def test_the_base_tree_is_read_whatever_git_writes_after_the_end_of_the_archive(tmp_path, monkeypatch):
    """tarfile stops at the first end-of-archive block. When the last file ends in the last 1 KiB of git's
    10 KiB record, git's trailer fills a whole second record that tarfile never asks for; closing the pipe
    before git has written it killed git with SIGPIPE, and a good base looked like a failed ``git archive``
    (in the real-bug bench, 3 of 114 pairs, every run). A git that writes its last bytes late makes it sure."""
    import os
    import shutil

    from analyzers.diff import tree_at

    # pax header (1 KiB) + the file's header (512 B) + 16 blocks of it: the data ends at 9728 of 10240
    train = "x = 1\n" + "#" * 7990 + "\n"
    root = repository(tmp_path / "repo", {"train.py": train})
    archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=root, capture_output=True, check=True)
    assert len(archive.stdout) == 20480, "the trailer spills into a second record"
    real_git = shutil.which("git")
    late = tmp_path / "bin" / "git"
    late.parent.mkdir()
    late.write_text(f"""#!/bin/sh
if [ "$1" = archive ]; then
  "{real_git}" "$@" | head -c -512 || exit 1
  sleep 0.5
  head -c 512 /dev/zero
else
  exec "{real_git}" "$@"
fi
""")
    late.chmod(0o755)
    monkeypatch.setenv("PATH", f"{late.parent}:{os.environ['PATH']}")
    tree, prefix = tree_at("HEAD", tmp_path / "base", cwd=str(root))
    assert (tree / "train.py").read_text() == train and prefix == ""
