"""In-memory GitHub world the emulator serves, and the helpers tests use to drive it.

Everything is guarded by one re-entrant lock (`state.lock`): the HTTP server
serialises requests on it and every public helper takes it, so tests can mutate
state while a client talks to the server.
"""

from __future__ import annotations

import base64
import fnmatch
import functools
import hashlib
import itertools
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Mapping

from .diffing import DEFAULT_PATCH_SIZE_LIMIT, FileDiff, blob_sha, diff_trees
from .app_webhook import AppWebhook
from .faults import FaultInjector

FileContent = bytes | str
DEFAULT_INSTALLATION_PERMISSIONS = {
    "checks": "write",
    "contents": "read",
    "issues": "write",
    "metadata": "read",
    "pull_requests": "write",
}
DEFAULT_APP_EVENTS = ["check_run", "check_suite", "issue_comment", "pull_request"]
PERMISSION_RANK = {"none": 0, "read": 1, "write": 2, "admin": 3}
# Repository role -> the coarse `permission` field GitHub reports for it.
ROLE_TO_PERMISSION = {"admin": "admin", "maintain": "write", "write": "write", "triage": "read", "read": "read"}


def _locked(method: Callable) -> Callable:
    @functools.wraps(method)
    def wrapper(self: "EmulatorState", *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return method(self, *args, **kwargs)

    return wrapper


def node_id(type_name: str, object_id: int) -> str:
    """GitHub's legacy global node id format, e.g. base64('011:PullRequest42')."""
    return base64.b64encode(f"{len(type_name):03d}:{type_name}{object_id}".encode()).decode()


def parse_node_id(value: str) -> tuple[str, int] | None:
    try:
        decoded = base64.b64decode(value, validate=True).decode()
        length, rest = decoded.split(":", 1)
        type_name, object_id = rest[: int(length)], int(rest[int(length) :])
    except (ValueError, UnicodeDecodeError):
        return None
    return type_name, object_id


def _as_bytes(content: FileContent) -> bytes:
    return content.encode() if isinstance(content, str) else bytes(content)


# --------------------------------------------------------------------------- model


@dataclass
class User:
    id: int
    login: str
    type: str = "User"  # User | Organization | Bot


@dataclass
class App:
    id: int
    slug: str
    name: str
    owner: User
    bot: User  # the "<slug>[bot]" user that authors everything an installation token writes
    public_key_pem: bytes
    client_id: str
    permissions: dict[str, str]
    events: list[str]
    created_at: datetime


@dataclass
class Installation:
    id: int
    account: User
    repository_selection: str  # all | selected
    repository_names: set[str]  # full names, used when selection is "selected"
    permissions: dict[str, str]
    created_at: datetime

    def covers(self, repo: "Repository") -> bool:
        if self.repository_selection == "all":
            return repo.owner.login == self.account.login
        return repo.full_name in self.repository_names


@dataclass
class InstallationToken:
    token: str
    installation_id: int
    expires_at: datetime
    permissions: dict[str, str]
    repository_names: set[str] | None  # None: every repository of the installation
    app: App | None = None  # whose installation token: the emulated App's unless another App's (a workflow's)


@dataclass
class Commit:
    sha: str
    tree: dict[str, bytes]
    parents: list[str]
    message: str
    author: User
    created_at: datetime
    network: int  # id of the root repository; forks share their parent's network


@dataclass
class Repository:
    id: int
    owner: User
    name: str
    private: bool
    default_branch: str
    network: int
    fork_of: "Repository | None" = None
    description: str | None = None
    branches: dict[str, str] = field(default_factory=dict)
    collaborators: dict[str, str] = field(default_factory=dict)  # login -> role
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    @property
    def full_name(self) -> str:
        return f"{self.owner.login}/{self.name}"


@dataclass
class PullRequest:
    id: int
    number: int
    repo: Repository
    head_repo: Repository
    title: str
    body: str | None
    user: User
    author_association: str
    draft: bool
    labels: list[str]
    base_ref: str
    base_sha: str
    head_ref: str
    head_sha: str
    created_at: datetime
    updated_at: datetime
    state: str = "open"
    merged: bool = False


@dataclass
class Review:
    id: int
    pr: PullRequest
    user: User
    body: str
    state: str  # PENDING | COMMENTED | APPROVED | CHANGES_REQUESTED | DISMISSED
    commit_id: str
    submitted_at: datetime | None
    author_association: str


@dataclass
class ReviewComment:
    id: int
    review_id: int
    pr: PullRequest
    user: User
    body: str
    path: str
    commit_id: str
    original_commit_id: str
    diff_hunk: str
    line: int | None
    side: str | None
    start_line: int | None
    start_side: str | None
    position: int | None
    subject_type: str  # line | file
    in_reply_to_id: int | None
    author_association: str
    created_at: datetime
    updated_at: datetime
    reactions: list[Reaction] = field(default_factory=list)


@dataclass
class ReviewThread:
    """A root review comment plus its replies; GraphQL exposes resolution on it."""

    id: int
    pr: PullRequest
    root_comment_id: int
    is_resolved: bool = False
    resolved_by: User | None = None


@dataclass
class Reaction:
    id: int
    user: User
    content: str
    created_at: datetime


@dataclass
class IssueComment:
    id: int
    repo: Repository
    issue_number: int
    user: User
    body: str
    author_association: str
    created_at: datetime
    updated_at: datetime
    reactions: list[Reaction] = field(default_factory=list)


@dataclass
class CheckRun:
    id: int
    repo: Repository
    app: App
    head_sha: str
    name: str
    status: str
    conclusion: str | None
    started_at: datetime | None
    completed_at: datetime | None
    details_url: str | None
    external_id: str
    check_suite_id: int
    output_title: str | None = None
    output_summary: str | None = None
    output_text: str | None = None
    annotations: list[dict[str, Any]] = field(default_factory=list)  # accumulated across updates
    images: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RateLimitBucket:
    limit: int = 5000
    used: int = 0
    reset: int = field(default_factory=lambda: int(time.time()) + 3600)

    @property
    def remaining(self) -> int:
        return max(self.limit - self.used, 0)


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    status: int = 0
    at: float = field(default_factory=time.time)  # when it arrived (wall clock, for rates over time)
    installation_id: int | None = None  # whose installation token it carried, valid or not
    user_agent: str = ""


class EmulatorError(Exception):
    """A GitHub-style error response raised from inside state operations."""

    def __init__(self, status: int, message: str, errors: list[Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.errors = status, message, errors


# --------------------------------------------------------------------------- state


class EmulatorState:
    def __init__(
        self,
        app_public_key_pem: bytes | str,
        app_id: int = 1,
        app_slug: str = "torchreview",
        app_name: str = "TorchReview",
        app_owner: str = "torchreview-dev",
        patch_size_limit: int = DEFAULT_PATCH_SIZE_LIMIT,
    ) -> None:
        self.lock = threading.RLock()
        self.faults = FaultInjector()
        self.requests: list[RecordedRequest] = []
        # Requests that do not fit GitHub's OpenAPI description (422/404 from validation, unknown URLs):
        # a client bug GitHub would also refuse. Kept so a long run can assert there were none.
        self.contract_violations: list[dict[str, Any]] = []
        self.patch_size_limit = patch_size_limit
        self.token_lifetime = timedelta(hours=1)
        self.rate_limits: dict[str, RateLimitBucket] = {}

        self._ids = itertools.count(1000)
        self.users: dict[str, User] = {}
        owner = self.user(app_owner, type="Organization")
        self.app = App(
            id=app_id,
            slug=app_slug,
            name=app_name,
            owner=owner,
            bot=self.user(f"{app_slug}[bot]", type="Bot"),
            public_key_pem=_as_bytes(app_public_key_pem),
            client_id=f"Iv1.{secrets.token_hex(8)}",
            permissions=dict(DEFAULT_INSTALLATION_PERMISSIONS),
            events=list(DEFAULT_APP_EVENTS),
            created_at=_now(),
        )
        self.installations: dict[int, Installation] = {}
        self.tokens: dict[str, InstallationToken] = {}
        self.archive_tokens: dict[str, tuple[str, float]] = {}  # token -> (repo full name, expiry)
        self.repos: dict[str, Repository] = {}
        self.commits: dict[str, Commit] = {}
        self.blobs: dict[str, bytes] = {}
        self.trees: dict[str, tuple[str, str]] = {}  # tree sha -> (commit sha, directory prefix)
        self._tree_cache: dict[tuple[str, str, bool], tuple[str, list[dict[str, Any]]]] = {}
        self._diff_cache: dict[tuple[str, str, int], list[FileDiff]] = {}
        self.pulls: dict[tuple[str, int], PullRequest] = {}
        self.issue_numbers: dict[str, int] = {}
        self.reviews: dict[int, Review] = {}
        self.review_comments: dict[int, ReviewComment] = {}
        self.review_threads: dict[int, ReviewThread] = {}
        self.issue_comments: dict[int, IssueComment] = {}
        self.check_runs: dict[int, CheckRun] = {}
        # where the App's events go, and GitHub's log of every delivery attempt
        self.app_webhook = AppWebhook(self.lock, self.next_id)
        # Other Apps' installations (a workflow's GITHUB_TOKEN is GitHub Actions' installation token): they
        # write check runs too, under their own App, and GitHub lets no App edit another's.
        self.other_installations: dict[int, Installation] = {}
        self.actions_app = App(id=15368, slug="github-actions", name="GitHub Actions",
                               owner=self.user("github", type="Organization"),
                               bot=self.user("github-actions[bot]", type="Bot"), public_key_pem=b"",
                               client_id="Iv1.github-actions", permissions={"checks": "write"}, events=[],
                               created_at=_now())

    def next_id(self) -> int:
        return next(self._ids)

    # ----------------------------------------------------------------- users & repos

    @_locked
    def user(self, login: str, type: str = "User") -> User:
        """The user with this login, created on first use."""
        if login not in self.users:
            self.users[login] = User(self.next_id(), login, type)
        return self.users[login]

    @_locked
    def add_installation(
        self,
        account: str,
        repositories: Iterable[str] | None = None,
        permissions: Mapping[str, str] | None = None,
        installation_id: int | None = None,
        account_type: str = "Organization",
    ) -> Installation:
        """Install the app on `account`: on all its repos, or only the named full names."""
        account_user = self.user(account, type=account_type)
        account_user.type = account_type
        installation = Installation(
            id=installation_id or self.next_id(),
            account=account_user,
            repository_selection="all" if repositories is None else "selected",
            repository_names=set(repositories or ()),
            permissions=dict(permissions or DEFAULT_INSTALLATION_PERMISSIONS),
            created_at=_now(),
        )
        self.installations[installation.id] = installation
        return installation

    @_locked
    def add_repo(
        self,
        full_name: str,
        files: Mapping[str, FileContent | None] | None = None,
        default_branch: str = "main",
        private: bool = False,
        fork_of: Repository | str | None = None,
        description: str | None = None,
    ) -> Repository:
        """Create a repository; with `files`, its default branch gets an initial commit."""
        owner_login, name = full_name.split("/")
        parent = self.repo(fork_of) if fork_of is not None else None
        repo_id = self.next_id()
        repo = Repository(
            id=repo_id,
            owner=self.users.get(owner_login) or self.user(owner_login),
            name=name,
            private=private,
            default_branch=default_branch,
            network=parent.network if parent else repo_id,
            fork_of=parent,
            description=description,
        )
        if parent:
            repo.branches = dict(parent.branches)
        self.repos[full_name] = repo
        if files is not None:
            self.commit(repo, files, branch=default_branch, message="Initial commit")
        return repo

    @_locked
    def fork(self, repo: Repository | str, owner: str) -> Repository:
        parent = self.repo(repo)
        return self.add_repo(f"{owner}/{parent.name}", fork_of=parent, default_branch=parent.default_branch)

    def repo(self, repo: Repository | str) -> Repository:
        if isinstance(repo, Repository):
            return repo
        if repo not in self.repos:
            raise KeyError(f"no repository {repo!r}")
        return self.repos[repo]

    @_locked
    def add_collaborator(self, repo: Repository | str, login: str, role: str = "write") -> None:
        """Give `login` a repository role: admin, maintain, write, triage or read."""
        if role not in ROLE_TO_PERMISSION:
            raise ValueError(f"unknown role {role!r}")
        self.user(login)
        self.repo(repo).collaborators[login] = role

    def permission_of(self, repo: Repository, login: str) -> tuple[str, str]:
        """(permission, role_name) as GitHub's collaborator permission endpoint reports it."""
        if login == repo.owner.login:
            return "admin", "admin"
        role = repo.collaborators.get(login)
        if role is None:
            return ("read", "read") if not repo.private else ("none", "none")
        return ROLE_TO_PERMISSION[role], role

    def author_association(self, repo: Repository, user: User) -> str:
        if user.login == repo.owner.login:
            return "OWNER"
        if user.login in repo.collaborators:
            return "COLLABORATOR"
        if user.type == "Bot":
            return "NONE"
        if any(pr.user.login == user.login for (name, _), pr in self.pulls.items() if name == repo.full_name):
            return "CONTRIBUTOR"
        return "NONE"

    # ----------------------------------------------------------------- git objects

    @_locked
    def commit(
        self,
        repo: Repository | str,
        files: Mapping[str, FileContent | None],
        parent: str | None = None,
        branch: str | None = None,
        message: str = "Update files",
        author: str | None = None,
    ) -> str:
        """Record a commit and return its sha.

        The tree is the parent's tree with `files` laid over it (a None value deletes
        the path); without a parent it is exactly `files`. `branch` is moved to it;
        a repository's first commit also becomes its default branch.
        """
        repo = self.repo(repo)
        tree = dict(self.commits[parent].tree) if parent else {}
        for path, content in files.items():
            if content is None:
                tree.pop(path, None)
            else:
                tree[path] = _as_bytes(content)
        for content in tree.values():
            self.blobs.setdefault(blob_sha(content), content)
        seed = f"{parent}:{message}:{self.next_id()}:{sorted((p, blob_sha(c)) for p, c in tree.items())}"
        sha = hashlib.sha1(seed.encode()).hexdigest()
        self.commits[sha] = Commit(
            sha=sha,
            tree=tree,
            parents=[parent] if parent else [],
            message=message,
            author=self.user(author) if author else repo.owner,
            created_at=_now(),
            network=repo.network,
        )
        if branch is None and not repo.branches:
            branch = repo.default_branch
        if branch is not None:
            repo.branches[branch] = sha
        return sha

    def resolve_ref(self, repo: Repository, ref: str | None) -> Commit | None:
        """A commit reachable from `repo` by sha (or 7+ char prefix), branch or PR ref."""
        ref = ref or repo.default_branch
        for prefix in ("refs/heads/", "heads/"):
            if ref.startswith(prefix) and ref[len(prefix) :] in repo.branches:
                return self.commits[repo.branches[ref[len(prefix) :]]]
        if ref in repo.branches:
            return self.commits[repo.branches[ref]]
        pull_ref = re.fullmatch(r"(?:refs/)?pull/(\d+)/head", ref)
        if pull_ref:
            pr = self.pulls.get((repo.full_name, int(pull_ref.group(1))))
            return self.commits[pr.head_sha] if pr else None
        if len(ref) >= 7 and all(c in "0123456789abcdef" for c in ref.lower()):
            matches = [c for sha, c in self.commits.items() if sha.startswith(ref.lower())]
            matches = [c for c in matches if c.network == repo.network]
            if len(matches) == 1:
                return matches[0]
        return None

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        return ancestor in self.ancestors(descendant)

    def ancestors(self, sha: str) -> list[str]:
        """`sha` and its ancestors, nearest first (breadth-first over parents)."""
        order, queue, seen = [], [sha], {sha}
        while queue:
            current = queue.pop(0)
            order.append(current)
            for parent in self.commits[current].parents:
                if parent not in seen:
                    seen.add(parent)
                    queue.append(parent)
        return order

    def merge_base(self, base: str, head: str) -> str | None:
        base_ancestry = set(self.ancestors(base))
        return next((sha for sha in self.ancestors(head) if sha in base_ancestry), None)

    def tree_listing(
        self, commit_sha: str, directory: str = "", recursive: bool = False
    ) -> tuple[str, list[dict[str, Any]]]:
        """(tree sha, entries) of a directory in a commit, in git's ls-tree shape.

        Tree shas are derived from the direct entries and remembered, so a sub-tree
        sha returned here can be fetched again (GET git/trees/{sha})."""
        prefix = f"{directory.strip('/')}/" if directory.strip("/") else ""
        cache_key = (commit_sha, prefix, recursive)
        if cache_key in self._tree_cache:  # commits are immutable, so listings are too
            return self._tree_cache[cache_key]
        entries: dict[str, dict[str, Any]] = {}
        for path, content in self.commits[commit_sha].tree.items():
            if not path.startswith(prefix):
                continue
            parts = path[len(prefix) :].split("/")
            directories = range(1, len(parts)) if recursive else range(1, min(len(parts), 2))
            for level in directories:
                sub = "/".join(parts[:level])
                if sub not in entries:
                    sub_sha, _ = self.tree_listing(commit_sha, prefix + sub)
                    entries[sub] = {"path": sub, "mode": "040000", "type": "tree", "sha": sub_sha}
            if recursive or len(parts) == 1:
                entries["/".join(parts)] = {
                    "path": "/".join(parts), "mode": "100644", "type": "blob",
                    "sha": blob_sha(content), "size": len(content),
                }
        listing = [entries[k] for k in sorted(entries)]
        if recursive:
            sha, _ = self.tree_listing(commit_sha, directory)
        else:
            sha = hashlib.sha1(repr([(e["path"], e["sha"]) for e in listing]).encode()).hexdigest()
            self.trees[sha] = (commit_sha, prefix.rstrip("/"))
        self._tree_cache[cache_key] = (sha, listing)
        return sha, listing

    def diff(self, base: str, head: str) -> list[FileDiff]:
        """Three-dot diff like GitHub's: merge-base(base, head) .. head."""
        start = self.merge_base(base, head) or base
        key = (start, head, self.patch_size_limit)
        if key not in self._diff_cache:  # commits are immutable; paginated listings re-ask
            self._diff_cache[key] = diff_trees(self.commits[start].tree, self.commits[head].tree, self.patch_size_limit)
        return self._diff_cache[key]

    # ----------------------------------------------------------------- pull requests

    @_locked
    def open_pull_request(
        self,
        repo: Repository | str,
        files: Mapping[str, FileContent | None] | None = None,
        *,
        title: str = "Update model code",
        body: str | None = "",
        user: str = "contributor",
        base: str | None = None,
        head: str = "feature",
        head_sha: str | None = None,
        head_repo: Repository | str | None = None,
        draft: bool = False,
        labels: Iterable[str] = (),
        author_association: str | None = None,
    ) -> PullRequest:
        """Open a PR. Either pass `files` (committed on top of the base branch in the
        head repository, on branch `head`) or an existing `head_sha`. `head_repo` set
        to a fork makes it a cross-repository PR."""
        repo = self.repo(repo)
        head_repository = self.repo(head_repo) if head_repo is not None else repo
        base = base or repo.default_branch
        base_sha = repo.branches[base]
        author = self.user(user)
        if head_sha is None:
            head_sha = self.commit(
                head_repository, files or {}, parent=base_sha, branch=head, message=title, author=user
            )
        else:
            head_repository.branches[head] = head_sha
        number = self._next_issue_number(repo)
        pr = PullRequest(
            id=self.next_id(),
            number=number,
            repo=repo,
            head_repo=head_repository,
            title=title,
            body=body,
            user=author,
            author_association=author_association or self._pr_author_association(repo, author),
            draft=draft,
            labels=list(labels),
            base_ref=base,
            base_sha=base_sha,
            head_ref=head,
            head_sha=head_sha,
            created_at=_now(),
            updated_at=_now(),
        )
        self.pulls[(repo.full_name, number)] = pr
        return pr

    def _pr_author_association(self, repo: Repository, author: User) -> str:
        association = self.author_association(repo, author)
        return "FIRST_TIME_CONTRIBUTOR" if association == "NONE" else association

    def _next_issue_number(self, repo: Repository) -> int:
        self.issue_numbers[repo.full_name] = self.issue_numbers.get(repo.full_name, 0) + 1
        return self.issue_numbers[repo.full_name]

    @_locked
    def push(self, pr: PullRequest, files: Mapping[str, FileContent | None], message: str = "Address review") -> str:
        """Add a commit on the PR's head branch (like `git push`); returns the new head sha."""
        sha = self.commit(
            pr.head_repo, files, parent=pr.head_sha, branch=pr.head_ref, message=message, author=pr.user.login
        )
        pr.head_sha, pr.updated_at = sha, _now()
        return sha

    def pull(self, repo: Repository | str, number: int) -> PullRequest | None:
        return self.pulls.get((self.repo(repo).full_name, number))

    def pull_files(self, pr: PullRequest, head_sha: str | None = None) -> list[FileDiff]:
        return self.diff(pr.base_sha, head_sha or pr.head_sha)

    # ----------------------------------------------------------------- conversation

    @_locked
    def add_issue_comment(self, pr: PullRequest, body: str, user: str) -> IssueComment:
        """A comment on a PR's conversation, e.g. a human's '@torchreview review'."""
        repo, issue_number = pr.repo, pr.number
        author = self.user(user)
        comment = IssueComment(
            id=self.next_id(),
            repo=repo,
            issue_number=issue_number,
            user=author,
            body=body,
            author_association=self.author_association(repo, author),
            created_at=_now(),
            updated_at=_now(),
        )
        self.issue_comments[comment.id] = comment
        return comment

    @_locked
    def react_to_review_comment(self, comment_id: int, content: str, user: str) -> Reaction:
        """A human's reaction (``-1``, ``+1``, ``eyes``...) on a review comment."""
        reaction = Reaction(self.next_id(), self.user(user), content, datetime.now(timezone.utc))
        self.review_comments[comment_id].reactions.append(reaction)
        return reaction

    def reply_to_review_comment(self, comment_id: int, body: str, user: str) -> ReviewComment:
        """A human reply in an existing review thread."""
        parent = self.review_comments[comment_id]
        author = self.user(user)
        review = self.new_review(parent.pr, author, "", "COMMENTED", parent.pr.head_sha)
        return self.new_review_comment(
            review, parent.path, body, parent.commit_id, parent.diff_hunk, parent.line, parent.side,
            None, None, parent.position, parent.subject_type, in_reply_to_id=self.thread_root(parent).id,
        )

    def new_review(self, pr: PullRequest, user: User, body: str, state: str, commit_id: str) -> Review:
        review = Review(
            id=self.next_id(),
            pr=pr,
            user=user,
            body=body,
            state=state,
            commit_id=commit_id,
            submitted_at=None if state == "PENDING" else _now(),
            author_association=self.author_association(pr.repo, user),
        )
        self.reviews[review.id] = review
        return review

    def new_review_comment(
        self,
        review: Review,
        path: str,
        body: str,
        commit_id: str,
        diff_hunk: str,
        line: int | None,
        side: str | None,
        start_line: int | None,
        start_side: str | None,
        position: int | None,
        subject_type: str = "line",
        in_reply_to_id: int | None = None,
    ) -> ReviewComment:
        comment = ReviewComment(
            id=self.next_id(),
            review_id=review.id,
            pr=review.pr,
            user=review.user,
            body=body,
            path=path,
            commit_id=commit_id,
            original_commit_id=commit_id,
            diff_hunk=diff_hunk,
            line=line,
            side=side,
            start_line=start_line,
            start_side=start_side,
            position=position,
            subject_type=subject_type,
            in_reply_to_id=in_reply_to_id,
            author_association=review.author_association,
            created_at=_now(),
            updated_at=_now(),
        )
        self.review_comments[comment.id] = comment
        if in_reply_to_id is None:
            thread = ReviewThread(id=self.next_id(), pr=review.pr, root_comment_id=comment.id)
            self.review_threads[thread.id] = thread
        return comment

    @_locked
    def resolve_thread(self, comment_id: int, user: str) -> ReviewThread:
        """A person resolves the review thread that ``comment_id`` is in (the "Resolve conversation" button)."""
        root = self.thread_root(self.review_comments[comment_id])
        thread = next(t for t in self.review_threads.values() if t.root_comment_id == root.id)
        thread.is_resolved, thread.resolved_by = True, self.user(user)
        return thread

    def thread_root(self, comment: ReviewComment) -> ReviewComment:
        while comment.in_reply_to_id is not None:
            comment = self.review_comments[comment.in_reply_to_id]
        return comment

    def thread_comments(self, thread: ReviewThread) -> list[ReviewComment]:
        root = self.review_comments.get(thread.root_comment_id)
        if root is None:
            return []
        return [c for c in self.review_comments.values() if self.thread_root(c).id == root.id]

    # ----------------------------------------------------------------- queries for tests

    @_locked
    def reviews_for(self, pr: PullRequest) -> list[Review]:
        return [r for r in self.reviews.values() if r.pr is pr]

    @_locked
    def review_comments_for(self, pr: PullRequest) -> list[ReviewComment]:
        return [c for c in self.review_comments.values() if c.pr is pr]

    @_locked
    def threads_for(self, pr: PullRequest) -> list[ReviewThread]:
        return [t for t in self.review_threads.values() if t.pr is pr and t.root_comment_id in self.review_comments]

    @_locked
    def issue_comments_for(self, pr: PullRequest) -> list[IssueComment]:
        return [c for c in self.issue_comments.values() if c.repo is pr.repo and c.issue_number == pr.number]

    @_locked
    def check_runs_for(self, sha: str, name: str | None = None) -> list[CheckRun]:
        return [r for r in self.check_runs.values() if r.head_sha == sha and (name is None or r.name == name)]

    @_locked
    def requests_matching(self, method: str = "*", path: str = "*") -> list[RecordedRequest]:
        """Recorded requests whose method and path match (path is a glob, `*` spans `/`)."""
        return [
            r
            for r in self.requests
            if (method == "*" or r.method == method.upper()) and fnmatch.fnmatchcase(r.path, path)
        ]

    # ----------------------------------------------------------------- auth helpers

    @_locked
    def issue_token(
        self, installation: Installation, permissions: Mapping[str, str] | None, repository_names: set[str] | None
    ) -> InstallationToken:
        granted = dict(permissions or installation.permissions)
        granted.setdefault("metadata", "read")  # GitHub always grants metadata read
        token = InstallationToken(
            token="ghs_" + secrets.token_urlsafe(27).replace("-", "A").replace("_", "b")[:36],
            installation_id=installation.id,
            expires_at=_now() + self.token_lifetime,
            permissions=granted,
            repository_names=repository_names,
            app=self.app,
        )
        self.tokens[token.token] = token
        return token

    @_locked
    def workflow_token(self, repo: "Repository", permissions: Mapping[str, str] | None = None) -> str:
        """A workflow run's ``GITHUB_TOKEN`` on ``repo`` (GitHub Actions' installation token, this repository
        only): what a pull request's own workflow acts with, ``checks: write`` by default."""
        installation = Installation(id=self.next_id(), account=repo.owner, repository_selection="selected",
                                    repository_names={repo.full_name},
                                    permissions={"checks": "write", "contents": "read", "metadata": "read",
                                                 **(permissions or {})}, created_at=_now())
        self.other_installations[installation.id] = installation
        token = self.issue_token(installation, None, {repo.full_name})
        token.app = self.actions_app
        return token.token

    @_locked
    def expire_tokens(self) -> None:
        """Make every issued installation token expired (clients then get 401)."""
        past = _now() - timedelta(seconds=1)
        for token in self.tokens.values():
            token.expires_at = past

    @_locked
    def revoke_tokens(self) -> None:
        self.tokens.clear()

    def rate_limit_bucket(self, principal: str) -> RateLimitBucket:
        """The primary rate-limit bucket of "installation:<id>", "app:<id>" or "anonymous"."""
        if principal not in self.rate_limits:
            self.rate_limits[principal] = RateLimitBucket(limit=60 if principal == "anonymous" else 5000)
        bucket = self.rate_limits[principal]
        if bucket.reset <= time.time():
            bucket.used, bucket.reset = 0, int(time.time()) + 3600
        return bucket


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def iso(value: datetime | None) -> str | None:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value else None
