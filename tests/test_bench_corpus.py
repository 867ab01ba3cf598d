"""The evaluation instruments' logic: the corpus list and split, bench/corpus/fetch.py, and
bench/corpus_precision.py's ids, sample, verdicts, Wilson intervals and weights."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import corpus_precision as bench  # noqa: E402
from bench.corpus import corpus, fetch  # noqa: E402


def finding(fid: str, repo: str = "a/x", rule: str = "TR601", severity: str = "low", line: int = 1):
    return bench.CorpusFinding(fid, repo, "0" * 40, "train.py", None, line, line, rule, severity, "message")


# ---- the committed corpus -------------------------------------------------------------------------

def test_committed_corpus_is_broad_split_by_hash_and_excludes_nothing_forbidden():
    entries = corpus.read_repos()
    sides = corpus.split_of(entries, corpus.read_split())
    assert len(entries) >= 120
    assert set(sides.values()) == {"tune", "holdout"}
    assert sum(side == "holdout" for side in sides.values()) >= 60
    for entry in entries:
        assert entry.tags, entry.repo


def test_split_by_hash_is_the_parity_of_sha256():
    import hashlib

    for repo in ("karpathy/nanoGPT", "a/b", "Owner/Name"):
        parity = int(hashlib.sha256(repo.lower().encode()).hexdigest(), 16) % 2
        assert corpus.split_by_hash(repo) == ("tune", "holdout")[parity]


def test_split_file_rejects_a_hash_row_on_the_wrong_side_and_needs_a_note(tmp_path):
    repo = "a/b"
    wrong = "holdout" if corpus.split_by_hash(repo) == "tune" else "tune"
    path = tmp_path / "split.tsv"
    path.write_text(f"repo\tsplit\tnote\n{repo}\t{wrong}\thash\n")
    with pytest.raises(corpus.CorpusError, match="its hash puts it on"):
        corpus.read_split(path)
    path.write_text(f"repo\tsplit\tnote\n{repo}\t{wrong}\tmoved to tune: TR601 fix of issue 30\n")
    assert corpus.read_split(path) == {repo: wrong}
    path.write_text(f"{repo}\tsideways\thash\n")
    with pytest.raises(corpus.CorpusError, match="not one of"):
        corpus.read_split(path)
    with pytest.raises(corpus.CorpusError, match="not in split.tsv: c/d"):
        corpus.split_of([corpus.CorpusRepo("c/d", "0" * 40)], {})


def test_repos_file_errors_name_the_line(tmp_path):
    path = tmp_path / "repos.tsv"
    path.write_text("repo\tcommit\ttags\na/b\tnot-a-sha\tscript\n")
    with pytest.raises(corpus.CorpusError, match=r"repos.tsv:2: 'not-a-sha' is not a 40-digit commit"):
        corpus.read_repos(path)
    path.write_text(f"a/b\t{'1' * 40}\tx\nA/B\t{'2' * 40}\ty\n")
    with pytest.raises(corpus.CorpusError, match="listed twice"):
        corpus.read_repos(path)


# ---- fetch.py against a real git repository ------------------------------------------------------

def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_fetch_extracts_the_pinned_commit_from_a_mirror_and_reports_what_is_missing(tmp_path, capsys):
    work = tmp_path / "work"
    work.mkdir()
    _git(work, "init", "-q")
    (work / "train.py").write_text("import torch\nprint('first')\n")
    _git(work, "add", ".")
    _git(work, "commit", "-qm", "one")
    pinned = _git(work, "rev-parse", "HEAD")
    (work / "train.py").write_text("print('second')\n")
    _git(work, "commit", "-qam", "two")
    mirrors = tmp_path / "mirrors"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(mirrors / "me+demo.git")], check=True)
    listing = tmp_path / "repos.tsv"
    listing.write_text(f"repo\tcommit\ttags\nme/demo\t{pinned}\tscript\nme/absent\t{'1' * 40}\tscript\n")
    cache = tmp_path / "cache"

    code = fetch.main(["--list", str(listing), "--cache", str(cache), "--mirrors", str(mirrors)])
    out = capsys.readouterr().out
    assert code == 1
    assert "missing (1): me/absent" in out
    assert (cache / "me+demo" / "train.py").read_text() == "import torch\nprint('first')\n"
    assert (cache / "me+demo" / corpus.COMMIT_MARKER).read_text().strip() == pinned
    # a second run keeps what is there at its commit
    assert fetch.main(["--list", str(listing), "--cache", str(cache), "--mirrors", str(mirrors),
                       "--only", "me/demo"]) == 0
    assert "1/1 repositories" in capsys.readouterr().out


# ---- ids and the sample --------------------------------------------------------------------------

def test_ids_depend_on_content_not_on_lines_and_tell_repeats_apart():
    key = bench.finding_key("a/x", "train.py", None, "TR601", "model  =  torch.load(p)")
    same = bench.finding_key("a/x", "train.py", None, "TR601", "model = torch.load(p)")
    assert key == same
    first, second = bench.assign_ids([key, key])
    assert first != second
    assert bench.assign_ids([key]) == [first]


def test_the_sample_is_deterministic_order_free_and_takes_every_high_on_holdout():
    sides = {"a/x": "holdout", "b/y": "tune"}
    findings = [finding(f"h{i}", "a/x", severity="high") for i in range(7)]
    findings += [finding(f"l{i}", "a/x", severity="low") for i in range(10)]
    findings += [finding(f"t{i}", "b/y", severity="high") for i in range(10)]
    sample, totals = bench.draw_sample(findings, sides, per_stratum=3, seed="s")
    again, _ = bench.draw_sample(list(reversed(findings)), sides, per_stratum=3, seed="s")
    assert [f.id for f in sample] == [f.id for f in again]
    ids = {f.id for f in sample}
    assert {f"h{i}" for i in range(7)} <= ids  # every holdout high
    assert sum(i.startswith("l") for i in ids) == 3 and sum(i.startswith("t") for i in ids) == 3
    assert totals[("holdout", "TR601", "low")] == 10
    other, _ = bench.draw_sample(findings, sides, per_stratum=3, seed="another seed")
    assert {f.id for f in other if f.id.startswith("l")} != {i for i in ids if i.startswith("l")}
    # a new finding in the stratum leaves the drawn ones drawn unless it ranks before them
    grown, _ = bench.draw_sample(findings + [finding("l-new", "a/x")], sides, per_stratum=3, seed="s")
    kept = {f.id for f in grown if f.id.startswith("l")}
    assert len(kept & ids) >= 2


def test_the_sheet_carries_no_engine_version_and_the_stratum_weight(tmp_path):
    sides = {"a/x": "tune"}
    findings = [finding(f"f{i}", "a/x") for i in range(6)]
    sample, totals = bench.draw_sample(findings, sides, per_stratum=3, seed="s")
    sheet = tmp_path / "sheet.tsv"
    bench.write_sheet(sheet, sample, sides, totals)
    lines = sheet.read_text().splitlines()
    assert lines[0].split("\t") == list(bench.SHEET_COLUMNS)
    assert len(lines) == 4 and all(line.endswith("\t2.00") for line in lines[1:])


# ---- verdicts ------------------------------------------------------------------------------------

def test_verdict_files_parse_and_reject_what_is_malformed(tmp_path):
    (tmp_path / "one.tsv").write_text("id\tverdict\treason\tjudge\nf1\ttp\tuser-controlled path\tme\n"
                                      "# a comment\nf2\tNOISE\tbest-checkpoint reload\tme\n")
    verdicts = bench.read_verdicts(tmp_path)
    assert {v.id: v.verdict for v in verdicts.values()} == {"f1": "TP", "f2": "NOISE"}
    (tmp_path / "two.tsv").write_text("f1\tFP\tdisagrees\tyou\n")
    with pytest.raises(bench.VerdictError, match=r"two.tsv:1: f1 is FP here but TP at one.tsv:2"):
        bench.read_verdicts(tmp_path)
    (tmp_path / "two.tsv").write_text("f3\tMAYBE\twhy\tyou\n")
    with pytest.raises(bench.VerdictError, match="'MAYBE' is not one of TP, NOISE, FP"):
        bench.read_verdicts(tmp_path)
    (tmp_path / "two.tsv").write_text("f3\tTP\t\tyou\n")
    with pytest.raises(bench.VerdictError, match="needs a reason and a judge"):
        bench.read_verdicts(tmp_path)
    (tmp_path / "two.tsv").write_text("f3\tTP\n")
    with pytest.raises(bench.VerdictError, match="expected 4 tab-separated columns"):
        bench.read_verdicts(tmp_path)


# ---- figures -------------------------------------------------------------------------------------

def test_wilson_interval_matches_known_values():
    low, high = bench.wilson(8, 10)
    assert (round(low, 3), round(high, 3)) == (0.490, 0.943)
    low, high = bench.wilson(0, 5)
    assert low == 0.0 and round(high, 3) == 0.434
    assert bench.wilson(0, 0) == (0.0, 1.0)


def test_weights_carry_each_stratum_back_to_all_its_findings():
    sides = {"a/x": "tune"}
    # TR601: 2 findings, both judged TP; TR703: 8 findings, 2 judged, both FP
    findings = [finding(f"a{i}", rule="TR601") for i in range(2)] + [finding(f"b{i}", rule="TR703") for i in range(8)]
    sample, _ = bench.draw_sample(findings, sides, per_stratum=2, seed="s")
    verdicts = {f.id: bench.Verdict(f.id, "TP" if f.rule == "TR601" else "FP", "r", "j", "x") for f in sample}
    figures = bench.tally(findings, sides, sample, verdicts)
    overall = figures[("tune", "all", "all")]
    assert (overall.findings, overall.judged, overall.tp, overall.fp) == (10, 4, 2, 2)
    assert overall.precision == 0.5  # the sample
    assert overall.weighted_precision == pytest.approx(0.2)  # 2 of 10 findings
    assert overall.weighted_fp_rate == pytest.approx(0.8)
    assert overall.effective_n == pytest.approx(100 / (2 * 1 + 2 * 16))
    assert figures[("tune", "rule", "TR703")].weighted_precision == 0.0
    assert overall.uncovered == 0


def test_a_stratum_without_verdicts_is_reported_as_not_covered():
    sides = {"a/x": "holdout"}
    findings = [finding("a", rule="TR601", severity="high"), finding("b", rule="TR703")]
    sample, _ = bench.draw_sample(findings, sides, per_stratum=1, seed="s")
    verdicts = {"a": bench.Verdict("a", "TP", "r", "j", "x")}
    overall = bench.tally(findings, sides, sample, verdicts)[("holdout", "all", "all")]
    assert overall.uncovered == 1 and overall.weighted_precision == 1.0


def test_report_runs_end_to_end_on_a_findings_directory(tmp_path, capsys):
    listing = tmp_path / "repos.tsv"
    listing.write_text(f"repo\tcommit\ttags\na/x\t{'0' * 40}\tscript\n")
    split = tmp_path / "split.tsv"
    split.write_text(f"repo\tsplit\tnote\na/x\t{corpus.split_by_hash('a/x')}\thash\n")
    runs = tmp_path / "findings"
    runs.mkdir()
    items = [bench.asdict(finding(f"f{i}", severity="high")) for i in range(3)]
    (runs / "a+x.json").write_text(json.dumps({"repo": "a/x", "commit": "0" * 40, "findings": items}))
    verdicts = tmp_path / "verdicts"
    verdicts.mkdir()
    (verdicts / "me.tsv").write_text("f0\tTP\tr\tme\nf1\tFP\tr\tme\nf2\tTP\tr\tme\nstale\tTP\tr\tme\n")
    common = ["--list", str(listing), "--split", str(split), "--findings", str(runs), "--per-stratum", "5"]
    assert bench.main(["report", *common, "--verdicts", str(verdicts), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "3 judged" in out and "1 on findings the engine no longer reports" in out
    assert "| all | 3 | 3 | 2 | 0 | 1 | 67% [21%, 94%]" in out


def test_the_sheet_goes_round_the_strata_so_a_partial_judge_covers_each_with_its_best_ranked():
    sides = {"a/x": "holdout", "b/y": "tune"}
    findings = [finding(f"h{i}", "a/x", rule="TR601", severity="high") for i in range(5)]
    findings += [finding(f"m{i}", "a/x", rule="TR202", severity="medium") for i in range(5)]
    findings += [finding(f"t{i}", "b/y", rule="TR601", severity="low") for i in range(5)]
    sample, _ = bench.draw_sample(findings, sides, per_stratum=2, seed="s")
    assert [f.repo for f in sample[:7]] == ["a/x"] * 7  # holdout first
    first_two = {f.rule for f in sample[:2]}
    assert first_two == {"TR601", "TR202"}  # every holdout stratum before any stratum's second
    for stratum in ("TR601", "TR202"):
        members = [f for f in findings if f.rule == stratum and f.repo == "a/x"]
        best = min(members, key=lambda f: bench.draw_rank("s", f.id))
        assert best in sample[:2]


def _one_repo_cache(tmp_path):
    cache = tmp_path / "cache"
    root = cache / "a+x"
    root.mkdir(parents=True)
    (root / corpus.COMMIT_MARKER).write_text("0" * 40 + "\n")
    (root / "train.py").write_text("import torch\nckpt = torch.load('x.pt')\n")
    return cache, [corpus.CorpusRepo("a/x", "0" * 40)]


def test_analyze_records_a_repository_the_engine_does_not_finish_as_timed_out(tmp_path, monkeypatch):
    import time

    cache, entries = _one_repo_cache(tmp_path)
    monkeypatch.setattr(bench, "analyze_repo", lambda *args: time.sleep(60))
    out = tmp_path / "findings"
    started = time.monotonic()
    assert bench.analyze_corpus(entries, cache, out, jobs=1, rerun=False, timeout=1) == []
    assert time.monotonic() - started < 30
    assert json.loads((out / "a+x.json").read_text())["timed_out"] is True
    assert bench.load_findings(out, entries) == ([], ["a/x"])
    assert bench.timed_out(out, entries) == ["a/x"]


def test_analyze_in_a_child_process_writes_the_engine_findings(tmp_path):
    cache, entries = _one_repo_cache(tmp_path)
    out = tmp_path / "findings"
    bench.analyze_corpus(entries, cache, out, jobs=1, rerun=False, timeout=120)
    findings, absent = bench.load_findings(out, entries)
    assert absent == [] and {f.rule for f in findings} >= {"TR601"}
    assert all(f.repo == "a/x" and f.path == "train.py" for f in findings)


def _run_with_failures(failed_files):
    return {"repo": "a/x", "commit": "0" * 40, "files": 3, "errors": sum(failed_files.values()),
            "failed_files": failed_files, "seconds": 1.0, "findings": []}


def test_a_repository_whose_file_ran_out_of_time_is_analyzed_once_more_and_again_on_the_next_analyze(
        tmp_path, monkeypatch, capsys):
    cache, entries = _one_repo_cache(tmp_path)
    runs = iter([_run_with_failures({"timeout": 1}), _run_with_failures({"timeout": 1}),
                 _run_with_failures({}), _run_with_failures({"timeout": 1})])
    monkeypatch.setattr(bench, "analyze_repo", lambda *args: next(runs))
    out = tmp_path / "findings"
    bench.analyze_corpus(entries, cache, out, jobs=1, rerun=False)
    assert "1 files ran out of time; analyzing it again" in capsys.readouterr().out
    assert bench.engine_failures(out, entries) == {"a/x": {"timeout": 1}}  # twice out of time: it stands, recorded
    bench.analyze_corpus(entries, cache, out, jobs=1, rerun=False)  # a later analyze redoes it
    assert bench.engine_failures(out, entries) == {}
    bench.analyze_corpus(entries, cache, out, jobs=1, rerun=False)  # complete now: kept, not analyzed again
    assert next(runs)["failed_files"] == {"timeout": 1}


def test_the_report_names_repositories_with_files_the_engine_failed_on(tmp_path, capsys):
    listing = tmp_path / "repos.tsv"
    listing.write_text(f"repo\tcommit\ttags\na/x\t{'0' * 40}\tscript\n")
    runs = tmp_path / "findings"
    runs.mkdir()
    split = tmp_path / "split.tsv"
    split.write_text(f"repo\tsplit\tnote\na/x\t{corpus.split_by_hash('a/x')}\thash\n")
    (runs / "a+x.json").write_text(json.dumps(_run_with_failures({"rule-error": 2})))
    assert bench.main(["report", "--list", str(listing), "--split", str(split), "--findings", str(runs),
                       "--verdicts", str(tmp_path / "none")]) == 0
    out = capsys.readouterr().out
    assert "incomplete, files the engine failed on" in out and "a/x (rule-error 2)" in out


def test_the_engine_records_which_files_it_failed_on_by_kind(tmp_path):
    cache, entries = _one_repo_cache(tmp_path)
    (cache / "a+x" / "binary.py").write_bytes(b"x = 1\0\n")  # the file's own fault, not the engine's failure
    run = bench.analyze_repo(entries[0], cache / "a+x", jobs=1)
    assert run["errors"] == 1 and run["failed_files"] == {}
