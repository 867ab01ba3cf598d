"""Real webhook payloads (from the contract cache, see contract.py), pointed at the emulator's objects, and signed."""
from __future__ import annotations

import copy
import hashlib
import hmac
import json
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
