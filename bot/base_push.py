"""A push to a branch that changed the torchreview configuration: every open PR on that base is judged again.

A PR's verdict depends on its base branch's configuration (``bot.pipeline.load_base_config``), so a push that
raises ``fail_on`` or switches a rule on must not leave the green checks it would now fail. The webhook only
decides, from the push payload, whether the push may have touched a configuration file
(``bot.jobs.config_paths_pushed``); this job, on a worker, makes sure (comparing the configuration files of the
two trees when the payload cannot tell, and the configurations they make), remembers the branch's newest
configuration commit, lists the open PRs on the branch and enqueues one review of each PR's head, once.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, Optional

from github import GithubException

from analyzers.config import CONFIG_FILES_IN_ORDER, ConfigError
from bot.jobs import BASE_CONFIG_CHANGED, BASE_CONFIG_TTL, NO_COMMIT, BasePushJob, ReviewJob, base_config_key, send
from bot.pipeline import load_base_config


log = logging.getLogger("torchreview.base_push")

# The most PRs one push re-reviews, the most recently updated first: a branch with more open PRs gets the rest
# judged by the new configuration at their next event (reviews read the branch's newest configuration commit).
MAX_BASE_PUSH_REVIEWS = 200
BASE_REVIEW_TTL = 7 * 24 * 3600  # how long an enqueued re-review of one head for one configuration is remembered


def run_base_push(job: BasePushJob, clients, store, enqueue: Callable[[ReviewJob], None] = send) -> str:
    gh = clients.for_installation(job.installation_id, job.repository)
    repo = gh.get_repo(job.repository)
    paths = job.config_paths if job.config_paths is not None else changed_config_files(repo, job.before, job.after)
    if not paths:
        return "configuration files unchanged"
    if not configuration_changed(repo, job.before, job.after, store):
        return f"configuration unchanged ({', '.join(sorted(paths))} edited)"
    # newest wins, atomically: a late delivery of an older push never takes the branch back to its configuration
    store.keep_latest(base_config_key(job.repository, job.branch), job.after, job.pushed_at or time.time(),
                      BASE_CONFIG_TTL)
    enqueued = already = 0
    capped = False
    for pr in repo.get_pulls(state="open", base=job.branch, sort="updated", direction="desc"):  # paginated
        if enqueued >= MAX_BASE_PUSH_REVIEWS:
            capped = True
            break
        head = pr.head.sha
        # once per head and configuration commit: a retried or redelivered fan-out enqueues nothing twice
        key = f"torchreview:base-review:{job.repository}#{pr.number}:{head}:{job.after}"
        if not store.claim(key, BASE_REVIEW_TTL):
            already += 1
            continue
        try:
            enqueue(ReviewJob(installation_id=job.installation_id, repository=job.repository, pull_number=pr.number,
                              head_sha=head, reason=BASE_CONFIG_CHANGED, delivery=job.delivery, base_sha=job.after))
        except Exception:
            store.release(key)  # not on the queue: a retry of this job enqueues it
            raise
        enqueued += 1
    if capped:
        log.warning("%s:%s: configuration changed; re-reviewed the %d most recently updated open PRs, the rest at "
                    "their next event", job.repository, job.branch, MAX_BASE_PUSH_REVIEWS)
    return (f"configuration changed ({', '.join(sorted(paths))}): {enqueued} re-review(s) enqueued"
            + (f", {already} already" if already else "") + (", capped" if capped else ""))


def configuration_changed(repo, before: str, after: str, store) -> bool:
    """Whether the configurations of the two commits differ, as reviews read them (an invalid one by its error).
    A branch's first push, or a ``before`` GitHub no longer has (a forced push), counts as a change."""
    if before == NO_COMMIT:
        return True

    def read(sha: str):
        try:
            return load_base_config(repo, sha, store)
        except ConfigError as error:
            return str(error)

    try:
        old = read(before)
    except GithubException as exc:
        if exc.status in (404, 422):
            return True
        raise
    return old != read(after)


def changed_config_files(repo, before: str, after: str) -> set[str]:
    """The configuration files whose blobs differ between the trees of ``before`` and ``after`` (every one of
    them when ``before`` is no commit or one GitHub no longer has)."""
    if before == NO_COMMIT:
        return set(CONFIG_FILES_IN_ORDER)
    try:
        old = config_blobs(repo, before)
    except GithubException as exc:
        if exc.status in (404, 422):  # a forced push's old commit, gone: assume everything changed
            return set(CONFIG_FILES_IN_ORDER)
        raise
    new = config_blobs(repo, after)
    return {path for path in CONFIG_FILES_IN_ORDER if old.get(path) != new.get(path)}


def config_blobs(repo, commit: str, paths: Iterable[str] = CONFIG_FILES_IN_ORDER) -> dict[str, str]:
    """path -> blob SHA of each of ``paths`` present at ``commit``, reading each directory's tree once."""
    trees: dict[str, Optional[dict[str, tuple[str, str]]]] = {}

    def listing(directory: str) -> Optional[dict[str, tuple[str, str]]]:
        if directory not in trees:
            if not directory:
                sha = commit
            else:
                parent, _, name = directory.rpartition("/")
                entry = (listing(parent) or {}).get(name)
                sha = entry[1] if entry is not None and entry[0] == "tree" else None
            trees[directory] = None if sha is None else {
                element.path: (element.type, element.sha) for element in repo.get_git_tree(sha).tree}
        return trees[directory]

    found = {}
    for path in paths:
        directory, _, name = path.rpartition("/")
        entry = (listing(directory) or {}).get(name)
        if entry is not None and entry[0] == "blob":
            found[path] = entry[1]
    return found
