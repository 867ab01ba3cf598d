"""One review job: fetch the PR, analyze the changed files, then talk back like a good colleague.

Idempotent and safe to retry: the check run of a head SHA is found and reused; every inline comment
carries a fingerprint, and a finding that already has a comment is never commented again; findings
that are gone get their thread resolved (or the comment deleted); one summary comment is edited in
place; a per-PR lock keeps two jobs from interleaving, and a job for a superseded head posts nothing.
"""
from __future__ import annotations

import base64
import hashlib
import logging
import shutil
import tempfile
import time
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

import requests
from github import GithubException

from analyzers.config import CONFIG_FILES_IN_ORDER, FILE_TIMEOUT_DEFAULT, Config, ConfigError, parse_config_text
from analyzers.cache import ResultCache
from analyzers.engine import analyze_text, decode_source
from analyzers.isolation import run_isolated
from analyzers.fingerprint import fingerprints_for
from analyzers.model import FileError, FileResult, Finding
from analyzers.notebook import NotebookError, read_cells
from analyzers.pickles import checkpoint_result, is_checkpoint
from analyzers.program.modules import RepositoryIndex
from bot import feedback
from bot import review as compose
from bot.conversation import (close_gone, gone_comments, is_ours, our_review_comments, resolved_by_people,
                              review_threads, unique_comments, upsert_summary)
from bot.github_client import BlobTooLarge, commit_ref, our_check_runs, stream_blob
from bot.jobs import REJUDGED_REASONS, CommandJob, ReviewJob, SmokeJob, config_commit, enqueue_smoke
from bot.store import WriteBudget, held_lock, results_cache

log = logging.getLogger("torchreview.pipeline")

CHECK_NAME = "torchreview"
LOCK_TTL = 60  # renewed while the job runs (bot.store.held_lock): a killed worker's lock is gone within a minute
# The work one review may do: files fetched and analyzed, and their bytes; the rest is reported skipped.
MAX_REVIEW_FILES = 1000
MAX_REVIEW_BYTES = 20 << 20  # about a minute of parsing
# Reading a notebook's JSON (outputs included) in an isolated child: well under a worker's memory (the deploy
# gives it 2 GiB), so a hostile notebook meets the child's limit (MemoryError) and not the pod's OOM killer.
NOTEBOOK_MEMORY_BYTES = 1 << 30
NOTEBOOK_SECONDS = 60.0
REVIEWED_SUFFIXES = (".py", ".ipynb")
# Checkpoint files a PR adds or changes are streamed to a temporary copy on disk (never held in memory) and scanned
# there (analyzers.pickles); their bytes count against their own budget (GitHub stores at most 100 MiB per file
# outside LFS), which bounds the download itself.
MAX_REVIEW_CHECKPOINT_BYTES = 512 << 20
RERUN_ACTION = {"label": "Re-run review", "description": "Review this commit again", "identifier": "rerun"}
# Explicit requests: a fresh check run, and policy skips (draft, label...) do not apply.
FORCED_REASONS = {"command.review", "check_run.rerequested", "check_suite.rerequested", "check_run.requested_action"}


class LockBusy(Exception):
    def __init__(self, delay: float = 5.0) -> None:
        super().__init__("another job is reviewing this pull request")
        self.delay = delay


@dataclass
class ChangedFiles:
    """What the PR changed, as analysis input; every skipped file is explained in ``notes``."""

    sources: dict[str, str] = field(default_factory=dict)  # path -> head source text
    base_sources: dict[str, str] = field(default_factory=dict)  # head path -> base source (changed files only)
    blobs: dict[str, str] = field(default_factory=dict)  # path -> git blob SHA (the results cache's content key)
    patches: dict[str, Optional[str]] = field(default_factory=dict)  # path -> GitHub patch (hunks); None: none sent
    notes: list[FileError] = field(default_factory=list)
    reviewed: list[str] = field(default_factory=list)
    # checkpoint path -> its head content in a temporary file (scanned there, never decoded); see close()
    checkpoints: dict[str, Path] = field(default_factory=dict)
    scratch: Optional[Path] = None

    def checkpoint_path(self, path: str) -> Path:
        """Where the head content of the checkpoint ``path`` is streamed to (see ``checkpoints``)."""
        if self.scratch is None:
            self.scratch = Path(tempfile.mkdtemp(prefix="torchreview-checkpoints-"))
        return self.scratch / f"{len(self.checkpoints)}-{Path(path).name}"

    def close(self) -> None:
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


@dataclass
class RepositoryContext:
    index: RepositoryIndex
    scratch: Path

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def run_review(job, clients, store) -> str:
    from bot import metrics

    started = time.perf_counter()
    gh = clients.for_installation(job.installation_id, job.repository)
    repo = gh.get_repo(job.repository)
    pr = repo.get_pull(job.pull_number)
    if job.reason == "pull_request.closed":  # nothing to review: read what reviewers said, once more
        ours = unique_comments(our_review_comments(pr, clients.bot_login()))
        recorded = feedback.collect(pr, job.repository, ours, store, lambda user: is_ours(user, clients.bot_login()),
                                    installation=job.installation_id)
        if ours:  # threads people resolved since the last review, findings still there
            feedback.record_events(store, feedback.RESOLVED_UNFIXED, job.installation_id, job.repository, pr.number,
                                   [c.comment.body for c in resolved_by_people(
                                       ours, review_threads(gh, job.repository, pr.number), clients.bot_login())])
        return f"closed: {recorded} new verdict(s) on our comments"
    head = pr.head.sha
    budget = WriteBudget(store, job.installation_id)
    pr_lock = f"torchreview:lock:{job.repository}#{job.pull_number}"
    if job.head_sha and job.head_sha != head and job.reason == "command.review":
        # Decided under the PR's lock: another attempt of this command may still be running (redelivered
        # after the visibility timeout) and about to complete its answer on the old head.
        with held_lock(store, pr_lock, LOCK_TTL) as token:
            if token is None:
                raise LockBusy()
            if not _answered(repo, job):
                # The head moved before this command's first answer (an attempt failed, or died, before
                # completing its run): close what it left, answer on the head as it is now, remember that one.
                _close_superseded(repo, job.head_sha, head, budget)
                store.put(command_head_key(job.installation_id, job.delivery), head, COMMAND_HEAD_TTL)
                job = replace(job, head_sha=head)
    if job.head_sha and job.head_sha != head:
        _close_superseded(repo, job.head_sha, head, budget)
        metrics.REVIEWS.labels(outcome="superseded").inc()
        return f"superseded: {job.head_sha[:7]} is no longer the head ({head[:7]})"
    with held_lock(store, pr_lock, LOCK_TTL) as token:
        if token is None:
            raise LockBusy()
        outcome = ReviewRun(job, gh, repo, pr, head, budget, clients.bot_login(), store, results_cache(store)).run()
    metrics.REVIEWS.labels(outcome="superseded" if outcome.startswith("superseded") else "done").inc()
    metrics.REVIEW_SECONDS.observe(time.perf_counter() - started)
    return outcome


@dataclass
class ReviewRun:
    job: object
    gh: object
    repo: object
    pr: object
    head: str
    budget: WriteBudget
    bot_login: Optional[str]
    store: object = None
    results: Optional[ResultCache] = None  # analysis results by blob SHA: a re-review analyzes what changed

    def run(self) -> str:
        try:
            config = load_base_config(self.repo, config_commit(self.store, self.job.repository, self.pr,
                                                               getattr(self.job, "base_sha", None)), self.store)
        except ConfigError as exc:
            self.complete(self.check_run(), compose.config_error_plan(str(exc)))
            return f"configuration error: {exc}"
        skip = None if self.job.reason in FORCED_REASONS else skip_reason(self.pr, config)
        if skip:
            return f"skipped: {skip}"
        check_run = self.check_run()
        changed = collect_changed_files(self.repo, self.pr, self.head, config)
        try:
            return self.review(check_run, changed, config)
        finally:
            changed.close()

    def review(self, check_run, changed: ChangedFiles, config: Config) -> str:
        if not changed.reviewed:
            self.complete(check_run, compose.no_files_plan(changed.notes))
            return "no PyTorch files changed"
        findings: list[Finding] = []
        suppressed: list[Finding] = []  # what comments in the code silenced: listed in the check run
        skipped_by_comment: list[str] = []
        from bot import metrics

        context = self.repository_context()
        try:
            index = context.index if context is not None else None
            # in a forked child: a file that crashes or stalls the parser becomes an error entry
            results = run_isolated(((path, changed.sources[path]) for path in changed.reviewed),
                                   lambda path, text: analyze_changed_file(changed, path, config, self.results, index,
                                                                           self.job.repository),
                                   lambda path, kind, message: FileResult(path, errors=[FileError(path, kind, message)]),
                                   seconds=app_file_seconds(config))
            notebook_layouts(changed, [path for path in changed.reviewed
                                       if path.endswith(".ipynb") and results[path].findings])
            for path in changed.reviewed:
                result = results[path]
                if self.results is not None and changed.blobs.get(path):
                    metrics.ANALYSIS_CACHE.labels(result="hit" if result.cached else "miss").inc()
                findings.extend(result.findings)
                changed.notes.extend(result.errors)
                suppressed.extend(result.suppressed)
                skipped_by_comment += [path] if result.skipped_by_comment else []
            settings = compose.ReviewSettings(fail_on=config.fail_on, max_inline_comments=config.max_inline_comments,
                                              filter=config.filter, context_lines=config.diff_context_lines,
                                              group_across_files=config.group_across_files,
                                              group_rule_from_files=config.group_rule_from_files)
            analysis = compose.PullRequestAnalysis(
                findings=findings,
                diffs={path: compose.parse_file_patch(path, patch) for path, patch in changed.patches.items()},
                sources=changed.sources, reviewed_files=changed.reviewed, notes=changed.notes,
                suppressed=suppressed, skipped_by_comment=skipped_by_comment,
                base_fingerprints=self.base_fingerprints(changed, config, index) if config.filter == "introduced" else None)
        finally:
            if context is not None:
                context.close()
        existing = our_review_comments(self.pr, self.bot_login)
        if self.store is not None:  # what reviewers said about our earlier comments, before we say more
            feedback.collect(self.pr, self.job.repository, unique_comments(existing), self.store,
                             lambda user: is_ours(user, self.bot_login), installation=self.job.installation_id)
            analysis.feedback_note = feedback.summary_line(*feedback.marked_wrong(self.store, self.job.repository))
        plan = compose.plan_review(analysis, settings, posted=frozenset(existing))
        check_plan = compose.plan_check_run(analysis, settings)
        # A push may have arrived while we analyzed: never post on a stale head.
        current = self.newer_head()
        if current:
            self.complete(check_run, compose.superseded_plan(self.head, current))
            return f"superseded during review by {current[:7]}"
        posted = []
        if plan.comments:
            event = "REQUEST_CHANGES" if config.review_event == "request_changes" and plan.blocking else "COMMENT"
            posted = self.post_review(plan, event)
        gone = gone_comments(existing, plan.fingerprints)
        # read once, for closing the gone ones and for telling which threads people resolved (feedback)
        threads = review_threads(self.gh, self.job.repository, self.pr.number) if gone or (
            existing and self.store is not None) else None
        resolved, deleted = close_gone(self.gh, self.job.repository, self.pr, gone, config.cleanup, self.bot_login,
                                       self.budget.spend, threads=threads)
        if self.store is not None:
            fixed = {c.id for c in gone}
            self.record_comment_events(posted, gone, [c for c in resolved_by_people(unique_comments(existing),
                                                                                    threads or {}, self.bot_login)
                                                      if c.id not in fixed])
        if plan.findings_count or existing:
            upsert_summary(self.repo, self.pr.number, plan.body, self.bot_login, self.budget.spend)
        # and the push may land while we post: the verdict goes to the head it judged only if it still is
        newer = complete_check_run(check_run, check_plan, self.budget, newer_head=self.newer_head)
        if newer:
            return f"superseded while posting by {newer[:7]}"
        if config.smoke.get("enabled") and self.job.reason.startswith("pull_request."):
            # Pinned to the head just reviewed; the trust policy (author's permission, no forks) is
            # checked by the smoke job, before anything runs.
            enqueue_smoke(SmokeJob(installation_id=self.job.installation_id, repository=self.job.repository,
                                   pull_number=self.pr.number, head_sha=self.head, reason="smoke.auto",
                                   delivery=self.job.delivery))
        return (f"{plan.findings_count} finding(s): {len(plan.comments)} new inline, "
                f"{len({c.id for c in existing.values()}) - len(gone)} already commented, {resolved} resolved, "
                f"{deleted} deleted; check {check_plan.conclusion}")

    def base_fingerprints(self, changed: ChangedFiles, config: Config, index=None) -> frozenset[str]:
        """Fingerprints of what the base revision of the changed files already had (under the head path,
        so a renamed file's old findings are recognised); a file new in this PR had none. The base is
        analyzed with the base's repository context and pins (its own tree), as the head is with the head's:
        a finding that depends on another file or on a pin is the PR's only when the PR made the difference
        (a pin it lowered), never because its file was edited. Without the base's tree, the head's stands in."""
        context = self.repository_context(self.pr.base.sha) if changed.base_sources else None
        try:
            base_index = context.index if context is not None else index
            results = run_isolated(((path, text) for path, text in changed.base_sources.items()),
                                   lambda path, text: analyze_text(text, path, config, repository=base_index),
                                   lambda path, kind, message: FileResult(path), seconds=app_file_seconds(config))
        finally:
            if context is not None:
                context.close()
        base_findings = [f for result in results.values() for f in result.findings]
        return frozenset(fingerprints_for(base_findings, changed.base_sources).values())

    def repository_context(self, ref: Optional[str] = None) -> Optional["RepositoryContext"]:
        """The code (``.py`` files of its zipball) and version pins (requirement files) at ``ref``, the head by
        default, for questions across files: the model class in ``model.py`` that ``train.py`` trains, the
        torch release ``requirements.txt`` allows. None when it cannot be had; the review goes on per file."""
        from analyzers.program.versions import is_pin_file
        from bot.archives import ArchiveTooLarge, download_code

        ref = ref or self.head
        scratch = Path(tempfile.mkdtemp(prefix="torchreview-context-"))
        try:
            root = download_code(self.repo, ref, scratch / "tree", also=is_pin_file)
        except (ArchiveTooLarge, GithubException, OSError, requests.RequestException, zipfile.BadZipFile) as exc:
            log.info("no repository context for %s@%s: %s", self.job.repository, ref[:7], exc)
            shutil.rmtree(scratch, ignore_errors=True)
            return None
        return RepositoryContext(RepositoryIndex(root), scratch)

    # ---- check runs ----------------------------------------------------------------------
    def check_run(self):
        """The head's check run: reused by automatic jobs (one per head), new for explicit re-runs and for a
        base change (a verdict holds for the base it was made against).
        A job that ran before (re-queued for the write budget, redelivered after its worker died, even
        after it completed the run) finds the one it created: every run, not only the newest, is listed."""
        runs = our_check_runs(self.repo, self.head, CHECK_NAME)
        own = [run for run in runs if run.external_id == self.job.delivery]
        if own:
            return own[0]
        if runs and self.job.reason not in FORCED_REASONS and self.job.reason not in REJUDGED_REASONS:
            return runs[0]  # the newest
        # A head retargeted, or whose base's configuration changed, gets a new run at once: the verdict on the old
        # base must not stand while this one is made.
        self.budget.spend()
        return self.repo.create_check_run(name=CHECK_NAME, head_sha=self.head, status="in_progress",
                                          external_id=self.job.delivery,
                                          output={"title": "Reviewing…", "summary": "torchreview is reviewing this commit."})

    def newer_head(self) -> Optional[str]:
        return head_moved_past(self.repo, self.pr.number, self.head)

    def complete(self, check_run, plan) -> None:
        complete_check_run(check_run, plan, self.budget)

    # ---- the review ----------------------------------------------------------------------
    def record_comment_events(self, posted: list[dict], fixed: list, resolved_unfixed: list) -> None:
        """What became of our comments in this review, for ``torchreview feedback``: those posted, those whose
        finding a push removed (their threads resolved or deleted), those a person resolved with it still there."""
        for kind, bodies in ((feedback.POSTED, [c["body"] for c in posted]),
                             (feedback.FIXED, [c.comment.body for c in fixed]),
                             (feedback.RESOLVED_UNFIXED, [c.comment.body for c in resolved_unfixed])):
            feedback.record_events(self.store, kind, self.job.installation_id, self.job.repository, self.pr.number,
                                   bodies)

    def post_review(self, plan, event: str) -> list[dict]:
        """Post the plan's comments in one review; the comments GitHub took."""
        body = (f"torchreview: {len(plan.comments)} new finding(s) on {self.head[:7]}. "
                "The summary comment and the check run have the whole picture.")
        commit = commit_ref(self.repo, self.head)  # not fetched: only its sha is used
        self.budget.spend()
        try:
            self.pr.create_review(commit=commit, body=body, event=event, comments=plan.comments)
            return plan.comments
        except GithubException as exc:
            if exc.status != 422:
                raise
            log.warning("review rejected (%s); re-checking comment lines against the current diff", exc.data)
        # GitHub rejects the whole review for one bad line: keep the comments that fit the diff
        # as GitHub reports it now; the summary comment still lists every finding.
        current = {f.filename: compose.parse_file_patch(f.filename, f.patch) for f in self.pr.get_files()}
        kept = [c for c in plan.comments if _comment_fits(c, current.get(c["path"]))]
        if kept:
            self.budget.spend()
            try:
                self.pr.create_review(commit=commit, body=body, event=event, comments=kept)
                return kept
            except GithubException as exc:
                if exc.status != 422:
                    raise
                log.warning("review still rejected; the findings stay in the summary comment and check run")
        return []


def head_moved_past(repo, pull_number: int, head: str) -> Optional[str]:
    """The PR's head as GitHub has it now, if a push has moved it past ``head``."""
    current = repo.get_pull(pull_number).head.sha
    return current if current != head else None


def complete_check_run(check_run, plan, budget: WriteBudget, newer_head: Optional[Callable[[], Optional[str]]] = None
                       ) -> Optional[str]:
    """``newer_head``: asked before the completing edit (after any wait for the write budget; PyGithub's
    pause between writes still comes after it); a head it names supersedes this run, which then completes
    neutral instead of judging a stale commit. That newer head, if any."""
    chunks = list(compose.batches(plan.annotations)) or [[]]
    for index, chunk in enumerate(chunks):
        output = plan.output(chunk)  # GitHub appends each update's annotations: send each once
        budget.spend()
        if index == len(chunks) - 1:
            newer = newer_head() if newer_head is not None else None
            if newer:
                plan = compose.superseded_plan(check_run.head_sha, newer)
                output = plan.output([])
            check_run.edit(status="completed", conclusion=plan.conclusion, output=output, actions=[RERUN_ACTION])
            return newer
        check_run.edit(output=output)
    return None


def skip_reason(pr, config: Config) -> Optional[str]:
    """Repository policy: drafts, skip labels, title markers, bot authors."""
    if config.skip_drafts and pr.draft:
        return "draft pull request"
    labels = {label.name for label in pr.labels}
    for label in config.skip_labels:
        if label in labels:
            return f"label {label!r}"
    title = (pr.title or "").lower()
    for marker in config.skip_title_markers:
        if marker.lower() in title:
            return f"title marker {marker!r}"
    if config.skip_bots and (pr.user.type == "Bot" or pr.user.login.endswith("[bot]")):
        return f"opened by the bot {pr.user.login}"
    return None


CONFIG_SOURCE_TTL = 24 * 3600
# in the remembered answer's key: a release that looks for other files does not read the old answers
CONFIG_CANDIDATES_ID = hashlib.sha256("\n".join(CONFIG_FILES_IN_ORDER).encode()).hexdigest()[:8]


def load_base_config(repo, base_sha: str, store=None) -> Config:
    """The repository's config from the BASE commit: a PR cannot switch its own checks off. A commit
    never changes, so with ``store`` the file that holds it (or that none does) is asked for once per
    base, not once per job: most repositories have no config, and that costs a request per candidate."""
    key = f"torchreview:config-source:{CONFIG_CANDIDATES_ID}:{repo.full_name}@{base_sha}"
    known = store.get(key) if store is not None else None
    if known is not None:
        name, _, text = known.partition("\n")
        return (parse_config_text(text, name) or Config()) if name else Config()
    found, config = ("", ""), Config()
    for name in CONFIG_FILES_IN_ORDER:
        text = _file_text(repo, name, base_sha)
        parsed = parse_config_text(text, name) if text is not None else None  # ConfigError: nothing kept
        if parsed is not None:
            found, config = (name, text), parsed
            break
    if store is not None:
        store.put(key, "\n".join(found), CONFIG_SOURCE_TTL)
    return config


def _file_content(repo, path: str, ref: str):
    """The file ``path`` at ``ref`` (PyGithub's ContentFile), or None when there is none (or a directory)."""
    try:
        content = repo.get_contents(path, ref=ref)
    except GithubException as exc:
        if exc.status == 404:
            return None
        raise
    return None if isinstance(content, list) else content


def _file_text(repo, path: str, ref: str) -> Optional[str]:
    content = _file_content(repo, path, ref)
    return None if content is None else content.decoded_content.decode("utf-8", errors="replace")


def collect_changed_files(repo, pr, head: str, config: Config, *, max_files: int = MAX_REVIEW_FILES,
                          max_bytes: int = MAX_REVIEW_BYTES) -> ChangedFiles:
    changed = ChangedFiles()
    try:
        _collect(repo, pr, head, config, changed, max_files, max_bytes)
    except BaseException:
        changed.close()
        raise
    return changed


def _collect(repo, pr, head: str, config: Config, changed: ChangedFiles, max_files: int, max_bytes: int) -> None:
    base = pr.base.sha if config.filter == "introduced" else None
    spent = checkpoint_bytes = 0
    for f in pr.get_files():  # all pages, up to GitHub's 3000 files
        path = f.filename
        if is_checkpoint(path) and f.status != "removed":
            checkpoint_bytes += _collect_checkpoint(repo, f, head, config, changed, checkpoint_bytes)
            continue
        if not path.endswith(REVIEWED_SUFFIXES) or f.status == "removed":
            continue
        if not config.path_included(path):
            changed.notes.append(FileError(path, "excluded", "excluded by the repository's include/exclude settings"))
            continue
        if not f.patch and not path.endswith(".ipynb"):
            changed.notes.append(FileError(path, "no-patch", "GitHub sent no diff for this file (binary or too large); not reviewed"))
            continue
        if len(changed.reviewed) >= max_files or spent >= max_bytes:
            # one PR must not hold a worker for long: the rest is listed, neither fetched nor parsed
            changed.notes.append(FileError(path, "skipped", f"not reviewed: this review's budget ({max_files} files, "
                                                            f"{max_bytes >> 20} MiB) is spent"))
            continue
        data = _blob_bytes(repo, path, f.sha, head)
        if data is None:
            changed.notes.append(FileError(path, "unavailable", "content could not be fetched at the head commit"))
            continue
        spent += _parse_cost(path, data)
        text, note = decode_source(data, path)
        if note is not None:  # why it was not read, or how it was (a codec we lack: as UTF-8)
            changed.notes.append(note)
        if text is None:
            continue
        changed.sources[path] = text
        if f.sha:
            changed.blobs[path] = f.sha
        # A notebook GitHub shows no diff of (big outputs) is still analyzed; its findings go in the summary.
        changed.patches[path] = f.patch
        changed.reviewed.append(path)
        if f.status in ("modified", "renamed", "changed") and base is not None:
            # the base version too: a finding the PR introduces may sit on a line it did not touch
            base_data = _blob_bytes(repo, f.previous_filename or path, None, base)
            base_text = decode_source(base_data, path)[0] if base_data is not None else None
            if base_text is not None:
                changed.base_sources[path] = base_text


def _collect_checkpoint(repo, f, head: str, config: Config, changed: ChangedFiles, spent: int) -> int:
    """Fetch a changed checkpoint file into the review's scratch directory, within its byte budget; returns
    the bytes it cost. Its findings are on the file (GitHub shows no diff of it): they go in the summary."""
    path = f.filename
    if not config.path_included(path):
        changed.notes.append(FileError(path, "excluded", "excluded by the repository's include/exclude settings"))
        return 0
    if spent >= MAX_REVIEW_CHECKPOINT_BYTES:
        changed.notes.append(FileError(path, "skipped", f"checkpoint not scanned: this review's budget for "
                                                        f"checkpoints ({MAX_REVIEW_CHECKPOINT_BYTES >> 20} MiB) is spent"))
        return 0
    blob_sha = f.sha or getattr(_file_content(repo, path, head), "sha", None)
    copy = changed.checkpoint_path(path)
    try:
        size = stream_blob(repo, blob_sha, copy, MAX_REVIEW_CHECKPOINT_BYTES - spent) if blob_sha else None
    except BlobTooLarge:
        changed.notes.append(FileError(path, "skipped", f"checkpoint not scanned: it would take this review past "
                                                        f"its budget for checkpoints ({MAX_REVIEW_CHECKPOINT_BYTES >> 20} MiB)"))
        return 0
    if size is None:
        changed.notes.append(FileError(path, "unavailable", "content could not be fetched at the head commit"))
        return 0
    changed.checkpoints[path] = copy
    changed.sources[path] = ""  # no text: the scan reads the copy
    changed.patches[path] = None
    changed.reviewed.append(path)
    return size



def _parse_cost(path: str, data: bytes) -> int:
    """What a file costs the review's budget: its bytes; for a notebook, those of its code cells (plots in
    its outputs are never parsed). A notebook is read in an isolated child, bounded like its analysis: its
    bytes are the PR author's (a file of nothing but "[" must not take the worker down)."""
    if not path.endswith(".ipynb"):
        return len(data)
    return run_isolated([(path, data)], lambda _path, notebook: _code_cell_bytes(notebook),
                        lambda _path, _kind, _message: len(data), seconds=NOTEBOOK_SECONDS,
                        memory=NOTEBOOK_MEMORY_BYTES)[path]


def _code_cell_bytes(data: bytes) -> int:
    try:
        return sum(len(c.source) for c in read_cells(data) if c.cell_type == "code")
    except NotebookError:
        return len(data)


def app_file_seconds(config: Config) -> float:
    """A repository may ask for less time per file than the App's default, never more: a worker slot is shared."""
    return min(config.file_timeout, FILE_TIMEOUT_DEFAULT)


def notebook_layouts(changed: ChangedFiles, paths: list[str]) -> None:
    """Where the cells' lines of the notebooks ``paths`` are in their JSON text (so that findings can be
    commented on GitHub's diff of it), worked out in an isolated child with a memory and time limit: stepping
    over the outputs still builds each of them for a moment. A notebook it fails for keeps its findings,
    listed in the summary instead of inline, with a note saying why."""
    from analyzers.notebook import json_source_layout

    layouts = run_isolated(((path, changed.sources[path]) for path in paths),
                           lambda _path, text: json_source_layout(text),
                           lambda _path, _kind, message: message, seconds=NOTEBOOK_SECONDS,
                           memory=NOTEBOOK_MEMORY_BYTES)
    for path, layout in layouts.items():
        if isinstance(layout, tuple):
            changed.sources[path] = compose.LaidOutNotebook(changed.sources[path], *layout)
        else:
            changed.sources[path] = compose.LaidOutNotebook(changed.sources[path], {}, {})
            changed.notes.append(FileError(path, "notebook-layout", f"where its cells are in the .ipynb could not be "
                                                                    f"worked out ({layout}); its findings are listed "
                                                                    "in the summary, not inline"))


def analyze_changed_file(changed: ChangedFiles, path: str, config: Config, results: Optional[ResultCache],
                         index: Optional[RepositoryIndex] = None, repository: str = ""):
    """One changed file's findings, from the results cache when its blob was analyzed before with the same
    repository context (the other files and pins it consulted, checked again in this head's tree)."""
    if path in changed.checkpoints:
        return checkpoint_result(changed.checkpoints[path], path, config)
    blob = changed.blobs.get(path)
    if results is None or not blob:
        return analyze_text(changed.sources[path], path, config, repository=index)
    return results.analyze(changed.sources[path], path, config, repository=index, content=f"blob:{blob}",
                           root_id=f"github:{repository}")


def _blob_bytes(repo, path: str, blob_sha: Optional[str], head: str) -> Optional[bytes]:
    try:
        content = repo.get_contents(path, ref=head)
        if not isinstance(content, list) and content.encoding == "base64" and content.content is not None:
            return content.decoded_content
    except GithubException as exc:
        if exc.status not in (403, 404):  # 403: over the contents API's size limit
            raise
    if blob_sha:  # large files: the git blob API has no 1 MB limit
        blob = repo.get_git_blob(blob_sha)
        return base64.b64decode(blob.content) if blob.encoding == "base64" else blob.content.encode()
    return None


def _comment_fits(comment: dict, diff) -> bool:
    if diff is None:
        return False
    start = comment.get("start_line", comment["line"])
    return all(n in diff.commentable for n in range(start, comment["line"] + 1))


COMMAND_HEAD_TTL = 7 * 24 * 3600  # longer than any redelivery of a job


def command_head_key(installation_id: int, trigger: str) -> str:
    """Where the head a ``/review`` command (its delivery, ``trigger``) first saw is kept."""
    return f"torchreview:command-head:{installation_id}:{trigger}"


def _answered(repo, job) -> bool:
    """Whether an earlier attempt of ``job`` completed its check run on the head it was pinned to (the
    review and the summary are posted before the run completes; a run merely created is no answer)."""
    runs = our_check_runs(repo, job.head_sha, CHECK_NAME)
    return any(run.external_id == job.delivery and run.status == "completed" for run in runs)


def _close_superseded(repo, old_sha: str, new_sha: str, budget: WriteBudget) -> None:
    """Never leave an older head's check run in progress; point it at the newer one."""
    for run in our_check_runs(repo, old_sha, CHECK_NAME):
        if run.status != "completed":
            complete_check_run(run, compose.superseded_plan(old_sha, new_sha), budget)


def fail_check_run(job, clients, store, message: str) -> None:
    """The job failed for good: say so on the check run instead of leaving it in progress."""
    try:
        budget = WriteBudget(store, job.installation_id)
        repo = clients.for_installation(job.installation_id, job.repository).get_repo(job.repository)
        head = job.head_sha or repo.get_pull(job.pull_number).head.sha
        runs = [r for r in our_check_runs(repo, head, CHECK_NAME) if r.status != "completed"]
        if not runs:
            runs = [repo.create_check_run(name=CHECK_NAME, head_sha=head, status="in_progress")]
        for run in runs:  # a pushed-over head's run says superseded, not failed
            complete_check_run(run, compose.job_failed_plan(message), budget,
                               newer_head=lambda: head_moved_past(repo, job.pull_number, head))
    except Exception:  # noqa: BLE001 - best effort; the original error is what matters
        log.exception("could not mark the check run failed")


REFUSAL_REACTIONS_PER_HOUR = 3  # per user and installation; past it, unauthorized commands get nothing


def run_command(job: CommandJob, clients, store) -> str:
    """A ``/review`` comment: ask GitHub for the commenter's permission, acknowledge with 👀, then do
    what it says. Commands from users without write access run nothing and get no reply."""
    from analyzers.markdown import code_block, code_span
    from bot import commands

    command = commands.parse_command(job.command or "")
    if command is None:
        return "not a command"
    repo = clients.for_installation(job.installation_id, job.repository).get_repo(job.repository)
    budget = WriteBudget(store, job.installation_id)
    key = f"command-{job.comment_id}"  # a retried job answers once
    if not commands.may_run(repo, job.requested_by or ""):
        return _refuse_quietly(job, repo, store, budget, command.name)
    if job.comment_id:
        budget.spend()
        try:
            commands.acknowledge(repo, job.comment_id)
        except GithubException as exc:
            if exc.status != 404:
                raise
            log.info("command comment %s is gone; not acknowledged", job.comment_id)
    if command.name == "review":
        # The head this command reviews is the one its first attempt saw: a retry after a push (the job
        # killed after answering, before its ack) finds its own answer instead of answering again.
        pin = command_head_key(job.installation_id, job.delivery)
        head = (store.get(pin) or store.keep_first(pin, repo.get_pull(job.pull_number).head.sha, COMMAND_HEAD_TTL)
                if job.delivery else None)
        return run_review(ReviewJob(installation_id=job.installation_id, repository=job.repository,
                                    pull_number=job.pull_number, head_sha=head, reason="command.review",
                                    delivery=job.delivery, requested_by=job.requested_by), clients, store)
    if command.name == "config":
        pr = repo.get_pull(job.pull_number)
        try:
            base = config_commit(store, job.repository, pr)
            config = load_base_config(repo, base, store)
            text = commands.config_reply(config, pr.base.ref, base)
        except ConfigError as exc:
            text = f"The repository's torchreview configuration on {code_span(pr.base.ref)} is invalid:\n\n{code_block(str(exc))}"
    elif command.name == "smoke":
        text = _queue_smoke(job, repo, command)
    elif command.name == "help":
        text = commands.help_reply()
    else:
        text = commands.unknown_reply(command)
    budget.spend()
    commands.reply(job.pull_number, repo, text, dedupe_key=key)
    return f"/review {command.name} answered"


def _refuse_quietly(job: CommandJob, repo, store, budget: WriteBudget, name: str) -> str:
    """No reply (a reply per comment would let anyone spend our write budget): one 👎 reaction,
    at most REFUSAL_REACTIONS_PER_HOUR per user; the decision is kept so a retry does not count twice."""
    from bot import commands

    login = job.requested_by or ""
    decision_key = f"torchreview:refused:{job.installation_id}:{job.comment_id}"
    decision = store.get(decision_key)
    if decision is None:
        used = store.count(f"torchreview:refusals:{job.installation_id}:{login}", 3600)
        decision = "react" if used <= REFUSAL_REACTIONS_PER_HOUR else "quiet"
        store.put(decision_key, decision, 24 * 3600)
    if decision == "react" and job.comment_id:
        budget.spend()
        try:
            commands.react(repo, job.comment_id, "-1")
        except GithubException as exc:
            if exc.status != 404:  # the comment is gone
                raise
    return f"refused /review {name} from {login} (no write access)"


def _queue_smoke(job: CommandJob, repo, command) -> str:
    """``/review smoke [<sha>]``: enqueue a smoke job for exactly one commit the commenter saw, pinned by its
    full SHA. ``job.head_sha`` is the head the webhook knew when the comment was written (bot.jobs.pin_command):
    a SHA prefix is resolved among that head and its commits in the PR, never among commits pushed since."""
    from bot import commands

    pr = repo.get_pull(job.pull_number)
    current = pr.head.sha
    wanted, problem = commands.smoke_sha_argument(command)
    if problem:
        return problem
    if wanted:
        sha, problem = _commit_seen(repo, pr, wanted, job.head_sha)
        if problem:
            return problem
    elif job.head_sha is None:
        return commands.smoke_unknown_head_reply(current)
    elif job.head_sha != current:
        return commands.smoke_head_moved_reply(job.head_sha, current)
    else:
        sha = job.head_sha
    enqueue_smoke(SmokeJob(installation_id=job.installation_id, repository=job.repository, pull_number=pr.number,
                           head_sha=sha, reason="command.smoke", delivery=job.delivery,
                           requested_by=job.requested_by, comment_id=job.comment_id))
    return (f"Smoke training of `{sha[:12]}` is queued; its results will arrive as the "
            "`torchreview / smoke` check run on that commit.")


MAX_PR_COMMITS_SEARCHED = 1000
FULL_SHA_LENGTH = 40


def _commit_seen(repo, pr, wanted: str, seen_head: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """(full SHA, None) for the one commit ``wanted`` names, else (None, the reply). A full SHA must be a
    commit of the PR now; a prefix must name exactly one commit of the PR as it was when the comment was
    written (``seen_head`` and its commits): a commit pushed later with the same prefix (grinding 7 hex
    digits takes seconds) is never a candidate."""
    from bot import commands

    if len(wanted) == FULL_SHA_LENGTH:
        return (wanted, None) if wanted in _pull_commits(repo, pr, pr.head.sha) else (None, commands.smoke_not_in_pr_reply(wanted))
    if seen_head is None:
        return None, commands.smoke_prefix_unknown_head_reply(wanted)
    found = [sha for sha in _pull_commits(repo, pr, seen_head) if sha.startswith(wanted)]
    if not found:
        return None, commands.smoke_not_in_pr_reply(wanted)
    if len(found) > 1:
        return None, commands.smoke_ambiguous_reply(wanted, found)
    return found[0], None


def _pull_commits(repo, pr, head: str) -> list[str]:
    """``head`` and the PR's commits up to it (base...head), newest first, at most MAX_PR_COMMITS_SEARCHED."""
    commits = [head]
    for index, commit in enumerate(repo.compare(pr.base.sha, head).commits):  # base...head: the PR's own
        if index >= MAX_PR_COMMITS_SEARCHED:
            break
        if commit.sha != head:
            commits.append(commit.sha)
    return commits
