"""Turn one pull request's findings into a GitHub review and a check run, as plain data.

Pure functions only: no network and no PyGithub objects. The worker sends what comes out:

* :func:`plan_review` -> :class:`ReviewPlan`: the body and ``comments[]`` of ONE
  ``POST /repos/{o}/{r}/pulls/{n}/reviews`` (event ``COMMENT``).
* :func:`plan_check_run` -> :class:`CheckRunPlan`: conclusion and ``output`` of a check run;
  send the annotations 50 at a time with :func:`batches` (GitHub's per-request limit).

GitHub rejects a whole review with 422 when a single comment targets a line outside the diff,
so every inline comment is placed on a line that appears in a hunk of the file's patch; what
cannot be placed goes into the review body instead of being lost.
"""
from __future__ import annotations

import re
import textwrap
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Callable, Iterable, Iterator, Mapping, Optional, Protocol, Sequence

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from analyzers.engine import finding_fails
from analyzers.fingerprint import fingerprints_for, is_notebook_finding
from analyzers.freed_imports import with_freed_imports
from analyzers.markdown import code_block, code_span, literal, longest_backtick_run, message, redact_urls, table_cell
from analyzers.model import Category, Finding, Fix, Severity
from analyzers.notebook import json_fix, json_source_lines
from analyzers.rules import get_rule

# GitHub's limits: check-run summary/text (documented maxLength), review and comment bodies.
MAX_MARKDOWN_CHARS = 65_535
MAX_ANNOTATION_BYTES = 64 * 1024
MAX_ANNOTATION_TITLE_CHARS = 255
ANNOTATIONS_PER_REQUEST = 50
# Long lists (files reviewed, notes) are capped so the findings keep most of the room.
MAX_LISTED_FILES = 200
MAX_LISTED_NOTES = 200
MAX_LISTED_SUPPRESSED = 50  # findings silenced by comments, listed in the check run

FILTER_MODES = ("introduced", "added", "diff_context", "file")

SEVERITY_BADGES = {
    Severity.CRITICAL: "🔴 **critical**",
    Severity.HIGH: "🟠 **high**",
    Severity.MEDIUM: "🟡 **medium**",
    Severity.LOW: "🔵 **low**",
}
ANNOTATION_LEVELS = {
    Severity.CRITICAL: "failure",
    Severity.HIGH: "failure",
    Severity.MEDIUM: "warning",
    Severity.LOW: "notice",
}
# Why a file was not analyzed, in words a PR author understands; keyed by FileError.kind.
NOTE_EXPLANATIONS = {
    "binary-file": "binary file, not analyzed",
    "no-patch": "GitHub sent no diff for this file (binary or too large), so its lines could not be reviewed",
    "too-large": "file too large to analyze",
    "syntax-error": "could not be parsed (syntax error), so no rule ran on it",
    "decode-error": "not valid UTF-8 text, not analyzed",
    "unknown-codec": "its coding cookie names a codec torchreview lacks; read and analyzed as UTF-8",
    "read-error": "could not be read",
    "notebook-error": "notebook could not be read",
    "rule-error": "a rule failed on this file; other rules still ran",
}

# Every inline comment says how to tell us it is wrong (read back by bot.feedback).
FEEDBACK_HOWTO = "_Wrong or not useful? React with 👎, or reply `/review false-positive` and why._"
FINGERPRINT_RE = re.compile(r"<!-- torchreview:fingerprint=([0-9a-f]+) rule=[^\s>]+ -->")
# Our comments' last line: nothing but the markers of the findings it covers (fingerprint_markers).
MARKER_RE = re.compile(r"<!-- torchreview:fingerprint=([0-9a-f]+) rule=(TR\d+) -->")
_ONE_MARKER = r"<!-- torchreview:fingerprint=[0-9a-f]+ rule=TR\d+ -->"
MARKER_LINE_RE = re.compile(rf"{_ONE_MARKER}(?: {_ONE_MARKER})*")


class FileNote(Protocol):
    """Anything shaped like :class:`analyzers.model.FileError`."""

    path: str
    kind: str
    message: str


# ---- diff information ------------------------------------------------------------------------

@dataclass(frozen=True)
class FileDiff:
    """New-side (RIGHT) line numbers of one changed file, from its GitHub ``patch``.

    ``hunks`` holds each hunk's commentable lines; a multi-line comment must stay inside one.
    ``has_patch`` is False when GitHub sent no patch (binary or huge diff): then no line is
    known, findings in the file are kept whatever the filter but never placed inline.
    """

    path: str
    added: frozenset[int] = frozenset()
    commentable: frozenset[int] = frozenset()
    hunks: tuple[frozenset[int], ...] = ()
    has_patch: bool = True
    # removed lines: (the new-side line they were removed before, their text)
    removed: tuple[tuple[int, str], ...] = ()

    def in_one_hunk(self, first: int, last: int) -> bool:
        wanted = set(range(first, last + 1))
        return bool(wanted) and any(wanted <= hunk for hunk in self.hunks)


def parse_file_patch(path: str, patch: Optional[str]) -> FileDiff:
    """A :class:`FileDiff` from the ``patch`` field of GitHub's PR files API.

    ``None`` means GitHub sent no patch for a changed file (binary or too large): lines unknown.
    Pass ``""`` for a change without content lines (a pure rename): nothing is new there.
    """
    if patch is None:
        return FileDiff(path, has_patch=False)
    if not patch.strip():
        return FileDiff(path)
    text = f"--- a/{path}\n+++ b/{path}\n{patch}" + ("" if patch.endswith("\n") else "\n")
    try:
        patched_files = list(PatchSet(text))
    except UnidiffParseError:
        return FileDiff(path, has_patch=False)
    hunks = [
        frozenset(line.target_line_no for line in hunk if line.target_line_no is not None)
        for patched in patched_files for hunk in patched
    ]
    added = {line.target_line_no for patched in patched_files for hunk in patched for line in hunk if line.is_added}
    removed = []
    for patched in patched_files:
        for hunk in patched:
            pending: list[str] = []
            for line in hunk:
                if line.is_removed:
                    pending.append(line.value.rstrip("\n"))
                elif line.target_line_no is not None:
                    removed += [(line.target_line_no, text) for text in pending]
                    pending = []
            if pending:  # removed at the end of the hunk: anchor on its last new-side line
                last = max((n.target_line_no for n in hunk if n.target_line_no is not None), default=1)
                removed += [(last, text) for text in pending]
    return FileDiff(path, frozenset(added), frozenset().union(*hunks), tuple(hunks), True, tuple(removed))


# ---- inputs and settings -----------------------------------------------------------------------

@dataclass(frozen=True)
class ReviewSettings:
    max_inline_comments: int = 30
    fail_on: Severity = Severity.HIGH
    # introduced: what this PR causes (needs the base findings, else as "added") | added | diff_context | file
    filter: str = "introduced"
    context_lines: int = 3  # N for filter="diff_context"
    # the same finding (rule and message) in several files of the PR: one comment that lists every site
    group_across_files: bool = True
    # with group_across_files, a rule found in this many files or more: one comment listing all its findings
    # (0: never)
    group_rule_from_files: int = 3

    def __post_init__(self) -> None:
        if self.filter not in FILTER_MODES:
            raise ValueError(f"unknown filter {self.filter!r} (choose one of {', '.join(FILTER_MODES)})")
        object.__setattr__(self, "fail_on", Severity.parse(self.fail_on))


@dataclass
class PullRequestAnalysis:
    """What the worker knows about one pull request after running the engine.

    ``diffs``: one entry per changed file (path relative to the repository root).
    ``sources``: head text of analyzed files, for fingerprints and fix checks.
    ``reviewed_files``: files that were analyzed. ``notes``: files (or parts) not analyzed.
    """

    findings: Sequence[Finding]
    diffs: Mapping[str, FileDiff]
    sources: Mapping[str, str] = field(default_factory=dict)
    reviewed_files: Sequence[str] = ()
    notes: Sequence[FileNote] = ()
    # fingerprints of the findings the base revision of the changed files already had (keyed by head
    # path); None when the base was not analyzed
    base_fingerprints: Optional[frozenset[str]] = None
    feedback_note: str = ""  # how often reviewers marked our past comments on this repository wrong
    # silenced by comments in the code (``# noqa``...), and files a ``# torchreview: skip-file`` comment skipped
    suppressed: Sequence[Finding] = ()
    skipped_by_comment: Sequence[str] = ()


def finding_lines(finding: Finding) -> range:
    return range(finding.line, max(finding.line, finding.end_line) + 1)


def keep_findings(findings: Iterable[Finding], diffs: Mapping[str, FileDiff],
                  settings: ReviewSettings = ReviewSettings(), *,
                  introduced: Optional[Callable[[Finding], bool]] = None) -> list[Finding]:
    """Findings the pull request is responsible for, per ``settings.filter``; most severe first.

    ``introduced`` (with the ``introduced`` filter) says whether the base revision lacked a finding: then a
    finding is the PR's whether or not its line was touched (a deleted ``zero_grad()`` leaves the finding
    on an unchanged ``step()``), and one the base already had is not, even on a touched line."""
    if settings.filter == "introduced" and introduced is not None:
        kept = [f for f in findings if f.path in diffs and introduced(f)]
    else:
        kept = [f for f in findings if _is_kept(f, diffs.get(f.path), settings)]
    return sorted(kept, key=severity_order)


def introduced_by(pr: "PullRequestAnalysis", digests: Mapping[Finding, str]) -> Optional[Callable[[Finding], bool]]:
    if pr.base_fingerprints is None:
        return None
    return lambda finding: digests[finding] not in pr.base_fingerprints


def severity_order(finding: Finding) -> tuple:
    return (-finding.severity, finding.path, finding.cell or 0, finding.line, finding.column, finding.rule)


def finding_sites(finding: Finding) -> list[int]:
    """Every line the finding is about: its own, then its related sites (the other end of a two-site bug)."""
    lines = list(finding_lines(finding))
    for site in finding.related:
        lines += [n for n in range(site.line, max(site.line, site.end_line) + 1) if n not in lines]
    return lines


def _is_kept(finding: Finding, diff: Optional[FileDiff], settings: ReviewSettings) -> bool:
    if diff is None:
        return False  # the file is not part of the pull request
    if settings.filter == "file" or not diff.has_patch or is_notebook_finding(finding):
        return True
    reach = settings.context_lines if settings.filter == "diff_context" else 0
    # kept when any of its sites changed: a PR that only edits forward's softmax causes the loss finding
    return any(line + offset in diff.added for line in finding_sites(finding) for offset in range(-reach, reach + 1))


# ---- text helpers ---------------------------------------------------------------------------

def normalize_whitespace(text: str) -> str:
    return " ".join(text.split())


def first_sentence(text: str) -> str:
    flat = normalize_whitespace(textwrap.dedent(text))
    match = re.match(r"(.+?[.!?])\s+(?=[A-Z`(\"'])", flat)
    return match.group(1) if match else flat


def location(finding: Finding) -> str:
    if finding.cell is not None:
        return f"{finding.path} (cell {finding.cell}, line {finding.line})"
    return f"{finding.path}:{finding.line}"


def rule_title(finding: Finding) -> str:
    return f"{finding.rule} {finding.slug}"


def rule_summary(finding: Finding) -> str:
    rule = get_rule(finding.rule)
    return rule.summary if rule else finding.message


def rule_why(finding: Finding) -> str:
    rule = get_rule(finding.rule)
    return first_sentence(rule.why) if rule else ""


def severity_totals(findings: Sequence[Finding]) -> str:
    counts = Counter(f.severity for f in findings)
    return " · ".join(f"{SEVERITY_BADGES[s].split()[0]} {counts[s]} {s.label}" for s in sorted(Severity, reverse=True))


def count_phrase(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


# ---- fingerprints -------------------------------------------------------------------------

def fingerprint_marker(finding: Finding, digest: str) -> str:
    return f"<!-- torchreview:fingerprint={digest} rule={finding.rule} -->"


def parse_fingerprint(comment_body: str) -> Optional[str]:
    """The fingerprint hidden in one of our comment bodies, or None."""
    # The marker is always our last line; take the last match so quoted text cannot spoof it.
    matches = FINGERPRINT_RE.findall(comment_body or "")
    return matches[-1] if matches else None


def parse_fingerprints(comment_body: str) -> list[str]:
    """Every fingerprint of a comment that covers several findings (all markers sit on its last line)."""
    return [fingerprint for fingerprint, _rule in comment_markers(comment_body)]


def comment_markers(comment_body: str) -> list[tuple[str, str]]:
    """(fingerprint, rule id) of each finding one of our comments covers, from its last line only, and only when
    that line is nothing but markers: we write it after everything quoted (PR code in code spans and suggestion
    blocks keeps its raw characters, a fake marker included), so no quoted text can reach or form it."""
    lines = (comment_body or "").rstrip().splitlines()
    if not lines or not MARKER_LINE_RE.fullmatch(lines[-1]):
        return []
    return MARKER_RE.findall(lines[-1])


def fingerprint_markers(findings: Sequence[Finding], digests: Mapping[Finding, str]) -> str:
    return " ".join(fingerprint_marker(f, digests[f]) for f in findings)


# ---- truncation ---------------------------------------------------------------------------

def fit_shown_count(render: Callable[[int], str], total: int, limit: int = MAX_MARKDOWN_CHARS) -> str:
    """``render(k)`` for the largest k <= total whose text fits in ``limit`` characters.

    ``render(k)`` shows the first k findings and an "… and N more" line for the rest, and
    its length grows with k, so a binary search finds the largest k that fits.
    """
    text = render(total)
    if len(text) <= limit:
        return text
    low, high = 0, total - 1
    while low < high:
        middle = (low + high + 1) // 2
        if len(render(middle)) <= limit:
            low = middle
        else:
            high = middle - 1
    return hard_cap(render(low), limit)


def hard_cap(text: str, limit: int = MAX_MARKDOWN_CHARS) -> str:
    """Last resort: cut whole lines so the text fits, saying so."""
    if len(text) <= limit:
        return text
    marker = "\n\n… (truncated to fit GitHub's size limit)"
    cut = text.rfind("\n", 0, limit - len(marker))
    return text[: max(cut, 0)] + marker


def more_findings_line(hidden: int, where: str) -> str:
    return f"… and {count_phrase(hidden, 'more finding')} ({where})" if hidden else ""


def truncate_utf8(text: str, max_bytes: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    return data[: max_bytes - 3].decode("utf-8", errors="ignore") + "…"


# ---- review -------------------------------------------------------------------------------

@dataclass
class ReviewPlan:
    body: str
    comments: list[dict]
    event: str = "COMMENT"
    findings_count: int = 0
    fingerprints: frozenset[str] = frozenset()  # of every kept finding, inline or not
    blocking: bool = False  # a kept finding is at or above fail_on

    @property
    def should_post(self) -> bool:
        return self.findings_count > 0 or bool(self.comments)

    def to_request(self, commit_id: Optional[str] = None) -> dict:
        """The JSON body of ``POST /repos/{o}/{r}/pulls/{n}/reviews``."""
        request = {"event": self.event, "body": self.body, "comments": list(self.comments)}
        if commit_id:
            request["commit_id"] = commit_id
        return request


def plan_review(pr: PullRequestAnalysis, settings: ReviewSettings = ReviewSettings(),
                posted: frozenset[str] = frozenset()) -> ReviewPlan:
    """The review to post. Findings whose fingerprint is in ``posted`` already have a comment from an
    earlier run: they are not commented again and do not use up the inline limit.

    Each thing is said once: the findings of one rule in one file share one comment that lists their lines,
    and the findings that land on the same line share one comment (see :func:`group_findings`)."""
    try:
        return _plan_review(pr, settings, posted)
    finally:
        _json_source_lines.cache_clear()  # a worker keeps no notebook past its review


def _plan_review(pr: PullRequestAnalysis, settings: ReviewSettings, posted: frozenset[str]) -> ReviewPlan:
    digests = fingerprints_for(pr.findings, pr.sources)
    findings = keep_findings(pr.findings, pr.diffs, settings, introduced=introduced_by(pr, digests))
    if not findings:
        return ReviewPlan(body=no_issues_verdict(pr), comments=[], findings_count=0)
    fresh = [f for f in findings if digests[f] not in posted]
    comments: list[CommentPlan] = []
    by_line: dict[tuple[str, int], CommentPlan] = {}
    overflow, unplaceable = [], []
    for group in group_findings(fresh, settings.group_across_files, settings.group_rule_from_files):
        # most severe first, so the limit cuts the least severe
        anchor, where = next(((f, w) for f in group for w in [placement(f, pr.diffs[f.path], pr.sources.get(f.path))]
                              if w is not None), (None, None))
        if pr.base_fingerprints is not None and (where is None or where.line not in pr.diffs[anchor.path].added):
            # introduced without adding its own line (a deletion nearby, a change elsewhere in the
            # function): comment on the change that caused it, and say what it was
            cause = next(((f, w) for f in group for w in [cause_placement(f, pr.diffs[f.path], pr.sources.get(f.path))]
                          if w is not None), None)
            if cause is not None:
                anchor, where = cause
        if where is None:
            unplaceable.extend(group)
            continue
        suggested = [anchor] if where.suggestion is not None else []
        in_file = [f for f in group if f.path == anchor.path]  # a suggestion only changes the commented file
        if len(in_file) > 1 and where.note is None and anchor is in_file[0]:
            merged = group_suggestion(in_file, pr.diffs[anchor.path], pr.sources.get(anchor.path))
            if merged is not None:
                where, suggested = merged  # one suggestion fixes the group's first lines together
        same_line = by_line.get((anchor.path, where.line))
        if same_line is not None:
            same_line.add(group)  # one comment per line, listing every finding on it
            continue
        if len(comments) >= settings.max_inline_comments:
            overflow.extend(group)
            continue
        plan = CommentPlan(anchor.path, where, suggested=suggested)
        plan.add(group)
        comments.append(plan)
        by_line[(anchor.path, where.line)] = plan
    body = review_body(findings, overflow, unplaceable, pr, settings)
    return ReviewPlan(body=body, comments=[c.to_comment(digests) for c in comments], findings_count=len(findings),
                      fingerprints=frozenset(digests.values()),
                      blocking=any(finding_fails(f, settings.fail_on) for f in findings))


# A group's first fixes become one committable suggestion as long as they cover this many lines at most (with
# the unchanged lines between them); the fixes farther on are shown line by line in the comment.
MAX_GROUP_SUGGESTION_LINES = 12
# Fixes shown one by one in a group's comment; `torchreview check --fix` applies the rest.
MAX_LISTED_FIXES = 10
# A group's findings whose messages differ are listed with their messages up to this many, then by line.
MAX_LISTED_MESSAGES = 20
# Grouping across files stops at this many findings in one comment: each carries a fingerprint marker (about 50
# characters), and a comment over GitHub's 65,535 characters would fail the whole review.
MAX_FINDINGS_PER_COMMENT = 300


def group_findings(findings: Sequence[Finding], across_files: bool = True,
                   rule_from_files: int = 0) -> list[list[Finding]]:
    """Findings that are one thing to say: every finding of one rule in one file (a notebook's cells are
    one file); ``across_files``, the files where the same rule says the same message (`dataiter.next()` in 31
    notebooks: one group); ``rule_from_files`` (when not 0), every finding of a rule found in that many files or
    more (a pattern across the pull request, each site listed with its message). Findings in file, cell and
    line order; groups in the order of their most severe finding."""
    groups: dict[tuple[str, str], list[Finding]] = {}
    for finding in findings:
        groups.setdefault((finding.path, finding.rule), []).append(finding)
    parent = {key: key for key in groups}  # a small union-find over the (file, rule) groups

    def root(key: tuple[str, str]) -> tuple[str, str]:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    size = {key: len(same) for key, same in groups.items()}
    first_with: dict[tuple, tuple[str, str]] = {}
    files_of_rule = Counter(rule for _, rule in groups)
    for key, same in groups.items():
        for finding in same:
            joins = []
            if across_files:
                joins.append((finding.rule, finding.message))
            if across_files and rule_from_files and files_of_rule[finding.rule] >= rule_from_files:
                joins.append((finding.rule,))
            for join in joins:
                mine, other = root(key), root(first_with.setdefault(join, key))
                if mine == other:
                    continue
                if size[mine] + size[other] <= MAX_FINDINGS_PER_COMMENT:
                    parent[mine] = other
                    size[other] += size[mine]
                else:
                    first_with[join] = mine  # that comment is full: the next files join this one
    joined: dict[tuple[str, str], list[Finding]] = {}
    for key, same in groups.items():
        joined.setdefault(root(key), []).extend(same)
    ordered = [sorted(same, key=lambda f: (f.path, f.cell or 0, f.line, f.column)) for same in joined.values()]
    return sorted(ordered, key=lambda g: min(severity_order(f) for f in g))


def group_suggestion(group: Sequence[Finding], diff: FileDiff,
                     source: Optional[str]) -> Optional[tuple[Placement, list[Finding]]]:
    """One suggestion that applies the fixes of a group's first findings together (four ``torch.load``
    lines in a row: one committable change), and the findings it fixes; None when fewer than two fixes lie
    within ``MAX_GROUP_SUGGESTION_LINES`` of the first, in one hunk."""
    if source is None or is_notebook_finding(group[0]):
        return None  # a notebook's fix is JSON strings of one cell: placement() makes it, for one line
    cluster: list[Finding] = []
    for finding in group:
        fix = finding.fix
        if fix is None or (cluster and (fix.start_line <= cluster[-1].fix.end_line  # overlapping: one moves the other
                                        or fix.end_line - cluster[0].fix.start_line >= MAX_GROUP_SUGGESTION_LINES)):
            break
        cluster.append(finding)
    if len(cluster) < 2:
        return None
    start, end = cluster[0].fix.start_line, cluster[-1].fix.end_line
    if not suggestion_fits(Fix(start, end, ""), diff, source):
        return None
    together = _applied_together(source, start, end, [f.fix for f in cluster], all(f.fix.safe for f in cluster))
    together = with_local_import_removal(together, diff, source, group[0].path)
    return Placement(together.start_line, together.end_line, together), cluster


def _applied_together(source: str, start: int, end: int, fixes: Sequence[Fix], safe: bool) -> Fix:
    """One fix of lines ``start..end`` that applies ``fixes`` (inside those lines, not overlapping) together."""
    lines = source.splitlines(keepends=True)[start - 1:end]
    for fix in sorted(fixes, key=lambda f: f.start_line, reverse=True):  # bottom up: the lines above stay valid
        lines[fix.start_line - start:fix.end_line - start + 1] = fix.replacement.splitlines(keepends=True)
    return Fix(start, end, "".join(lines), safe)


def with_local_import_removal(fix: Fix, diff: FileDiff, source: Optional[str], path: str) -> Fix:
    """``fix``, grown to also remove the imports it leaves unused (``Variable(x)`` -> ``x`` frees ``from
    torch.autograd import Variable``) when the import is near (the whole within ``MAX_GROUP_SUGGESTION_LINES``)
    and in the fix's hunk: a suggestion replaces one run of lines, so an import farther away is left to
    ``torchreview check --fix``."""
    if source is None:
        return fix
    edits = with_freed_imports(source, fix, path)
    if len(edits) == 1:
        return fix
    start, end = min(e.start_line for e in edits), max(e.end_line for e in edits)
    if end - start >= MAX_GROUP_SUGGESTION_LINES or not suggestion_fits(Fix(start, end, ""), diff, source):
        return fix
    return _applied_together(source, start, end, edits, fix.safe)


@dataclass
class CommentPlan:
    """One inline comment: one or more groups of findings placed on one line. ``suggested``: the findings
    (of the first group) that the placement's committable suggestion fixes."""

    path: str
    where: Placement
    groups: list[list[Finding]] = field(default_factory=list)
    suggested: Sequence[Finding] = ()

    def add(self, group: list[Finding]) -> None:
        if self.groups and any(f.fix is not None for f in group):
            # two groups with fixes on one line: their suggestions would overlap, so neither is committable
            self.where = Placement(self.where.line, self.where.line, note=self.where.note)
            self.suggested = ()
        self.groups.append(group)

    def to_comment(self, digests: Mapping[Finding, str]) -> dict:
        body = group_comment_body(self.groups, digests, self.where.suggestion, self.suggested, here=self.path)
        if self.where.note:
            body = f"{message(self.where.note)}:\n\n{body}"
        comment = {"path": self.path, "line": self.where.line, "side": "RIGHT", "body": body}
        if self.where.start_line != self.where.line:
            comment.update(start_line=self.where.start_line, start_side="RIGHT")
        return comment


def group_comment_body(groups: Sequence[Sequence[Finding]], digests: Mapping[Finding, str],
                       suggestion: Optional[Fix] = None, suggested: Sequence[Finding] = (), *,
                       here: Optional[str] = None) -> str:
    """The body of a comment on file ``here`` covering ``groups`` (each one rule's findings in one file, or
    one finding repeated in several files). ``suggestion`` (committable) fixes the ``suggested`` findings, all
    of the first group; the other findings' fixes are shown line by line, naming their file when it is not
    ``here``."""
    if len(groups) == 1 and len(groups[0]) == 1 and groups[0][0].path == (here or groups[0][0].path):
        finding = groups[0][0]
        return comment_body(finding, digests[finding], suggestion)
    parts: list[str] = []
    for index, group in enumerate(groups):
        first = group[0]
        where = "in this file" if {f.path for f in group} <= {here or first.path} else "in this pull request"
        if parts:
            parts.append("")
        parts += [f"{SEVERITY_BADGES[max(f.severity for f in group)]} · {code_span(first.rule)} "
                  f"{literal(first.slug)}", ""]
        if len({f.message for f in group}) == 1:
            parts.append(message(first.message))
            if len(group) > 1:
                parts += ["", f"The same {'finding' if len(group) == 2 else 'pattern'} "
                              f"{'on' if where == 'in this file' else 'in'} {line_list(group, here)} "
                              f"({len(group)} {where})."]
        else:
            shown = group[:MAX_LISTED_MESSAGES]
            parts += [f"{len(group)} findings {where}:", ""]
            parts += [f"- {line_name(f, here)}: {message(f.message)}" for f in shown]
            if len(group) > len(shown):
                parts.append(f"- and the same on {line_list(group[len(shown):], here)}")
        mine = suggested if index == 0 and suggestion is not None else ()
        parts += group_fixes(group, suggestion if mine else None, mine, here)
        why = rule_why(first)
        if why:
            parts += ["", f"**Why:** {message(why)}"]
    members = [f for group in groups for f in group]
    parts += ["", FEEDBACK_HOWTO]
    body = hard_cap("\n".join(parts), MAX_MARKDOWN_CHARS - 100 * (len(members) + 2))
    return body + "\n\n" + fingerprint_markers(members, digests)


def line_name(finding: Finding, here: Optional[str] = None) -> str:
    """``line 4``, ``cell 2, line 4``; in another file than ``here`` (the commented one) ``` `b.py` line 4 ```."""
    name = f"cell {finding.cell}, line {finding.line}" if finding.cell is not None else f"line {finding.line}"
    return name if here is None or finding.path == here else f"{code_span(finding.path)} {name}"


def line_list(group: Sequence[Finding], here: Optional[str] = None) -> str:
    """``lines 3, 9, 15``; in a notebook ``cell 2, lines 3, 9; cell 5, line 1``. When the sites are in several
    files, each file's after its name, the commented file (``here``) marked: ``` `a.py` (here): line 3; `b.py`:
    lines 4, 8```."""
    by_path: dict[str, dict[Optional[int], list[int]]] = {}
    for finding in group:
        by_path.setdefault(finding.path, {}).setdefault(finding.cell, []).append(finding.line)

    def lines_of(by_cell: dict[Optional[int], list[int]]) -> str:
        return "; ".join((f"cell {cell}, " if cell is not None else "") + ("lines " if len(lines) > 1 else "line ")
                         + ", ".join(map(str, lines)) for cell, lines in by_cell.items())

    if here is None or set(by_path) == {here}:
        return "; ".join(lines_of(by_cell) for by_cell in by_path.values())
    return "; ".join(f"{code_span(path)}{' (here)' if path == here else ''}: {lines_of(by_cell)}"
                     for path, by_cell in by_path.items())


def group_fixes(group: Sequence[Finding], suggestion: Optional[Fix], suggested: Sequence[Finding],
                here: Optional[str] = None) -> list[str]:
    """A group's mechanical fixes: the committable suggestion, then the fix of each other line."""
    fixed = [f for f in group if f.fix is not None]
    if not fixed:
        return []
    parts: list[str] = []
    if suggestion is not None:
        parts += ["", f"Suggested change ({line_list(suggested)}):", "", suggestion_block(suggestion.replacement)]
    rest = [f for f in fixed if f not in suggested]
    for finding in rest[:MAX_LISTED_FIXES]:
        parts += ["", f"Fix for {line_name(finding, here)}:", "", code_block(finding.fix.replacement, "python")]
    if rest:
        command = "torchreview check --fix" + ("" if all(f.fix.safe for f in fixed) else " --unsafe-fixes")
        parts += ["", f"`{command}` applies {'it' if len(fixed) == 1 else f'all {len(fixed)}'}."]
    return parts


def no_issues_verdict(pr: PullRequestAnalysis) -> str:
    text = "✅ **torchreview**: no issues found on the changed lines."
    if pr.notes:
        text += f" {count_phrase(len(pr.notes), 'file note')} in the check run (files not analyzed)."
    return text


def review_verdict(findings: Sequence[Finding], settings: ReviewSettings) -> str:
    blocking = sum(1 for f in findings if finding_fails(f, settings.fail_on))
    badge = SEVERITY_BADGES[max(f.severity for f in findings)].split()[0]
    verdict = f"{badge} **torchreview found {count_phrase(len(findings), 'issue')}** in this pull request"
    if blocking:
        verdict += f"; {blocking} at or above `{settings.fail_on.label}` fail the check"
    return verdict + "."


def review_body(findings: Sequence[Finding], overflow: Sequence[Finding], unplaceable: Sequence[Finding],
                pr: PullRequestAnalysis, settings: ReviewSettings) -> str:
    head = [review_verdict(findings, settings), "", f"**Totals:** {severity_totals(findings)}"]
    if pr.notes:
        head += ["", f"ℹ️ {count_phrase(len(pr.notes), 'file')} could not be fully analyzed; see the check run."]
    sections = [
        ("More findings (over the inline comment limit)", list(overflow)),
        ("Not on lines of the diff (unchanged lines, notebook cells the diff does not show)", list(unplaceable)),
    ]
    listed = [(title, f) for title, group in sections for f in group]

    def render(shown: int) -> str:
        lines = list(head)
        for title, group in sections:
            rows = [f for t, f in listed[:shown] if t == title]
            if rows:
                lines += ["", f"#### {title}", "", *findings_table(rows, with_rule=True)]
        more = more_findings_line(len(listed) - shown, "see the check run")
        return "\n".join(lines + (["", more] if more else []))

    return fit_shown_count(render, len(listed))


def findings_table(findings: Sequence[Finding], *, with_rule: bool) -> list[str]:
    if with_rule:
        rows = ["| Severity | File:line | Rule | Message |", "|---|---|---|---|"]
        rows += [f"| {SEVERITY_BADGES[f.severity]} | {table_cell(code_span(location(f)))} | "
                 f"{table_cell(code_span(f.rule))} {table_cell(literal(f.slug))} | {table_cell(message(f.message))} |"
                 for f in findings]
    else:
        rows = ["| Severity | File:line | Issue |", "|---|---|---|"]
        rows += [f"| {SEVERITY_BADGES[f.severity]} | {table_cell(code_span(location(f)))} | "
                 f"{table_cell(code_span(f.rule))} {table_cell(message(f.message))} |" for f in findings]
    return rows


# ---- inline comments ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Placement:
    start_line: int
    line: int
    suggestion: Optional[Fix] = None
    note: Optional[str] = None  # placed on a related site: what this line has to do with the finding


def placement(finding: Finding, diff: FileDiff, source: Optional[str]) -> Optional[Placement]:
    """Where an inline comment can go so GitHub accepts it, or None (then it goes in the body)."""
    if not diff.has_patch:
        return None
    if is_notebook_finding(finding):
        # GitHub diffs the notebook's JSON: comment on the JSON line that holds the cell's line,
        # with the fix as JSON strings.
        if finding.fix is not None and finding.cell is not None and source is not None:
            fix = json_fix(source, _json_source_lines(source).get(finding.cell, []), finding.fix,
                           lines=source.json_lines if isinstance(source, LaidOutNotebook) else None)
            if fix is not None and suggestion_fits(fix, diff, source):
                return Placement(fix.start_line, fix.end_line, fix)
        lines = notebook_json_lines(finding, source)
    else:
        fix = finding.fix
        if fix is not None and suggestion_fits(fix, diff, source):
            fix = with_local_import_removal(fix, diff, source, finding.path)
            return Placement(fix.start_line, fix.end_line, fix)
        lines = list(finding_lines(finding))
    for candidates in (diff.added, diff.commentable):  # an added line reads better than context
        line = next((n for n in lines if n in candidates), None)
        if line is not None:
            return Placement(line, line)
    for site in finding.related:  # the finding's own line is outside the diff: comment on the changed site
        site_lines = list(range(site.line, max(site.line, site.end_line) + 1))
        at = f"line {finding.line}"
        if is_notebook_finding(finding):  # a site is in the finding's cell: its lines are cell lines
            site_lines = notebook_json_lines(replace(finding, line=site.line, end_line=site.end_line), source)
            at = f"cell {finding.cell}, line {finding.line}"
        for candidates in (diff.added, diff.commentable):
            line = next((n for n in site_lines if n in candidates), None)
            if line is not None:
                return Placement(line, line, note=f"{site.message}; the finding is at {at}")
    return None


def notebook_json_lines(finding: Finding, source: Optional[str]) -> list[int]:
    """The lines of the ``.ipynb`` text that hold a notebook finding's cell lines; [] when unknown."""
    if source is None or finding.cell is None:
        return []
    cell_lines = _json_source_lines(source).get(finding.cell, [])
    return [cell_lines[n - 1] for n in finding_lines(finding) if 0 < n <= len(cell_lines)]


class LaidOutNotebook(str):
    """A notebook's text that knows where its cells' lines are in it, and those lines' text
    (:func:`json_source_layout`), worked out beforehand: the App does it in an isolated child (bot.pipeline),
    as every parse of PR bytes, never here."""

    __slots__ = ("cell_lines", "json_lines")

    def __new__(cls, text: str, cell_lines: Mapping[int, list[int]],
                json_lines: Mapping[int, str]) -> "LaidOutNotebook":
        laid_out = super().__new__(cls, text)
        laid_out.cell_lines, laid_out.json_lines = dict(cell_lines), dict(json_lines)
        return laid_out


@lru_cache(maxsize=4)  # asked for each of a notebook's findings; cleared after each plan
def _json_source_lines(text: str) -> dict[int, list[int]]:
    return text.cell_lines if isinstance(text, LaidOutNotebook) else json_source_lines(text)


def cause_placement(finding: Finding, diff: FileDiff, source: Optional[str]) -> Optional[Placement]:
    """For a finding this PR introduced away from its own line: the changed line of the same function
    nearest to it, naming what the PR removed there (``optimizer.zero_grad()`` taken out of the loop)."""
    if is_notebook_finding(finding) or not diff.has_patch or not diff.commentable:
        return None
    first, last = enclosing_function_span(source, finding.line)
    in_scope = [n for n in diff.commentable if first <= n <= last]
    if not in_scope:
        return None
    removed = [(anchor, text.strip()) for anchor, text in diff.removed if first <= anchor <= last + 1 and text.strip()]
    if removed:
        anchor, text = min(removed, key=lambda r: abs(r[0] - finding.line))
        line = min(in_scope, key=lambda n: (abs(n - anchor), n))
        shown = text if len(text) <= 80 else text[:77] + "..."
        note = f"this pull request removes {code_span(shown)} here, which causes the finding at line {finding.line}"
    else:
        line = min(in_scope, key=lambda n: (n not in diff.added, abs(n - finding.line)))
        note = f"this change causes the finding at line {finding.line}"
    return Placement(line, line, note=note)


def enclosing_function_span(source: Optional[str], line: int) -> tuple[int, int]:
    """Lines of the innermost function around ``line`` (the whole file when there is none)."""
    import ast

    total = len((source or "").splitlines()) or line
    if not source:
        return 1, total
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return 1, total
    best = (1, total)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= (node.end_lineno or line):
            if node.lineno >= best[0]:
                best = (node.lineno, node.end_lineno or line)
    return best


_LINE_BREAKS = ("\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")


def _line_count(text: str) -> int:
    """``len(text.splitlines())``, counted in C without making the lines (a notebook's JSON may hold millions)."""
    if not text:
        return 0
    breaks = sum(text.count(mark) for mark in _LINE_BREAKS) - text.count("\r\n")
    return breaks if text[-1] in _LINE_BREAKS else breaks + 1


def suggestion_fits(fix: Fix, diff: FileDiff, source: Optional[str]) -> bool:
    """A suggestion replaces exactly the commented lines, so they must all lie in one hunk."""
    if fix.start_line < 1 or fix.end_line < fix.start_line:
        return False
    if source is not None and fix.end_line > _line_count(source):
        return False  # the fix was computed on another version of the file
    return diff.in_one_hunk(fix.start_line, fix.end_line)


def review_comment(finding: Finding, where: Placement, digest: str) -> dict:
    """One ``comments[]`` item of the create-review request."""
    comment = {"path": finding.path, "line": where.line, "side": "RIGHT",
               "body": comment_body(finding, digest, where.suggestion)}
    if where.start_line != where.line:
        comment.update(start_line=where.start_line, start_side="RIGHT")
    return comment


def comment_body(finding: Finding, digest: str, suggestion: Optional[Fix] = None) -> str:
    preview = " · preview rule (never fails the check)" if finding.preview else ""
    context = f" · {finding.context}" if finding.context else ""  # "lowered: test code"
    parts = [f"{SEVERITY_BADGES[finding.severity]} · {code_span(finding.rule)} {literal(finding.slug)}{preview}{context}",
             "", message(finding.message)]
    why = rule_why(finding)
    if why:
        parts += ["", f"**Why:** {message(why)}"]
    if suggestion is not None:
        parts += ["", suggestion_block(suggestion.replacement)]
    parts += ["", FEEDBACK_HOWTO]
    body = hard_cap("\n".join(parts), MAX_MARKDOWN_CHARS - 200)
    return body + "\n\n" + fingerprint_marker(finding, digest)


def suggestion_block(replacement: str) -> str:
    """A committable suggestion; the fence outgrows any backtick run in the code."""
    code = replacement[:-1] if replacement.endswith("\n") else replacement
    fence = "`" * max(3, longest_backtick_run(code) + 1)
    return f"{fence}suggestion\n{code}\n{fence}"


# ---- check run -----------------------------------------------------------------------------

@dataclass
class CheckRunPlan:
    conclusion: str  # success | failure
    title: str
    summary: str
    text: str = ""
    annotations: list[dict] = field(default_factory=list)

    def output(self, annotations: Optional[list[dict]] = None) -> dict:
        """The ``output`` object of a create/update check-run request (at most 50 annotations)."""
        chosen = self.annotations[:ANNOTATIONS_PER_REQUEST] if annotations is None else annotations
        output = {"title": self.title, "summary": self.summary, "annotations": list(chosen)}
        if self.text:
            output["text"] = self.text
        return output


def no_files_plan(notes: Sequence[FileNote] = ()) -> CheckRunPlan:
    summary = "This pull request changes no Python files or notebooks that torchreview analyzes."
    if notes:
        summary += "\n\n" + "\n".join(notes_section(notes))
    return CheckRunPlan("success", "No PyTorch files changed", hard_cap(summary))


def config_error_plan(error: str) -> CheckRunPlan:
    """Invalid repository configuration: say exactly what is wrong; no review comments."""
    summary = ("torchreview could not read this repository's configuration (read from the base branch), "
               "so nothing was reviewed. Fix it and re-run.\n\n" + code_block(error))
    return CheckRunPlan("failure", "Invalid torchreview configuration", hard_cap(summary))


def superseded_plan(old_sha: str, new_sha: str) -> CheckRunPlan:
    return CheckRunPlan("neutral", "Superseded by a newer commit",
                        f"A newer commit ({new_sha[:7]}) was pushed; see the torchreview check run on that commit. "
                        f"This run for {old_sha[:7]} was stopped.")


def job_failed_plan(error: str) -> CheckRunPlan:
    summary = ("The review job failed and will not be retried. Comment `/review` on the pull request or "
               "re-run this check to try again.\n\n" + code_block(redact_urls(error)[:2000]))
    return CheckRunPlan("failure", "torchreview could not complete the review", hard_cap(summary))


def plan_check_run(pr: PullRequestAnalysis, settings: ReviewSettings = ReviewSettings()) -> CheckRunPlan:
    if not pr.reviewed_files and not pr.findings:
        return no_files_plan(pr.notes)
    findings = keep_findings(pr.findings, pr.diffs, settings,
                             introduced=introduced_by(pr, fingerprints_for(pr.findings, pr.sources)))
    failing = any(finding_fails(f, settings.fail_on) for f in findings)
    try:
        annotations = [annotation(f, pr.sources.get(f.path)) for f in findings]
    finally:
        _json_source_lines.cache_clear()
    return CheckRunPlan(
        conclusion="failure" if failing else "success",
        title=check_title(findings, settings),
        summary=check_summary(findings, pr, settings),
        text=rule_reference(findings),
        annotations=annotations,
    )


def check_title(findings: Sequence[Finding], settings: ReviewSettings) -> str:
    if not findings:
        return "No issues found"
    blocking = sum(1 for f in findings if finding_fails(f, settings.fail_on))
    title = count_phrase(len(findings), "issue")
    return f"{title} ({blocking} at or above {settings.fail_on.label})" if blocking else title


def check_summary(findings: Sequence[Finding], pr: PullRequestAnalysis, settings: ReviewSettings) -> str:
    hidden = len(pr.findings) - len(findings)
    head = [summary_verdict(findings, settings), "", f"**Totals:** {severity_totals(findings)}"]
    if hidden > 0:
        head += ["", f"{count_phrase(hidden, 'finding')} on lines this pull request did not change "
                     f"{'is' if hidden == 1 else 'are'} not reported (filter: `{settings.filter}`)."]
    tail = ["", *actions_section(findings), "", *files_section(pr.reviewed_files)]
    if pr.notes:
        tail += ["", *notes_section(pr.notes)]
    if pr.suppressed or pr.skipped_by_comment:
        tail += ["", *suppressed_section(pr.suppressed, pr.skipped_by_comment)]
    if pr.feedback_note:
        tail += ["", f"**Feedback:** {pr.feedback_note}"]

    def render(shown: int) -> str:
        lines = head + category_tables(findings[:shown])
        more = more_findings_line(len(findings) - shown, "see annotations")
        return "\n".join(lines + (["", more] if more else []) + tail)

    return fit_shown_count(render, len(findings))


def summary_verdict(findings: Sequence[Finding], settings: ReviewSettings) -> str:
    if not findings:
        return "### ✅ No issues found on the changed lines"
    blocking = sum(1 for f in findings if finding_fails(f, settings.fail_on))
    if blocking:
        return (f"### ❌ {count_phrase(blocking, 'issue')} at or above `{settings.fail_on.label}` "
                f"must be fixed ({len(findings)} in total)")
    if any(f.preview and f.severity >= settings.fail_on for f in findings):  # at the level, but a preview rule's
        return (f"### ⚠️ {count_phrase(len(findings), 'issue')} below `{settings.fail_on.label}` or from preview "
                f"rules (they never fail it); the check passes")
    return f"### ⚠️ {count_phrase(len(findings), 'issue')} below `{settings.fail_on.label}`; the check passes"


def category_tables(findings: Sequence[Finding]) -> list[str]:
    """One table per category; the category holding the most severe finding comes first."""
    titles = {c.value: c.title for c in Category}
    lines: list[str] = []
    for category in dict.fromkeys(f.category for f in findings):  # findings are most severe first
        rows = [f for f in findings if f.category == category]
        lines += ["", f"#### {titles.get(category) or literal(category)}", "", *findings_table(rows, with_rule=False)]
    return lines


def actions_section(findings: Sequence[Finding]) -> list[str]:
    if not findings:
        return []
    counts = Counter(f.rule for f in findings)
    first_by_rule: dict[str, Finding] = {}
    for finding in findings:  # already most severe first
        first_by_rule.setdefault(finding.rule, finding)
    lines = ["### Recommended actions", ""]
    for rule_id, finding in first_by_rule.items():
        times = f" ({counts[rule_id]}×)" if counts[rule_id] > 1 else ""
        lines.append(f"- [ ] {SEVERITY_BADGES[finding.severity]} {code_span(rule_id)} {literal(finding.slug)}{times}: "
                     f"{message(rule_summary(finding))}")
    return lines


def files_section(reviewed_files: Sequence[str]) -> list[str]:
    files = sorted(reviewed_files)
    lines = [f"<details><summary>Files reviewed ({len(files)})</summary>", ""]
    lines += [f"- {code_span(path)}" for path in files[:MAX_LISTED_FILES]]
    if len(files) > MAX_LISTED_FILES:
        lines.append(f"- … and {len(files) - MAX_LISTED_FILES} more files")
    return lines + ["", "</details>"]


def notes_section(notes: Sequence[FileNote]) -> list[str]:
    lines = ["### Files not (fully) analyzed", ""]
    for note in notes[:MAX_LISTED_NOTES]:
        explanation = NOTE_EXPLANATIONS.get(note.kind, note.kind)
        detail = f": {literal(note.message)}" if note.message else ""
        lines.append(f"- {code_span(note.path)}: {literal(explanation)}{detail}")
    if len(notes) > MAX_LISTED_NOTES:
        lines.append(f"- … and {len(notes) - MAX_LISTED_NOTES} more files not analyzed")
    return lines


def suppressed_section(suppressed: Sequence[Finding], skipped_files: Sequence[str]) -> list[str]:
    """What comments in the pull request's files silenced (a count and the first few): a ``# noqa`` is
    code too, and whoever adds one hides a finding from this review."""
    count = len(suppressed) + len(skipped_files)
    lines = [f"<details><summary>Silenced by comments in the code ({count})</summary>", ""]
    lines += [f"- {code_span(path)}: not analyzed (`# torchreview: skip-file`)" for path in skipped_files]
    lines += [f"- {code_span(location(f))}: {code_span(f.rule)} {literal(f.slug)} (`# noqa` or "
              "`# torchreview: ignore`)" for f in suppressed]
    if count > MAX_LISTED_SUPPRESSED:
        lines = lines[:2 + MAX_LISTED_SUPPRESSED] + [f"- … and {count - MAX_LISTED_SUPPRESSED} more"]
    return lines + ["", "</details>"]


def rule_reference(findings: Sequence[Finding]) -> str:
    """Check-run ``text``: the docs of each rule found, most severe first."""
    blocks = []
    for rule_id in dict.fromkeys(f.rule for f in findings):
        rule = get_rule(rule_id)
        if rule is not None:
            blocks.append(f"#### {rule.id} {rule.slug}\n\n{textwrap.dedent(rule.why).strip()}")

    def render(shown: int) -> str:
        hidden = len(blocks) - shown
        more = [f"… and {count_phrase(hidden, 'more rule')} (run `torchreview rule ID`)"] if hidden else []
        return "\n\n".join(blocks[:shown] + more)

    return fit_shown_count(render, len(blocks))


def annotation(finding: Finding, source: Optional[str] = None) -> dict:
    """A check-run annotation; a notebook finding sits on the JSON line of its cell line (line 1 when
    that is unknown), with the cell named in the message."""
    text = finding.message  # annotations are plain text, not Markdown
    if is_notebook_finding(finding):
        start = end = next(iter(notebook_json_lines(finding, source)), 1)
        text = f"{location(finding)}: {text}"
    else:
        start, end = finding.line, max(finding.line, finding.end_line)
    result = {
        "path": finding.path,
        "start_line": start,
        "end_line": end,
        "annotation_level": ANNOTATION_LEVELS[finding.severity],
        "message": truncate_utf8(text, MAX_ANNOTATION_BYTES),
        "title": rule_title(finding)[:MAX_ANNOTATION_TITLE_CHARS],
    }
    if start == end and not is_notebook_finding(finding) and finding.column >= 1:
        result["start_column"] = finding.column
        result["end_column"] = max(finding.column, finding.end_column - 1)  # engine columns end exclusive
    details = annotation_details(finding)
    if details:
        result["raw_details"] = truncate_utf8(details, MAX_ANNOTATION_BYTES)
    return result


def annotation_details(finding: Finding) -> str:
    parts = [rule_why(finding)]
    if finding.fix is not None:
        cell = f"cell {finding.cell}, " if finding.cell is not None else ""
        parts.append(f"Suggested replacement for {cell}lines {finding.fix.start_line}-{finding.fix.end_line}:\n"
                     f"{finding.fix.replacement}")
    return "\n\n".join(p for p in parts if p)


def batches(annotations: Sequence[dict], size: int = ANNOTATIONS_PER_REQUEST) -> Iterator[list[dict]]:
    """Annotations in groups GitHub accepts per create/update request."""
    for start in range(0, len(annotations), size):
        yield list(annotations[start: start + size])
