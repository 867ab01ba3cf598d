"""The runner corpus (bench/smoke_real/targets.tsv) and the figures bench/smoke_real.py prints from it."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.corpus.corpus import read_split, side_of, split_by_hash
from bench.smoke_real import (MOVED, RunnerTarget, TargetsError, format_summary, read_targets,
                              summarize)

SHA = "a" * 40
HEADER = "repo\tcommit\ttarget\texpected\tside\ttags\tnote\n"


def test_every_row_parses_and_sits_on_its_side():
    rows = read_targets()
    split = read_split()
    for row in rows:
        if row.side != side_of(row.repo, split):
            assert row.side == "tune" and row.note.startswith(MOVED), row
    assert {row.side for row in rows} == {"tune", "holdout"}


def test_the_corpus_is_big_enough_and_mostly_new():
    rows = read_targets()
    tuned = {row.repo for row in rows if row.note.startswith(MOVED) or row.note.startswith("tuned on")}
    new = [row for row in rows if row.repo not in tuned]
    assert len(new) >= 100
    assert len({row.repo for row in new}) >= 15
    holdout = [row for row in rows if row.side == "holdout"]
    assert len(holdout) >= 60 and not {row.repo for row in holdout} & tuned


def _write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "targets.tsv"
    path.write_text(HEADER + "".join(line + "\n" for line in lines))
    return path


def _name_on(side: str) -> str:
    return next(f"someone/repo{n}" for n in range(100) if split_by_hash(f"someone/repo{n}") == side)


@pytest.mark.parametrize("line, message", [
    ("someone/x\t{sha}\tm.py:Net\tbuilt\t{side}\t\t\textra", "columns"),
    ("someone x\t{sha}\tm.py:Net\tbuilt\t{side}\t\t", "owner/name"),
    ("someone/x\tabc\tm.py:Net\tbuilt\t{side}\t\t", "40-digit"),
    ("someone/x\t{sha}\tm.py\tbuilt\t{side}\t\t", "path/to/file.py:Class"),
    ("someone/x\t{sha}\tm.py:Net\tbuilds\t{side}\t\t", "built, skip"),
    ("someone/x\t{sha}\tm.py:Net\tskip:no-torchvision\t{side}\t\t", "skip kind"),
    ("someone/x\t{sha}\tm.py:Net\tskip:missing-package\t{side}\t\t", "names the package"),
    ("someone/x\t{sha}\tm.py:Net\tfail:\t{side}\t\t", "names the check"),
    ("someone/x\t{sha}\tm.py:Net\tbuilt\tdev\t\t", "not one of"),
])
def test_a_bad_row_is_refused_with_its_reason(tmp_path, line, message):
    side = split_by_hash("someone/x")
    with pytest.raises(TargetsError, match=message):
        read_targets(_write(tmp_path, line.format(sha=SHA, side=side)), split={})


def test_the_side_follows_the_hash_unless_a_note_moves_it_to_tune(tmp_path):
    holdout = _name_on("holdout")
    with pytest.raises(TargetsError, match="moves to tune only"):
        read_targets(_write(tmp_path, f"{holdout}\t{SHA}\tm.py:Net\tbuilt\ttune\t\t"), split={})
    rows = read_targets(_write(tmp_path, f"{holdout}\t{SHA}\tm.py:Net\tbuilt\ttune\t\t{MOVED}: tuned on it"), split={})
    assert rows[0].side == "tune"
    tune = _name_on("tune")
    with pytest.raises(TargetsError, match="moves to tune only"):  # never moved to holdout
        read_targets(_write(tmp_path, f"{tune}\t{SHA}\tm.py:Net\tbuilt\tholdout\t\t{MOVED}"), split={})
    # the static corpus's split wins over the hash
    assert read_targets(_write(tmp_path, f"{holdout}\t{SHA}\tm.py:Net\tbuilt\ttune\t\t"), split={holdout: "tune"})


def test_one_commit_per_repository_and_no_duplicate(tmp_path):
    side = split_by_hash("someone/x")
    with pytest.raises(TargetsError, match="pinned to"):
        read_targets(_write(tmp_path, f"someone/x\t{SHA}\ta.py:A\tbuilt\t{side}\t\t",
                            f"someone/x\t{'b' * 40}\tb.py:B\tbuilt\t{side}\t\t"), split={})
    with pytest.raises(TargetsError, match="twice"):
        read_targets(_write(tmp_path, f"someone/x\t{SHA}\ta.py:A\tbuilt\t{side}\t\t",
                            f"someone/x\t{SHA}\ta.py:A\tbuilt\t{side}\t\t"), split={})


def _row(repo: str, target: str, expected: str = "built", side: str = "holdout") -> RunnerTarget:
    return RunnerTarget(repo, SHA, target, expected, side, (), "")


def test_the_summary_counts_each_outcome_on_its_side():
    results = [
        (_row("a/one", "m.py:A"), {"status": "passed", "seconds": 1.0, "cpu_seconds": 0.5}),
        (_row("a/one", "m.py:B"), {"status": "failed", "seconds": 3.0, "cpu_seconds": 2.0}),  # a false FAIL
        (_row("a/one", "m.py:C"), {"status": "skipped", "reason": "needs 'torchvision' (not installed)"}),
        (_row("a/one", "m.py:D", "skip:no-parameters"), {"status": "skipped", "reason": "no trainable parameters"}),
        (_row("b/two", "m.py:E"), {"status": "error", "reason": "the child died"}),
        (_row("b/two", "m.py:F"), {"status": "skipped", "reason": "cannot guess constructor argument 'cfg'"}),
        (_row("b/two", "m.py:I", "skip:missing-package:einops"), {"status": "skipped",
                                                                  "reason": "cannot guess constructor argument 'n'"}),
        (_row("c/tuned", "m.py:G", side="tune"), {"status": "passed", "seconds": 9.0, "cpu_seconds": 8.0}),
        (_row("c/tuned", "m.py:H", "fail:eval-determinism", side="tune"), {"status": "failed", "seconds": 5.0}),
    ]
    summary = summarize(results)
    holdout, tune, both = summary["holdout"], summary["tune"], summary["all"]
    assert (holdout["targets"], holdout["repositories"], holdout["built"]) == (7, 2, 2)
    assert (holdout["expected_build"], holdout["built_of_expected"]) == (5, 2)
    assert holdout["skipped"] == {"constructor argument": 2, "missing package torchvision": 1,
                                  "no trainable parameters": 1}
    assert holdout["skipped_as_expected"] == 2
    assert holdout["skipped_for_another_reason"] == [
        "b/two/m.py:I (constructor argument, expected skip:missing-package:einops)"]
    assert holdout["false_fails"] == ["a/one/m.py:B"] and holdout["errors"] == ["b/two/m.py:E"]
    assert holdout["time_s"] == {"median": 2.0, "p90": 3.0, "max": 3.0}
    assert holdout["cpu_s"]["median"] == 1.25
    assert holdout["per_repository"]["a/one"] == {"targets": 4, "built": 2, "expected_build": 3,
                                                  "false_fails": 1, "errors": 0}
    # a known bug that fails is caught, not a false FAIL
    assert tune["false_fails"] == [] and (tune["known_bugs_caught"], tune["known_bugs"]) == (1, 1)
    assert both["targets"] == 9 and both["built"] == 4
    text = format_summary(summary)
    assert "holdout: 7 targets from 2 repositories" in text and "false FAILs 1 (a/one/m.py:B)" in text
    assert "known bugs (planted, or confirmed by reading) caught 1/1" in text


def test_a_side_with_nothing_run_says_so():
    assert "tune: no targets ran" in format_summary(summarize([(_row("a/one", "m.py:A"), {"status": "passed"})]))



def test_saved_runs_are_reported_against_the_current_expectations(tmp_path, capsys):
    import json

    from bench.smoke_real import main

    repo = _name_on("holdout")
    targets = _write(tmp_path, f"{repo}\t{SHA}\tm.py:A\tbuilt\tholdout\t\t",
                     f"{repo}\t{SHA}\tm.py:B\tskip:upstream-bug\tholdout\t\tits own to() raises")
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({"reports": {f"{repo}/m.py:A": {"status": "passed", "seconds": 2.0},
                                             f"{repo}/m.py:B": {"status": "skipped", "reason": "could not build"},
                                             f"{repo}/m.py:Gone": {"status": "passed"}}}))
    assert main(["--targets", str(targets), "--report", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "holdout: 2 targets from 1 repositories" in out and "(1 expected to skip)" in out
    assert f"left out: {repo}/m.py:Gone" in out


def test_compare_runs_names_the_targets_whose_outcome_differs_and_pairs_times():
    from bench.smoke_real import compare_runs

    def report(status, seconds, failing=()):
        return {"status": status, "seconds": seconds,
                "checks": [{"name": name, "status": "fail"} for name in failing]}

    cpu = {"reports": {"a/x.py:A": report("passed", 2.0), "a/x.py:B": report("passed", 4.0),
                       "a/x.py:C": report("skipped", 0.0) | {"reason": "needs package 'einops'"}}}
    cuda = {"reports": {"a/x.py:A": report("passed", 1.0), "a/x.py:B": report("failed", 1.0, ["eval_determinism"]),
                        "a/x.py:C": report("skipped", 0.0) | {"reason": "needs package 'einops'"}}}
    text = compare_runs(cpu, cuda, names=("cpu", "cuda"))
    first, *differing = text.splitlines()
    assert "3 targets in both runs" in first and "1 with a different outcome" in first
    assert "built in both: 2" in first and "median 0.38" in first
    assert len(differing) == 1 and "a/x.py:B" in differing[0]
    assert "cpu passed" in differing[0] and "cuda failed eval_determinism" in differing[0]


def test_steps_bench_counts_a_repository_as_training_by_a_backward_call_outside_tests():
    from bench.smoke_steps import summarize, trains

    sources = {"train.py": "def fit(m, x):\n    m(x).sum().backward()\n",
               "tests/test_fit.py": "def test_it(m, x):\n    m(x).sum().backward()\n",
               "notes.py": "text = 'loss.backward()'\n", "broken.py": "def (:\n"}
    assert trains(sources) == ["train.py"]
    results = {"a/trains": {"training_files": ["train.py"], "steps": {
                   "train.py:fit": {"status": "passed", "reason": "", "failing": [], "seconds": 1.0}}},
               "b/trains": {"training_files": ["t.py"], "steps": {
                   "t.py:go": {"status": "skipped", "reason": "cannot build the argument 'e' of go; give", "failing": [],
                               "seconds": 0.0}}},
               "c/idle": {"training_files": [], "steps": {}}}
    text = summarize(results, {"a/trains": "tune", "b/trains": "tune", "c/idle": "holdout"})
    assert "tune: 2 repositories, 2 train (a .backward( outside tests); a step found in 2, a step ran in 1 (50% of " \
           "those that train)" in text
    assert "1 x cannot build the argument 'e' of go" in text
    assert "holdout: 1 repositories, 0 train" in text
