"""The bot's side of a PR conversation across pushes: its earlier comments, resolving the threads of
findings that are gone, and the one summary comment it edits in place."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

from github import GithubException

from bot.github_client import issue_ref
from bot.review import parse_fingerprint, parse_fingerprints

log = logging.getLogger("torchreview.conversation")

SUMMARY_MARKER = "<!-- torchreview:summary -->"

THREADS_QUERY = """
query($owner: String!, $name: String!, $number: Int!, $after: String) {
  repository(owner: $owner, name: $name) {
    pullRequest(number: $number) {
      reviewThreads(first: 100, after: $after) {
        pageInfo { hasNextPage endCursor }
        nodes { id isResolved resolvedBy { login } comments(first: 100) { nodes { databaseId author { login } } } }
      }
    }
  }
}
"""
RESOLVE_MUTATION = "mutation($id: ID!) { resolveReviewThread(input: {threadId: $id}) { thread { id isResolved } } }"


@dataclass
class BotComment:
    id: int
    fingerprint: str
    comment: object  # PyGithub PullRequestComment
    fingerprints: tuple[str, ...] = ()  # every finding the comment covers (one comment may say several)


def is_ours(user, bot_login: Optional[str]) -> bool:
    """Our own account: the App's ``<slug>[bot]`` login when known, else any App bot."""
    if user is None:
        return False
    login = getattr(user, "login", "") or ""
    if bot_login:
        return login == bot_login
    return getattr(user, "type", "") == "Bot" and login.endswith("[bot]")


def our_review_comments(pr, bot_login: Optional[str],
                        parse: Optional[Callable[[str], Optional[str]]] = None) -> dict[str, BotComment]:
    """fingerprint -> our review comment carrying it (never other users').

    Only the bot's finding comments carry a fingerprint, and the bot never replies in threads, so
    these are thread roots. ``parse`` picks the kind: the static review's markers by default (a comment
    may carry several), the smoke job passes its own, so neither job ever resolves the other's threads.
    """
    found: dict[str, BotComment] = {}
    for comment in pr.get_review_comments():
        if not is_ours(comment.user, bot_login):
            continue
        body = comment.body or ""
        if parse is not None:  # one marker kind of its own (the smoke job's)
            fingerprints = tuple(fp for fp in [parse(body)] if fp)
        else:  # a static-review comment may cover several findings
            fingerprints = tuple(parse_fingerprints(body)) or tuple(fp for fp in [parse_fingerprint(body)] if fp)
        for fingerprint in fingerprints:
            if fingerprint not in found:
                found[fingerprint] = BotComment(comment.id, fingerprint, comment, fingerprints)
    return found


def unique_comments(existing: dict[str, BotComment]) -> list[BotComment]:
    """Each comment once (a comment covering several findings appears under each fingerprint)."""
    return list({c.id: c for c in existing.values()}.values())


def gone_comments(existing: dict[str, BotComment], kept: frozenset[str]) -> list[BotComment]:
    """Our comments none of whose findings is still there: their threads can be closed."""
    gone: dict[int, BotComment] = {}
    for comment in existing.values():
        if not any(fp in kept for fp in comment.fingerprints or (comment.fingerprint,)):
            gone.setdefault(comment.id, comment)
    return list(gone.values())


def close_gone(gh, repo_full_name: str, pr, gone: list[BotComment], cleanup: str, bot_login: Optional[str],
               spend: Callable[[], None], threads: Optional[dict[int, dict]] = None) -> tuple[int, int]:
    """Resolve (or, with ``cleanup = "delete"`` and no replies, delete) threads of fixed findings; ``threads``:
    the pull request's, when already fetched (:func:`review_threads`)."""
    if not gone:
        return 0, 0
    threads = threads if threads is not None else review_threads(gh, repo_full_name, pr.number)
    resolved = deleted = 0
    for item in gone:
        thread = threads.get(item.id)
        replied = thread is not None and any(not _login_is_ours(login, bot_login) for login in thread["authors"][1:])
        if cleanup == "delete" and not replied:
            spend()
            try:
                item.comment.delete()
                deleted += 1
                continue
            except GithubException as exc:
                if exc.status != 404:
                    raise
                continue  # already gone
        if thread is not None and not thread["resolved"]:
            spend()
            gh.requester.graphql_query(RESOLVE_MUTATION, {"id": thread["id"]})
            resolved += 1
    return resolved, deleted


def _login_is_ours(login: str, bot_login: Optional[str]) -> bool:
    return login == bot_login if bot_login else login.endswith("[bot]")


def resolved_by_people(comments: list[BotComment], threads: dict[int, dict], bot_login: Optional[str]) -> list[BotComment]:
    """Those of our ``comments`` whose thread a person (not us) resolved."""
    return [c for c in comments if threads.get(c.id, {}).get("resolved")
            and not _login_is_ours(threads[c.id].get("resolved_by") or "", bot_login)]


def review_threads(gh, repo_full_name: str, number: int) -> dict[int, dict]:
    """The pull request's review threads by the id of their first comment: id, resolved, resolved_by, authors."""
    owner, name = repo_full_name.split("/")
    threads: dict[int, dict] = {}
    after = None
    while True:
        _, data = gh.requester.graphql_query(THREADS_QUERY, {"owner": owner, "name": name, "number": number,
                                                            "after": after})
        connection = data["data"]["repository"]["pullRequest"]["reviewThreads"]
        for node in connection["nodes"]:
            comments = node["comments"]["nodes"]
            if comments:
                threads[comments[0]["databaseId"]] = {
                    "id": node["id"], "resolved": node["isResolved"],
                    "resolved_by": (node.get("resolvedBy") or {}).get("login"),
                    "authors": [(c.get("author") or {}).get("login", "") for c in comments],
                }
        if not connection["pageInfo"]["hasNextPage"]:
            return threads
        after = connection["pageInfo"]["endCursor"]


def upsert_summary(repo, pr_number: int, body: str, bot_login: Optional[str], spend: Callable[[], None]) -> None:
    """One summary comment per PR, edited in place on every run."""
    text = body.rstrip() + "\n\n" + SUMMARY_MARKER
    issue = issue_ref(repo, pr_number)
    for comment in issue.get_comments():
        if SUMMARY_MARKER in (comment.body or "") and is_ours(comment.user, bot_login):
            if comment.body != text:
                spend()
                comment.edit(text)
            return
    spend()
    issue.create_comment(text)
