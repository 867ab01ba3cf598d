"""What reviewers say about the bot's comments: a 👎 on a comment, or a reply ``/review false-positive [why]``.

Read at each review of a pull request (and when it is closed), recorded once per comment, user and kind in
the store, counted in ``torchreview_feedback_total{rule,kind}``, summarized in the next check run of the
repository, and printed by ``torchreview feedback export`` so real-world precision becomes measurable.

Next to the verdicts, what became of each comment is recorded as a comment event: ``posted`` when the App
posts it, ``resolved-by-fix`` when its finding disappeared after a push (the App resolves the thread),
``resolved-without-fix`` when a person resolved the thread while the finding was still there. ``torchreview
feedback`` reports them per installation and rule (:func:`report`).

Anyone can react to a comment, and a comment quotes PR code: a verdict counts only from a user with write
access to the repository (GitHub's collaborator permission, asked once per user and cached), only on our own
comments, and only for the rule ids our comment's marker line names (never markers inside quoted code) that
exist in the catalog; so the metric's ``rule`` label takes only real rule ids.
"""
from __future__ import annotations

import logging
import re
from collections import Counter
from typing import Iterable, Optional

log = logging.getLogger("torchreview.feedback")

FALSE_POSITIVE = re.compile(r"^\s*/review\s+false-positive\b(.*)", re.I | re.S)
PERMISSION_TTL = 600  # a user's repository permission, as GitHub said it, is reused for ten minutes
MAX_JUDGES_ASKED = 50  # distinct users whose permission one collection asks GitHub (sock puppets cost us calls)


def comment_rules(body: str) -> list[str]:
    """The catalog's rules a bot comment speaks for (one comment may cover several findings), from its marker line."""
    from bot.review import comment_markers

    return sorted({rule for _fingerprint, rule in comment_markers(body) if is_known_rule(rule)})


def is_known_rule(rule: str) -> bool:
    from analyzers.rules import get_rule

    found = get_rule(rule)
    return found is not None and found.id == rule


def may_judge(repo, repository: str, login: str, store, asked: dict) -> bool:
    """Whether ``login`` has write access to the repository (write, maintain or admin), from GitHub, cached."""
    from bot.commands import ALLOWED_PERMISSIONS, permission_level

    if login in asked:
        return asked[login] in ALLOWED_PERMISSIONS
    key = f"torchreview:permission:{repository}:{login}"
    level = store.get(key)
    if level is None:
        if len(asked) >= MAX_JUDGES_ASKED:
            return False
        level = permission_level(repo, login)
        store.put(key, level, PERMISSION_TTL)
    asked[login] = level
    return level in ALLOWED_PERMISSIONS


def collect(pr, repository: str, our_comments: Iterable, store, is_ours, installation: Optional[int] = None) -> int:
    """Record the verdicts of users with write access on our comments of ``pr``; the number of new ones."""
    from bot.metrics import FEEDBACK

    ours = {c.id: c.comment for c in our_comments}
    if not ours:
        return 0
    recorded = 0
    verdicts: list[tuple[object, str, str, str]] = []  # (comment, user, kind, reason)
    for comment in pr.get_review_comments():  # replies in our threads
        # the listed data as GitHub sent it: PyGithub would fetch every thread root again to learn it has none
        reply_to = getattr(comment, "_rawData", {}).get("in_reply_to_id")
        match = FALSE_POSITIVE.match(comment.body or "")
        if reply_to in ours and match and not is_ours(comment.user):
            verdicts.append((ours[reply_to], comment.user.login, "false-positive", " ".join(match.group(1).split())[:500]))
    for comment in ours.values():  # 👎 on the comment itself
        try:
            reactions = list(comment.get_reactions())
        except Exception as exc:  # noqa: BLE001 - feedback is best effort; the review goes on
            log.info("reactions of comment %s unavailable: %s", comment.id, exc)
            continue
        for reaction in reactions:
            if reaction.content == "-1" and not is_ours(reaction.user):
                verdicts.append((comment, reaction.user.login, "thumbs-down", ""))
    asked: dict[str, str] = {}
    for comment, user, kind, reason in verdicts:
        if not may_judge(pr.base.repo, repository, user, store, asked):
            continue
        for rule in comment_rules(comment.body) or ["unknown"]:
            record = {"id": f"{repository}#{comment.id}:{rule}:{user}:{kind}", "repository": repository,
                      "pull_request": pr.number, "comment": comment.id, "rule": rule, "kind": kind, "user": user,
                      "reason": reason, "installation": installation}
            if store.add_feedback(record):
                FEEDBACK.labels(rule=rule, kind=kind).inc()
                recorded += 1
    return recorded


def marked_wrong(store, repository: str) -> tuple[int, Counter]:
    """How many of the bot's comments on ``repository`` users marked wrong, and by rule."""
    comments: set[int] = set()
    by_rule: Counter = Counter()
    seen: set[tuple[int, str]] = set()
    for record in store.feedback():
        if record.get("repository") != repository or not is_known_rule(record.get("rule", "")):
            continue  # records kept before rules were checked may name anything
        comments.add(record["comment"])
        if (record["comment"], record["rule"]) not in seen:
            seen.add((record["comment"], record["rule"]))
            by_rule[record["rule"]] += 1
    return len(comments), by_rule


def summary_line(count: int, by_rule: Counter, fail_on: Optional[str] = None) -> str:
    if not count:
        return ""
    rules = ", ".join(f"`{rule}` ×{n}" for rule, n in by_rule.most_common(5))
    return (f"{count} of torchreview's past comments on this repository were marked wrong by its reviewers "
            f"({rules}). A rule that is often wrong here can be lowered or switched off in "
            f"`.github/torchreview.yml` (`rules: {{severity: {{RULE: low}}}}` or `rules: {{ignore: [RULE]}}`).")


# ---- what became of the App's comments ------------------------------------------------------------------
POSTED, FIXED, RESOLVED_UNFIXED = "posted", "resolved-by-fix", "resolved-without-fix"
EVENT_KINDS = (POSTED, FIXED, RESOLVED_UNFIXED)


def record_events(store, kind: str, installation: Optional[int], repository: str, pull_request: int,
                  bodies: Iterable[str]) -> int:
    """Record ``kind`` for each finding our comments (their ``bodies``) speak for, once per finding of the pull
    request (its fingerprint) and rule; the number of new records."""
    from bot.review import comment_markers

    assert kind in EVENT_KINDS, kind
    recorded = 0
    for body in bodies:
        for fingerprint, rule in comment_markers(body or ""):
            if not is_known_rule(rule):
                continue
            record = {"id": f"{repository}#{pull_request}:{fingerprint}:{rule}:{kind}", "kind": kind,
                      "installation": installation, "repository": repository, "pull_request": pull_request,
                      "fingerprint": fingerprint, "rule": rule}
            recorded += bool(store.add_event(record))
    return recorded


REPORT_COLUMNS = ("posted", "thumbs_down", "false_positive", "resolved_by_fix", "resolved_without_fix")


def report(store, repository: Optional[str] = None, installation: Optional[int] = None) -> list[dict]:
    """Per installation and rule: comments posted, 👎 and ``/review false-positive`` verdicts (one per user and
    comment), threads resolved by a fix, and threads resolved without one (a finding fixed later counts as
    fixed, not both). Verdicts recorded before installations were noted take their repository's installation."""
    events = [e for e in store.events() if repository in (None, e.get("repository"))]
    verdicts = [v for v in store.feedback() if repository in (None, v.get("repository")) and is_known_rule(v.get("rule", ""))]
    installation_of = {e["repository"]: e.get("installation") for e in events if e.get("installation") is not None}
    rows: dict[tuple, Counter] = {}

    def row(record: dict) -> Counter:
        where = record.get("installation")
        where = where if where is not None else installation_of.get(record.get("repository"))
        return rows.setdefault((where, record["rule"]), Counter())

    outcome: dict[tuple, str] = {}  # (repository, pull request, fingerprint, rule) -> how its thread ended
    for event in events:
        if event["kind"] == POSTED:
            row(event)["posted"] += 1
        else:
            key = (event["repository"], event["pull_request"], event["fingerprint"], event["rule"])
            if outcome.get(key) != FIXED:
                outcome[key] = event["kind"]
    for event in events:  # each finding's thread once, by how it ended
        key = (event["repository"], event["pull_request"], event.get("fingerprint"), event["rule"])
        ended = outcome.pop(key, None) if event["kind"] != POSTED else None
        if ended is not None:
            row(event)["resolved_by_fix" if ended == FIXED else "resolved_without_fix"] += 1
    for verdict in verdicts:
        row(verdict)["thumbs_down" if verdict["kind"] == "thumbs-down" else "false_positive"] += 1
    return [{"installation": where, "rule": rule, **{column: counts[column] for column in REPORT_COLUMNS}}
            for (where, rule), counts in sorted(rows.items(), key=lambda item: (str(item[0][0]), item[0][1]))
            if installation in (None, where)]
