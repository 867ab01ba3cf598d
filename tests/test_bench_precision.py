"""bench/precision.py on a tiny synthetic dev set: matching, tallies, judgments and the printed tables."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TRAIN = """\
import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt")
args = parser.parse_args()

model = nn.Linear(4, 2)
model.load_state_dict(torch.load(args.ckpt))
torch.save(model.state_dict(), "best.pt")
model.load_state_dict(torch.load("init.pt"))


def predict(x):
    model.eval()
    return model(x)
"""
# findings: train.py:11 TR601, train.py:13 TR601, train.py:18 TR202, demo.ipynb cell 3 line 2 TR601

NOTEBOOK = {
    "cells": [
        {"cell_type": "markdown", "source": ["# a demo"]},
        {"cell_type": "code", "source": ["import sys\n", "import torch"]},
        {"cell_type": "code", "source": ["path = sys.argv[1]\n", "state = torch.load(path)"]},
    ],
    "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
}


def label(path, line, rule, verdict, cell=None):
    return {"repo": "acme/toy", "commit": "0" * 40, "path": path, "cell": cell, "line": line, "rule": rule,
            "severity": "high", "verdict": verdict, "reason": "test"}


LABELS = [
    label("train.py", 11, "TR601", "TP"),
    label("train.py", 13, "TR601", "NOISE"),
    label("train.py", 16, "TR202", "FP"),  # the finding is on line 18: inside the default tolerance of 3
    label("train.py", 5, "TR303", "FP"),  # no longer reported
    label("train.py", 40, "TR601", "TP"),  # a TP the tool misses
    label("demo.ipynb", 2, "TR601", "TP", cell=3),
    label("demo.ipynb", 2, "TR601", "FP", cell=2),  # same line, other cell: must not match
]


@pytest.fixture(scope="module")
def precision():
    spec = importlib.util.spec_from_file_location("bench_precision", ROOT / "bench" / "precision.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


@pytest.fixture
def dev_set(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "repos.txt").write_text("acme/toy " + "0" * 40 + "\n")
    (dev / "labels.json").write_text(json.dumps(LABELS))
    repo = tmp_path / "repos" / "toy"
    repo.mkdir(parents=True)
    (repo / "train.py").write_text(TRAIN)
    (repo / "demo.ipynb").write_text(json.dumps(NOTEBOOK))
    return dev, tmp_path / "repos"


def run(precision, dev_set, tolerance=3, judgments=()):
    dev, repos = dev_set
    labels = precision.read_labels(dev / "labels.json")
    result = precision.analyze_repo("acme/toy", "0" * 40, precision.repo_dir(repos, "acme/toy"))
    matches, missed = precision.match("acme/toy", result.findings, labels, tolerance)
    if judgments:
        new = [m.finding for m in matches if m.label is None]
        judged, _ = precision.match("acme/toy", new, list(judgments), tolerance)
        matches = [m for m in matches if m.label is not None] + judged
    return result, matches, missed, precision.tally(matches, labels)


def test_findings_match_labels_by_path_cell_rule_and_line(precision, dev_set):
    result, matches, missed, tallies = run(precision, dev_set)
    assert len(result.findings) == 4
    by_place = {(m.finding.path, m.finding.cell, m.finding.line, m.finding.rule): m.verdict for m in matches}
    assert by_place == {
        ("train.py", None, 11, "TR601"): "TP",
        ("train.py", None, 13, "TR601"): "NOISE",
        ("train.py", None, 18, "TR202"): "FP",
        ("demo.ipynb", 3, 2, "TR601"): "TP",
    }
    assert sorted((lab.path, lab.line, lab.rule, lab.cell) for lab in missed) == [
        ("demo.ipynb", 2, "TR601", 2), ("train.py", 5, "TR303", None), ("train.py", 40, "TR601", None)]
    t601, t202, t303 = tallies["TR601"], tallies["TR202"], tallies["TR303"]
    assert (t601.tp_found, t601.tp_labeled, t601.noise_reported, t601.fp_labeled, t601.new) == (2, 3, 1, 1, 0)
    assert (t202.fp_reported, t202.fp_labeled, t303.fp_reported, t303.fp_labeled) == (1, 1, 0, 1)
    assert t601.precision() == pytest.approx(2 / 3)


def test_line_tolerance_and_judgments(precision, dev_set):
    _, matches, _, tallies = run(precision, dev_set, tolerance=0)
    assert tallies["TR202"].new == 1 and tallies["TR202"].fp_reported == 0
    assert tallies["TR202"].strict_precision() == 0
    verdict = precision.Label.from_dict(label("train.py", 18, "TR202", "TP"), judged=True)
    _, _, _, tallies = run(precision, dev_set, tolerance=0, judgments=[verdict])
    t = tallies["TR202"]
    assert (t.new, t.new_tp, t.unjudged, t.tp, t.fp_labeled) == (1, 1, 0, 1, 1)
    assert t.precision() == 1 and t.strict_precision() == 1


def test_main_prints_rule_repository_and_severity_tables(precision, dev_set, capsys, tmp_path):
    dev, repos = dev_set
    judgments = tmp_path / "judgments.json"
    judgments.write_text(json.dumps([label("train.py", 18, "TR202", "NOISE")]))
    assert precision.main(["--dev-set", str(dev), "--repos", str(repos), "--line-tolerance", "0",
                           "--judgments", str(judgments), "--list-new", "--list-missed"]) == 0
    out = capsys.readouterr().out
    assert "| TR601 | 2/3 | 1/1 | 0/1 | 0 | 0/0/0/0 | 67% | 67% |" in out
    assert "| TR202 | 0/0 | 0/0 | 0/1 | 1 | 0/1/0/0 | 0% | 0% |" in out
    assert "| **all** | 2/3 | 1/1 | 0/3 | 1 | 0/1/0/0 | 50% | 50% |" in out
    # two inline comments on train.py (its two TR601 share one) and one on the notebook's JSON line (the PR
    # adds every line); all four findings are of 0.1.0's rules, and with --baseline-rules TR202 only one is
    assert "| acme/toy | 2 | 0 | 4 | 2 | 1 | 0 | 1 | 1 | 3 | 0 | 4 | 3 |" in out
    assert "| **all** | 2 | 0 | 4 | 2 | 1 | 0 | 1 | 1 | 3 | 0 | 4 | 3 |" in out
    precision.main(["--dev-set", str(dev), "--repos", str(repos), "--line-tolerance", "0",
                    "--baseline-rules", "TR202"])
    assert "| acme/toy | 2 | 0 | 4 | 2 | 1 | 0 | 1 | 1 | 3 | 0 | 1 | 1 |" in capsys.readouterr().out
    # severities now: TR601 critical (args.ckpt), high (best.pt) and the notebook's; TR202 medium.
    assert "high/critical severity (as reported now): 3 findings: TP 2, NOISE 1, FP 0, unjudged 0" in out
    assert "acme/toy train.py:40 TR601" in out  # the missed TP
    assert "New findings, not judged (0)" in out


def test_dev_set_is_required(precision):
    with pytest.raises(SystemExit):
        precision.main([])
