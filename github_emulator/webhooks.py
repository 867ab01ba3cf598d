"""Real webhook payloads (from the contract cache, see contract.py), pointed at the emulator's objects, and signed."""
from __future__ import annotations

import copy
import hashlib
import hmac
import json
import time
import uuid
from functools import lru_cache
from typing import Any, Optional

from .contract import require


@lru_cache(maxsize=None)
def _load(name: str) -> str:
    return require(f"webhooks/{name}.json").read_text()


def real_payload(name: str) -> dict[str, Any]:
    """A real GitHub example delivery, e.g. ``pull_request.opened`` or ``derived/issue_comment...``."""
    return copy.deepcopy(json.loads(_load(name)))


def _point_at_repo(data: dict[str, Any], full_name: str, installation_id: int) -> None:
    owner, name = full_name.split("/")
    data["repository"].update(full_name=full_name, name=name)
    data["repository"]["owner"]["login"] = owner
    data.setdefault("installation", {})["id"] = installation_id


def pull_request_payload(action: str, pr, installation_id: int = 1) -> dict[str, Any]:
    """The real ``pull_request.<action>`` payload for an emulator pull request."""
    data = real_payload(f"pull_request.{action}")
    _point_at_repo(data, pr.repo.full_name, installation_id)
    data["number"] = pr.number
    data["pull_request"].update(number=pr.number, draft=pr.draft, state="open", title=pr.title)
    data["pull_request"]["head"]["sha"] = pr.head_sha
    data["pull_request"]["base"]["sha"] = pr.base_sha
    data["pull_request"]["user"]["login"] = pr.user.login
    data["pull_request"]["author_association"] = pr.author_association
    data["pull_request"]["updated_at"] = _iso(pr.updated_at)  # a push's time: commands are pinned by it
    return data


def _iso(value) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def issue_comment_payload(state, pr, body: str, user: str, installation_id: int = 1,
                          author_association: str = "COLLABORATOR") -> dict[str, Any]:
    """Post a comment on an emulator pull request; its ``issue_comment.created`` payload."""
    comment = state.add_issue_comment(pr, body, user=user)
    data = real_payload("derived/issue_comment.created.on_pull_request")
    _point_at_repo(data, pr.repo.full_name, installation_id)
    data["issue"]["number"] = pr.number
    data["comment"].update(id=comment.id, body=body, author_association=author_association,
                           created_at=_iso(comment.created_at), updated_at=_iso(comment.updated_at))
    data["comment"]["user"].update(login=user, type="User")
    data["sender"].update(login=user, type="User")
    return data


NO_COMMIT = "0" * 40  # a push's `before` for a new branch, its `after` for a deleted one
PUSH_COMMITS_CAP = 20  # the most commits GitHub lists in a push (the rest: compare before...after)


def push_payload(state, repo, branch: str, before: str, after: str, installation_id: int = 1,
                 sender: Optional[str] = None, max_commits: int = PUSH_COMMITS_CAP) -> dict[str, Any]:
    """The real ``push`` payload for moving ``branch`` of an emulator repository from ``before`` to ``after``
    (either may be :data:`NO_COMMIT`): the pushed commits (those of ``after`` not in ``before``), oldest first,
    at most ``max_commits`` of them, each with the paths it added, modified and removed against its parent."""
    from .diffing import diff_trees

    repo = state.repo(repo)
    data = real_payload("push")
    _point_at_repo(data, repo.full_name, installation_id)
    data["repository"].update(default_branch=repo.default_branch, master_branch=repo.default_branch,
                              pushed_at=int(time.time()))
    known = set(state.ancestors(before)) if before != NO_COMMIT else set()
    pushed = [sha for sha in state.ancestors(after) if sha not in known] if after != NO_COMMIT else []
    pushed.reverse()  # oldest first, as GitHub lists them
    template = data["commits"][0] if data["commits"] else {}
    commits = []
    for sha in pushed[-max_commits:] if max_commits else []:
        commit = state.commits[sha]
        parent = state.commits[commit.parents[0]].tree if commit.parents else {}
        changes: dict[str, list[str]] = {"added": [], "modified": [], "removed": []}
        for diff in diff_trees(parent, commit.tree):
            if diff.status == "renamed":  # a push lists a rename as the old path gone and the new one added
                changes["removed"].append(diff.previous_filename)
                changes["added"].append(diff.filename)
            else:
                changes["added" if diff.status == "added" else "removed" if diff.status == "removed"
                        else "modified"].append(diff.filename)
        commits.append({**copy.deepcopy(template), "id": sha, "tree_id": state.tree_listing(sha)[0],
                        "distinct": True, "message": commit.message, **changes,
                        "timestamp": _iso(commit.created_at),
                        "url": f"https://github.com/{repo.full_name}/commit/{sha}"})
    data.update(ref=f"refs/heads/{branch}", before=before, after=after, created=before == NO_COMMIT,
                deleted=after == NO_COMMIT, base_ref=None, commits=commits,
                forced=before != NO_COMMIT and after != NO_COMMIT and not state.is_ancestor(before, after),
                head_commit=commits[-1] if commits and commits[-1]["id"] == after else None,
                compare=f"https://github.com/{repo.full_name}/compare/{before[:12]}...{after[:12]}")
    if sender is not None:
        data["sender"].update(login=sender, type="User")
        data["pusher"].update(name=sender)
    return data


def signed_delivery(event: str, data: dict[str, Any], secret: str,
                    delivery: Optional[str] = None) -> tuple[bytes, dict[str, str]]:
    """The exact bytes and headers GitHub would send for ``data``."""
    body = json.dumps(data).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/emulator",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest(),
    }
    return body, headers
