"""GitHub access through PyGithub (unmodified): App auth, installation clients, retry classification."""
from __future__ import annotations

import random
import threading
import time
from typing import Optional

import github
from github import Auth, GithubException, GithubIntegration

from bot.settings import Settings


class TransientGitHubError(Exception):
    """GitHub said "later" (5xx, 429, secondary rate limit, network): retry after ``delay`` seconds."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


class GitHubClients:
    """One PyGithub client per installation, reused while its token is valid.

    PyGithub's AppInstallationAuth requests an installation token on first use and renews it
    shortly before it expires, so caching the client caches the token.
    """

    def __init__(self, settings: Settings) -> None:
        if settings.app_id is None or not settings.private_key:
            raise ValueError("GITHUB_APP_ID and GITHUB_PRIVATE_KEY are required to talk to GitHub")
        self.settings = settings
        self.app_auth = Auth.AppAuth(settings.app_id, settings.private_key)
        self.integration = GithubIntegration(base_url=settings.api_url, auth=self.app_auth, retry=None)
        self._clients: dict[int, github.Github] = {}
        self._bot_login: Optional[str] = None
        self._lock = threading.Lock()

    def bot_login(self) -> Optional[str]:
        """``<app slug>[bot]``: the account our comments are written by (one GET /app per process)."""
        if self._bot_login is None:
            self._bot_login = self.settings.bot_login or f"{self.integration.get_app().slug}[bot]"
        return self._bot_login

    def for_installation(self, installation_id: int) -> github.Github:
        with self._lock:
            client = self._clients.get(installation_id)
            if client is None:
                auth = self.app_auth.get_installation_auth(installation_id)
                # No in-request retries: the task retries as a whole, idempotently, honouring Retry-After.
                client = github.Github(base_url=self.settings.api_url, auth=auth, retry=None, timeout=20, per_page=100,
                                       seconds_between_requests=None,
                                       seconds_between_writes=self.settings.github_write_interval or None)
                self._clients[installation_id] = client
            return client


def classify(exc: BaseException, attempt: int) -> Optional[TransientGitHubError]:
    """A TransientGitHubError with the delay GitHub asked for, or None when retrying cannot help."""
    import requests

    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return TransientGitHubError(f"network error talking to GitHub: {exc}", backoff(attempt))
    if not isinstance(exc, GithubException):
        return None
    status = exc.status
    headers = {k.lower(): v for k, v in (exc.headers or {}).items()}
    message = exc.data.get("message", "") if isinstance(exc.data, dict) else str(exc.data or "")
    retry_after = headers.get("retry-after")
    if retry_after and retry_after.isdigit():
        delay = float(retry_after)
    elif headers.get("x-ratelimit-remaining") == "0" and headers.get("x-ratelimit-reset", "").isdigit():
        delay = max(1.0, float(headers["x-ratelimit-reset"]) - time.time() + 1)
    else:
        delay = backoff(attempt)
    if status >= 500 or status == 429:
        return TransientGitHubError(f"GitHub answered {status}: {message}", delay)
    if status == 403 and ("rate limit" in message.lower() or retry_after or headers.get("x-ratelimit-remaining") == "0"):
        return TransientGitHubError(f"GitHub rate limit: {message}", delay)
    return None


def backoff(attempt: int, base: float = 2.0, cap: float = 300.0) -> float:
    """Exponential back-off with jitter: 2, 4, 8... seconds, capped."""
    return min(cap, base * (2 ** attempt)) * (0.75 + random.random() * 0.5)


def commit_ref(repo, sha: str):
    """A Commit object for ``sha`` without fetching it (only its sha and URL are used)."""
    return github.Commit.Commit(repo.requester, url=f"{repo.url}/commits/{sha}", completed=False)


def issue_ref(repo, number: int):
    """The Issue of a PR without fetching it (GET /issues/{n} is not needed for comments)."""
    return github.Issue.Issue(repo.requester, url=f"{repo.url}/issues/{number}", completed=False)
