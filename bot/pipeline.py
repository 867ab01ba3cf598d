"""One review job: fetch the PR, analyze the changed files, post one review and the check run.

Idempotent and safe to retry: the check run for a head SHA is found and reused, a review carries
a marker of the head (and, for explicit re-runs, of the request) and is never posted twice, and a
lock keeps two jobs for one PR from interleaving.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Optional

from github import GithubException

from analyzers.config import Config, ConfigError, parse_toml_config
from analyzers.engine import analyze_text, decode_source
from analyzers.model import FileError, Finding

log = logging.getLogger("torchreview.pipeline")

CHECK_NAME = "torchreview"
LOCK_TTL = 900
REVIEWED_SUFFIXES = (".py", ".ipynb")
FORCED_REASONS = {"comment./review", "check_run.rerequested", "check_suite.rerequested"}


class LockBusy(Exception):
    def __init__(self, delay: float = 5.0) -> None:
        super().__init__("another job is reviewing this pull request")
        self.delay = delay


@dataclass
class ChangedFiles:
    """What the PR changed, as analysis input; every skipped file is explained in ``notes``."""

    sources: dict[str, str] = field(default_factory=dict)  # path -> head source text
    patches: dict[str, str] = field(default_factory=dict)  # path -> GitHub patch (hunks)
    notes: list[FileError] = field(default_factory=list)
    reviewed: list[str] = field(default_factory=list)


def review_marker(head_sha: str, job_key: str) -> str:
    return f"<!-- torchreview:review head={head_sha} job={job_key} -->"


def run_review(job, clients, store) -> str:
    from bot import metrics

    started = time.perf_counter()
    gh = clients.for_installation(job.installation_id)
    repo = gh.get_repo(job.repository)
    pr = repo.get_pull(job.pull_number)
    head = pr.head.sha
    if job.head_sha and job.head_sha != head:
        _close_superseded(repo, job.head_sha, head)
        metrics.REVIEWS.labels(outcome="superseded").inc()
        return f"superseded: {job.head_sha[:7]} is no longer the head ({head[:7]})"
    lock_key = f"torchreview:lock:{job.repository}#{job.pull_number}"
    token = store.acquire(lock_key, LOCK_TTL)
    if token is None:
        raise LockBusy()
    try:
        outcome = _review_locked(job, repo, pr, head)
    finally:
        store.unlock(lock_key, token)
    metrics.REVIEWS.labels(outcome="posted").inc()
    metrics.REVIEW_SECONDS.observe(time.perf_counter() - started)
    return outcome


def _review_locked(job, repo, pr, head: str) -> str:
    from bot import review as compose

    forced = job.reason in FORCED_REASONS
    job_key = job.delivery if forced else "auto"
    check_run = _check_run_for(repo, head, reuse=not forced)
    try:
        config = load_base_config(repo, pr.base.sha)
    except ConfigError as exc:
        _complete(check_run, compose.config_error_plan(str(exc)))
        return f"configuration error: {exc}"
    changed = collect_changed_files(repo, pr, head, config)
    if not changed.reviewed:
        _complete(check_run, compose.no_files_plan(changed.notes))
        return "no PyTorch files changed"
    findings: list[Finding] = []
    for path in changed.reviewed:
        result = analyze_text(changed.sources[path], path, config)
        findings.extend(result.findings)
        changed.notes.extend(result.errors)
    settings = compose.ReviewSettings(fail_on=config.fail_on, max_inline_comments=config.max_inline_comments)
    analysis = compose.PullRequestAnalysis(
        findings=findings,
        diffs={path: compose.parse_file_patch(path, patch) for path, patch in changed.patches.items()},
        sources=changed.sources, reviewed_files=changed.reviewed, notes=changed.notes)
    review_plan = compose.plan_review(analysis, settings)
    check_plan = compose.plan_check_run(analysis, settings)
    # A push may have arrived while we analyzed: never post on a stale head.
    current = repo.get_pull(pr.number).head.sha
    if current != head:
        _complete(check_run, compose.superseded_plan(head, current))
        return f"superseded during review by {current[:7]}"
    if review_plan.should_post:
        marker = review_marker(head, job_key)
        if not _already_posted(pr, marker):
            post_review(pr, repo, head, review_plan, marker)
    _complete(check_run, check_plan)
    return f"{len(findings)} finding(s), {len(review_plan.comments)} inline; check {check_plan.conclusion}"


def load_base_config(repo, base_sha: str) -> Config:
    """The repository's config from the BASE commit: a PR cannot switch its own checks off."""
    for name in (".torchreview.toml", "pyproject.toml"):
        text = _file_text(repo, name, base_sha)
        if text is None:
            continue
        config = parse_toml_config(text, name)
        if config is not None:
            return config
    return Config()


def _file_text(repo, path: str, ref: str) -> Optional[str]:
    try:
        content = repo.get_contents(path, ref=ref)
    except GithubException as exc:
        if exc.status == 404:
            return None
        raise
    if isinstance(content, list):
        return None  # a directory
    return content.decoded_content.decode("utf-8", errors="replace")


def collect_changed_files(repo, pr, head: str, config: Config) -> ChangedFiles:
    changed = ChangedFiles()
    for f in pr.get_files():  # all pages, up to GitHub's 3000 files
        path = f.filename
        if not path.endswith(REVIEWED_SUFFIXES):
            continue
        if f.status == "removed":
            continue
        if not config.path_included(path):
            changed.notes.append(FileError(path, "excluded", "excluded by the repository's include/exclude settings"))
            continue
        if not f.patch:
            changed.notes.append(FileError(path, "no-patch", "GitHub sent no diff for this file (binary or too large); not reviewed"))
            continue
        data = _blob_bytes(repo, path, f.sha, head)
        if data is None:
            changed.notes.append(FileError(path, "unavailable", "content could not be fetched at the head commit"))
            continue
        text, error = decode_source(data, path)
        if error is not None:
            changed.notes.append(error)
            continue
        changed.sources[path] = text
        changed.patches[path] = f.patch
        changed.reviewed.append(path)
    return changed


def _blob_bytes(repo, path: str, blob_sha: Optional[str], head: str) -> Optional[bytes]:
    try:
        content = repo.get_contents(path, ref=head)
        if not isinstance(content, list) and content.encoding == "base64" and content.content is not None:
            return content.decoded_content
    except GithubException as exc:
        if exc.status not in (403, 404):  # 403: over the contents API's size limit
            raise
    if blob_sha:  # large files: the git blob API has no 1 MB limit
        import base64

        blob = repo.get_git_blob(blob_sha)
        return base64.b64decode(blob.content) if blob.encoding == "base64" else blob.content.encode()
    return None


def _check_run_for(repo, head: str, reuse: bool):
    if reuse:  # one run per head: a retried or duplicate job completes the same run again
        for run in repo.get_commit(head).get_check_runs(check_name=CHECK_NAME):
            return run
    return repo.create_check_run(name=CHECK_NAME, head_sha=head, status="in_progress",
                                 output={"title": "Reviewing…", "summary": "torchreview is reviewing this commit."})


def _complete(check_run, plan) -> None:
    from bot.review import batches

    chunks = list(batches(plan.annotations)) or [[]]
    for index, chunk in enumerate(chunks):
        output = plan.output(chunk)  # GitHub appends each update's annotations: send each once
        last = index == len(chunks) - 1
        if last:
            check_run.edit(status="completed", conclusion=plan.conclusion, output=output)
        else:
            check_run.edit(output=output)


def _already_posted(pr, marker: str) -> bool:
    return any(marker in (r.body or "") for r in pr.get_reviews())


def post_review(pr, repo, head: str, plan, marker: str) -> None:
    body = plan.body + "\n\n" + marker
    commit = repo.get_commit(head)  # lazy: only its sha is used
    try:
        pr.create_review(commit=commit, body=body, event=plan.event, comments=plan.comments)
        return
    except GithubException as exc:
        if exc.status != 422 or not plan.comments:
            raise
        log.warning("review rejected (%s); re-checking comment lines against the current diff", exc.data)
    # GitHub rejects the whole review for one bad line: keep only comments on lines of the
    # diff as GitHub now reports it, and say in the body what moved out of the diff.
    from bot.review import parse_file_patch

    current = {f.filename: parse_file_patch(f.filename, f.patch) for f in pr.get_files()}
    kept = [c for c in plan.comments if _comment_fits(c, current.get(c["path"]))]
    dropped = len(plan.comments) - len(kept)
    note = f"\n\n_{dropped} inline comment(s) could not be placed on the diff and are listed above._" if dropped else ""
    try:
        pr.create_review(commit=commit, body=body + note, event=plan.event, comments=kept)
    except GithubException as exc:
        if exc.status != 422:
            raise
        pr.create_review(commit=commit, body=body + "\n\n_Inline comments could not be placed on this diff._",
                         event=plan.event, comments=[])


def _comment_fits(comment: dict, diff) -> bool:
    if diff is None:
        return False
    lines = diff.commentable
    start = comment.get("start_line", comment["line"])
    return all(n in lines for n in range(start, comment["line"] + 1))


def _close_superseded(repo, old_sha: str, new_sha: str) -> None:
    """Never leave an older head's check run in progress."""
    from bot.review import superseded_plan

    for run in repo.get_commit(old_sha).get_check_runs(check_name=CHECK_NAME):
        if run.status != "completed":
            _complete(run, superseded_plan(old_sha, new_sha))


def fail_check_run(job, clients, message: str) -> None:
    """The job failed for good: say so on the check run instead of leaving it in progress."""
    from bot.review import job_failed_plan

    try:
        repo = clients.for_installation(job.installation_id).get_repo(job.repository)
        head = job.head_sha or repo.get_pull(job.pull_number).head.sha
        runs = [r for r in repo.get_commit(head).get_check_runs(check_name=CHECK_NAME) if r.status != "completed"]
        if not runs:
            runs = [repo.create_check_run(name=CHECK_NAME, head_sha=head, status="in_progress")]
        for run in runs:
            _complete(run, job_failed_plan(message))
    except Exception:  # noqa: BLE001 - best effort; the original error is what matters
        log.exception("could not mark the check run failed")
