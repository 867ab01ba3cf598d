"""GitHub access through PyGithub (unmodified): App auth, installation clients, retry classification."""
from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Optional

import github
from github import Auth, GithubException, GithubIntegration
from github.Requester import Requester
from urllib3.util import Retry

from bot.settings import Settings


class TransientGitHubError(Exception):
    """GitHub said "later" (5xx, 429, secondary rate limit, network): retry after ``delay`` seconds.
    ``rate_limited``: GitHub named the wait itself (a rate limit), which is not a failure of ours."""

    def __init__(self, message: str, delay: float, rate_limited: bool = False, reason: str = "github_5xx") -> None:
        super().__init__(message)
        self.delay = delay
        self.rate_limited = rate_limited
        self.reason = "rate_limit" if rate_limited else reason  # bot.metrics.RETRY_REASONS


class CountedRetry(Retry):
    """Counts each response it retries in place: those never reach PyGithub's requester (_ResponseObserver)."""

    def increment(self, method=None, url=None, response=None, error=None, _pool=None, _stacktrace=None):
        retry = super().increment(method, url, response, error, _pool, _stacktrace)
        if response is not None:  # not the last one: when retries run out, PyGithub gets it and counts it
            from bot.metrics import observe_github_response

            observe_github_response(response.status, response.headers)
        return retry


def server_error_retry():
    """In-place retries of reads (and other idempotent requests) that GitHub answered 5xx: a 502 is
    usually momentary, and a review makes dozens of calls, so retrying the whole job for each one would
    rarely get through (at 5 % of calls failing, 40 calls all succeed 13 % of the time). Writes that
    are not idempotent (POST, and PATCH, which appends a check run's annotations) are never repeated
    here; rate limits are left to the task, which re-queues with GitHub's ``Retry-After``."""
    return CountedRetry(total=3, connect=2, read=0, redirect=3, status=3, backoff_factor=0.5,
                        status_forcelist=(500, 502, 503, 504), allowed_methods=frozenset({"GET", "HEAD", "PUT", "DELETE"}),
                        respect_retry_after_header=False, raise_on_status=False)


def user_agent() -> str:
    """GitHub asks every client to name itself; the process id tells apart the requests of concurrent workers
    (in GitHub's logs, and for the load harness, which pairs a worker's head read with its next write)."""
    from analyzers.output import tool_version

    return f"torchreview/{tool_version()} (worker {os.getpid()})"


class _ResponseObserver(logging.Logger):
    """PyGithub's one per-response hook, its requester's logger (``Requester.injectLogger``): every response
    of every client (installations, the App's JWT) passes through its debug call, with the status and the
    headers. Counted here, then passed on to PyGithub's own logger as before. (The other hooks PyGithub
    offers, its connection classes, would turn off its connection reuse.)"""

    _RESPONSE_ARGS = 9  # verb, scheme, host, url, request headers, body, status, response headers, output

    def __init__(self) -> None:
        self.target = logging.getLogger("github.Requester")
        super().__init__(self.target.name)

    def isEnabledFor(self, level: int) -> bool:
        return level == logging.DEBUG or self.target.isEnabledFor(level)

    def debug(self, msg, *args, **kwargs) -> None:
        if len(args) == self._RESPONSE_ARGS and isinstance(args[6], int) and isinstance(args[7], dict):
            from bot.metrics import observe_github_response

            observe_github_response(args[6], args[7])
        if self.target.isEnabledFor(logging.DEBUG):
            self.target.debug(msg, *args, **kwargs)

    def handle(self, record: logging.LogRecord) -> None:
        self.target.handle(record)


def observe_github_responses() -> None:
    """Count GitHub's responses by status, and its rate-limit headers, in this process (idempotent)."""
    Requester.injectLogger(_ResponseObserver())


# What a job does with its token (review, smoke, /review commands, feedback): read code, write check runs,
# reviews, comments and reactions on pull requests (``pull_requests: write`` covers a PR's issue comments and
# their reactions). Never ``issues`` or anything else the App may hold.
JOB_PERMISSIONS = {"checks": "write", "contents": "read", "metadata": "read", "pull_requests": "write"}
MAX_CACHED_CLIENTS = 256  # (installation, repository) pairs a worker keeps a client and token for


class ScopedInstallationAuth(Auth.AppInstallationAuth):
    """An installation token for one repository and the permissions a job needs (``repositories`` and
    ``permissions`` of POST /app/installations/{id}/access_tokens): a job's token reaches no other
    repository of the installation, and does nothing the job does not. PyGithub narrows permissions only."""

    def __init__(self, app_auth: Auth.AppAuth, installation_id: int, repository: str, permissions: dict) -> None:
        super().__init__(app_auth, installation_id, token_permissions=dict(permissions))
        self.repository = repository

    def _get_installation_authorization(self):
        from github.InstallationAuthorization import InstallationAuthorization

        # the repository's name without its owner, as the endpoint wants (the installation is the owner's)
        body = {"repositories": [self.repository.split("/", 1)[-1]], "permissions": self.token_permissions}
        headers, data = self.requester.requestJsonAndCheck(
            "POST", f"/app/installations/{self.installation_id}/access_tokens", input=body)
        return InstallationAuthorization(requester=self.requester, headers=headers, attributes=data)


class GitHubClients:
    """One PyGithub client per installation and repository, reused while its token is valid.

    PyGithub's AppInstallationAuth requests an installation token on first use and renews it
    shortly before it expires, so caching the client caches the token.
    """

    def __init__(self, settings: Settings) -> None:
        if settings.app_id is None or not settings.private_key:
            raise ValueError("GITHUB_APP_ID and GITHUB_PRIVATE_KEY are required to talk to GitHub")
        self.settings = settings
        observe_github_responses()
        self.app_auth = Auth.AppAuth(settings.app_id, settings.private_key)
        self.integration = GithubIntegration(base_url=settings.api_url, auth=self.app_auth, retry=None)
        self._clients: OrderedDict[tuple[int, Optional[str]], github.Github] = OrderedDict()
        self._bot_login: Optional[str] = None
        self._lock = threading.Lock()

    def bot_login(self) -> Optional[str]:
        """``<app slug>[bot]``: the account our comments are written by (one GET /app per process)."""
        if self._bot_login is None:
            self._bot_login = self.settings.bot_login or f"{self.integration.get_app().slug}[bot]"
        return self._bot_login

    def for_installation(self, installation_id: int, repository: Optional[str] = None) -> github.Github:
        """A client whose token is scoped to ``repository`` ("owner/name") and JOB_PERMISSIONS; without one,
        the installation's full token (tools and tests only: every job names its repository)."""
        key = (installation_id, repository)
        with self._lock:
            client = self._clients.get(key)
            if client is not None:
                self._clients.move_to_end(key)
            else:
                auth = (ScopedInstallationAuth(self.app_auth, installation_id, repository, JOB_PERMISSIONS)
                        if repository else self.app_auth.get_installation_auth(installation_id))
                # Only 5xx on idempotent requests are retried in place; the rest, the task retries as a
                # whole, idempotently, honouring Retry-After.
                client = github.Github(base_url=self.settings.api_url, auth=auth, retry=server_error_retry(),
                                       timeout=20, per_page=100, user_agent=user_agent(),
                                       seconds_between_requests=None,
                                       seconds_between_writes=self.settings.github_write_interval or None)
                self._clients[key] = client
                while len(self._clients) > MAX_CACHED_CLIENTS:
                    self._clients.popitem(last=False)
            return client


class BlobTooLarge(ValueError):
    """A blob over the bytes its reader may spend on it (the partial copy is removed)."""


def stream_blob(repo, blob_sha: str, into, max_bytes: int, timeout: float = 60.0) -> Optional[int]:
    """Write the git blob ``blob_sha`` of ``repo`` to the file ``into`` as it arrives, never holding it whole
    (the JSON form is base64 of the whole file, a third larger, in memory): GitHub's raw media type for blobs,
    with the client's own token. Returns its size; None when GitHub has no such blob; BlobTooLarge past
    ``max_bytes``; a GithubException for any other answer, which ``classify`` judges as for PyGithub's calls."""
    import requests

    headers = {"Accept": "application/vnd.github.raw+json", "User-Agent": user_agent(),
               "X-GitHub-Api-Version": "2022-11-28"}
    repo.requester.auth.authentication(headers)
    with requests.get(f"{repo.url}/git/blobs/{blob_sha}", headers=headers, timeout=timeout, stream=True) as response:
        from bot.metrics import observe_github_response

        observe_github_response(response.status_code, dict(response.headers))
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            try:
                data = response.json()
            except ValueError:
                data = {"message": response.text[:200]}
            raise GithubException(response.status_code, data, dict(response.headers))
        written = 0
        try:
            with open(into, "wb") as out:
                for chunk in response.iter_content(1 << 20):
                    written += len(chunk)
                    if written > max_bytes:
                        raise BlobTooLarge(f"over {max_bytes} bytes")
                    out.write(chunk)
        except BaseException:
            Path(into).unlink(missing_ok=True)
            raise
        return written


def classify(exc: BaseException, attempt: int) -> Optional[TransientGitHubError]:
    """A TransientGitHubError with the delay GitHub asked for, or None when retrying cannot help."""
    import requests

    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return TransientGitHubError(f"network error talking to GitHub: {exc}", backoff(attempt), reason="network")
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
    if status == 429 or (status == 403 and ("rate limit" in message.lower() or retry_after
                                            or headers.get("x-ratelimit-remaining") == "0")):
        return TransientGitHubError(f"GitHub rate limit: {message}", delay, rate_limited=True)
    if status >= 500:
        return TransientGitHubError(f"GitHub answered {status}: {message}", delay)
    return None


def backoff(attempt: int, base: float = 2.0, cap: float = 300.0) -> float:
    """Exponential back-off with jitter: 2, 4, 8... seconds, capped."""
    return min(cap, base * (2 ** attempt)) * (0.75 + random.random() * 0.5)


def commit_ref(repo, sha: str):
    """A Commit object for ``sha`` without fetching it (only its sha and URL are used)."""
    return github.Commit.Commit(repo.requester, url=f"{repo.url}/commits/{sha}", completed=False)


def our_check_runs(repo, sha: str, name: str) -> list:
    """The check runs named ``name`` on ``sha`` that our App created, newest first. Anyone with ``checks: write``
    (a workflow of a same-repository PR) can post a run under our name; GitHub lets no App edit another's, and
    a reviewer must never read theirs as our verdict: theirs are never adopted."""
    ours = repo.requester.auth.app_id  # the App whose installation token this client carries
    return [run for run in commit_ref(repo, sha).get_check_runs(check_name=name, filter="all")
            if run.app is not None and str(run.app.id) == str(ours)]


def issue_ref(repo, number: int):
    """The Issue of a PR without fetching it (GET /issues/{n} is not needed for comments)."""
    return github.Issue.Issue(repo.requester, url=f"{repo.url}/issues/{number}", completed=False)
