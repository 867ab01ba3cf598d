"""REST handlers for the operations the app uses (see contract.OPERATIONS).

`ROUTES` declares, per operation, its URL rule and who may call it; app.py runs the
common pipeline (faults, auth, rate limit, OpenAPI validation) from that table
before dispatching to the handler method named there.
"""

from __future__ import annotations

import io
import secrets
import tarfile
import time
import zipfile
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlencode

from flask import Response, g, jsonify, request

from .diffing import FileDiff, blob_sha
from .render import Renderer
from .state import (
    PERMISSION_RANK,
    CheckRun,
    EmulatorError,
    EmulatorState,
    PullRequest,
    Reaction,
    Repository,
    Review,
    _now,
)

MAX_PER_PAGE = 100
MAX_PR_FILES = 3000  # GitHub lists at most 3000 files of a pull request
MAX_COMPARE_FILES = 300
MAX_CONTENT_INLINE_BYTES = 1024 * 1024  # larger files come back with encoding "none"
ARCHIVE_LINK_LIFETIME_S = 300
HOOK_CURSOR_PREFIX = "v1_"  # GitHub's delivery cursors look like v1_12077215967
REVIEW_STATE_FOR_EVENT = {"APPROVE": "APPROVED", "REQUEST_CHANGES": "CHANGES_REQUESTED", "COMMENT": "COMMENTED"}


@dataclass(frozen=True)
class Route:
    """One operation: `auth` is "app" (JWT), "installation" (token) or "none"."""

    operation_id: str | None  # None for emulator-only endpoints (not in the description)
    method: str
    rule: str
    handler: str
    auth: str = "installation"
    permissions: tuple[str, ...] = ()  # any of these installation permissions suffices
    level: str = "read"


_REPO = "/repos/<owner>/<repo>"
ROUTES: tuple[Route, ...] = (
    Route("apps/get-authenticated", "GET", "/app", "get_app", auth="app"),
    Route("apps/create-installation-access-token", "POST", "/app/installations/<int:installation_id>/access_tokens",
          "create_access_token", auth="app"),
    Route("apps/get-repo-installation", "GET", f"{_REPO}/installation", "get_repo_installation", auth="app"),
    Route("repos/get", "GET", _REPO, "get_repo", permissions=("metadata",)),
    Route("pulls/list", "GET", f"{_REPO}/pulls", "list_pulls", permissions=("pull_requests",)),
    Route("pulls/get", "GET", f"{_REPO}/pulls/<int:pull_number>", "get_pull", permissions=("pull_requests",)),
    Route("pulls/list-files", "GET", f"{_REPO}/pulls/<int:pull_number>/files", "list_pull_files",
          permissions=("pull_requests",)),
    Route("pulls/list-reviews", "GET", f"{_REPO}/pulls/<int:pull_number>/reviews", "list_reviews",
          permissions=("pull_requests",)),
    Route("pulls/create-review", "POST", f"{_REPO}/pulls/<int:pull_number>/reviews", "create_review",
          permissions=("pull_requests",), level="write"),
    Route("pulls/list-review-comments", "GET", f"{_REPO}/pulls/<int:pull_number>/comments", "list_review_comments",
          permissions=("pull_requests",)),
    Route("pulls/create-review-comment", "POST", f"{_REPO}/pulls/<int:pull_number>/comments", "create_review_comment",
          permissions=("pull_requests",), level="write"),
    Route("pulls/delete-review-comment", "DELETE", f"{_REPO}/pulls/comments/<int:comment_id>", "delete_review_comment",
          permissions=("pull_requests",), level="write"),
    Route("pulls/update-review-comment", "PATCH", f"{_REPO}/pulls/comments/<int:comment_id>", "update_review_comment",
          permissions=("pull_requests",), level="write"),
    Route("checks/create", "POST", f"{_REPO}/check-runs", "create_check_run", permissions=("checks",), level="write"),
    Route("checks/update", "PATCH", f"{_REPO}/check-runs/<int:check_run_id>", "update_check_run",
          permissions=("checks",), level="write"),
    Route("checks/list-for-ref", "GET", f"{_REPO}/commits/<path:ref>/check-runs", "list_check_runs_for_ref",
          permissions=("checks",)),
    Route("repos/get-content", "GET", f"{_REPO}/contents/", "get_content", permissions=("contents",)),
    Route("repos/get-content", "GET", f"{_REPO}/contents/<path:path>", "get_content", permissions=("contents",)),
    Route("git/get-tree", "GET", f"{_REPO}/git/trees/<path:tree_sha>", "get_tree", permissions=("contents",)),
    Route("git/get-blob", "GET", f"{_REPO}/git/blobs/<file_sha>", "get_blob", permissions=("contents",)),
    Route("repos/download-tarball-archive", "GET", f"{_REPO}/tarball/<path:ref>", "download_tarball",
          permissions=("contents",)),
    Route("repos/download-zipball-archive", "GET", f"{_REPO}/zipball/<path:ref>", "download_zipball",
          permissions=("contents",)),
    Route("repos/compare-commits-with-basehead", "GET", f"{_REPO}/compare/<path:basehead>", "compare",
          permissions=("contents",)),
    Route("issues/list-comments", "GET", f"{_REPO}/issues/<int:issue_number>/comments", "list_issue_comments",
          permissions=("issues", "pull_requests")),
    Route("issues/create-comment", "POST", f"{_REPO}/issues/<int:issue_number>/comments", "create_issue_comment",
          permissions=("issues", "pull_requests"), level="write"),
    Route("issues/update-comment", "PATCH", f"{_REPO}/issues/comments/<int:comment_id>", "update_issue_comment",
          permissions=("issues", "pull_requests"), level="write"),
    Route("reactions/create-for-issue-comment", "POST", f"{_REPO}/issues/comments/<int:comment_id>/reactions",
          "create_issue_comment_reaction", permissions=("issues", "pull_requests"), level="write"),
    Route("reactions/list-for-pull-request-review-comment", "GET",
          f"{_REPO}/pulls/comments/<int:comment_id>/reactions", "list_review_comment_reactions",
          permissions=("pull_requests",)),
    Route("repos/get-collaborator-permission-level", "GET", f"{_REPO}/collaborators/<username>/permission",
          "get_collaborator_permission", permissions=("metadata",)),
    Route("rate-limit/get", "GET", "/rate_limit", "get_rate_limit", auth="any"),
    Route("apps/list-webhook-deliveries", "GET", "/app/hook/deliveries", "list_hook_deliveries", auth="app"),
    Route("apps/get-webhook-delivery", "GET", "/app/hook/deliveries/<int:delivery_id>", "get_hook_delivery",
          auth="app"),
    Route("apps/redeliver-webhook-delivery", "POST", "/app/hook/deliveries/<int:delivery_id>/attempts",
          "redeliver_hook_delivery", auth="app"),
    # Emulator-only: where the tarball redirect points (GitHub uses codeload.github.com).
    Route(None, "GET", "/_codeload/<owner>/<repo>/legacy.tar.gz/<path:ref>", "codeload_tarball", auth="none"),
    Route(None, "GET", "/_codeload/<owner>/<repo>/legacy.zip/<path:ref>", "codeload_zipball", auth="none"),
)


def unprocessable(*messages: str) -> EmulatorError:
    """GitHub's `validation-error-simple` 422 (e.g. review comments off the diff)."""
    return EmulatorError(422, "Unprocessable Entity", list(messages))


def validation_failed(resource: str, field: str, message: str, code: str = "invalid") -> EmulatorError:
    error = {"resource": resource, "field": field, "code": code, "message": message}
    return EmulatorError(422, "Validation Failed", [error])


def _wants_raw(accept: str) -> bool:
    """``application/vnd.github.raw`` or ``...raw+json``: the media type GitHub documents for raw contents."""
    return any(part.split(";")[0].strip() in ("application/vnd.github.raw", "application/vnd.github.raw+json")
               for part in accept.split(","))


def not_found(message: str = "Not Found") -> EmulatorError:
    return EmulatorError(404, message)


class RestApi:
    """Handlers; `g.repo` / `g.principal` are set by the pipeline before they run."""

    def __init__(self, state: EmulatorState) -> None:
        self.state = state

    @property
    def render(self) -> Renderer:
        """Built per request, so urls use the host the client called."""
        return g.renderer

    # ------------------------------------------------------------------ helpers

    def _body(self) -> dict[str, Any]:
        return request.get_json(silent=True) or {}

    def _pull(self, number: int) -> PullRequest:
        pr = self.state.pull(g.repo, number)
        if pr is None:
            raise not_found()
        return pr

    def _paginated(self, items: list[Any], render, default_per_page: int = 30) -> Response:
        """A page of `items` with GitHub-style Link headers (first/prev/next/last)."""
        per_page = min(max(request.args.get("per_page", default_per_page, type=int), 1), MAX_PER_PAGE)
        page = max(request.args.get("page", 1, type=int), 1)
        last_page = max((len(items) + per_page - 1) // per_page, 1)
        response = jsonify([render(item) for item in items[(page - 1) * per_page : page * per_page]])
        targets: dict[str, int] = {}
        if page > 1:
            targets["prev"] = page - 1
        if page < last_page:
            targets.update(next=page + 1, last=last_page)
        if page > 1:
            targets["first"] = 1
        links = [
            f'<{request.base_url}?{urlencode({**request.args.to_dict(), "per_page": per_page, "page": target})}>; '
            f'rel="{rel}"'
            for rel, target in targets.items()
        ]
        if links:
            response.headers["Link"] = ", ".join(links)
        return response

    # ------------------------------------------------------------------ apps

    def get_app(self) -> Response:
        return jsonify(self.render.app(self.state.app))

    def list_hook_deliveries(self) -> Response:
        """Newest first, paged by an opaque cursor in the Link header (GitHub's shape for this list)."""
        per_page = min(max(request.args.get("per_page", 30, type=int), 1), MAX_PER_PAGE)
        deliveries = self.state.app_webhook.newest_first()
        cursor = request.args.get("cursor")
        if cursor:
            if not cursor.startswith(HOOK_CURSOR_PREFIX) or not cursor[len(HOOK_CURSOR_PREFIX):].isdigit():
                raise EmulatorError(400, "Invalid cursor")
            before = int(cursor[len(HOOK_CURSOR_PREFIX):])
            deliveries = [d for d in deliveries if d.id < before]
        # GitHub's classes by status_code: an attempt with no HTTP response (0) is in neither
        wanted = {"success": range(200, 400), "failure": range(400, 600)}.get(request.args.get("status", ""))
        if wanted is not None:
            deliveries = [d for d in deliveries if d.status_code in wanted]
        page = deliveries[:per_page]
        response = jsonify([self.render.hook_delivery_item(d) for d in page])
        if len(deliveries) > per_page:
            query = {**request.args.to_dict(), "per_page": per_page, "cursor": f"{HOOK_CURSOR_PREFIX}{page[-1].id}"}
            response.headers["Link"] = f'<{request.base_url}?{urlencode(query)}>; rel="next"'
        return response

    def get_hook_delivery(self, delivery_id: int) -> Response:
        delivery = self.state.app_webhook.get(delivery_id)
        if delivery is None:
            raise not_found()
        return jsonify(self.render.hook_delivery(delivery))

    def redeliver_hook_delivery(self, delivery_id: int) -> Response:
        if self.state.app_webhook.redeliver_later(delivery_id) is None:
            raise not_found()
        response = jsonify({})
        response.status_code = 202
        return response

    def create_access_token(self, installation_id: int) -> Response:
        installation = self.state.installations.get(installation_id)
        if installation is None:
            raise not_found()
        body = self._body()
        requested = body.get("permissions") or None
        for permission, level in (requested or {}).items():
            granted = installation.permissions.get(permission, "none")
            if PERMISSION_RANK.get(level, 99) > PERMISSION_RANK.get(granted, 0):
                raise EmulatorError(422, "The permissions requested are not granted to this installation.")
        names = self._token_repositories(installation, body)
        token = self.state.issue_token(installation, requested, names)
        return jsonify(self.render.installation_token(token)), 201

    def _token_repositories(self, installation, body: dict[str, Any]) -> set[str] | None:
        """Full names a token is narrowed to (None: all the installation's repositories)."""
        names, ids = body.get("repositories") or [], body.get("repository_ids") or []
        if not names and not ids:
            return None
        by_id = {r.id: r for r in self.state.repos.values()}
        wanted = [self.state.repos.get(f"{installation.account.login}/{n}") for n in names]
        wanted += [by_id.get(i) for i in ids]
        if any(repo is None or not installation.covers(repo) for repo in wanted):
            raise EmulatorError(
                422,
                "There is at least one repository that does not exist or is not accessible to the parent installation.",
            )
        return {repo.full_name for repo in wanted}

    def get_repo_installation(self, owner: str, repo: str) -> Response:
        repository = self.state.repos.get(f"{owner}/{repo}")
        installation = next(
            (i for i in self.state.installations.values() if repository and i.covers(repository)), None
        )
        if installation is None:
            raise not_found()
        return jsonify(self.render.installation(installation))

    def get_rate_limit(self) -> Response:
        bucket = self.state.rate_limit_bucket(g.rate_limit_principal)
        return jsonify(self.render.rate_limit(bucket.limit, bucket.used, bucket.reset))

    # ------------------------------------------------------------------ repositories

    def get_repo(self, owner: str, repo: str) -> Response:
        return jsonify(self.render.repository(g.repo, full=True))

    def get_collaborator_permission(self, owner: str, repo: str, username: str) -> Response:
        user = self.state.users.get(username)
        if user is None:
            raise not_found()
        return jsonify(self.render.collaborator_permission(g.repo, user))

    # ------------------------------------------------------------------ pull requests

    def list_pulls(self, owner: str, repo: str) -> Response:
        """GitHub's filters (state, base, head as ``owner:branch``), orders and pages; the simple form of each."""
        state = request.args.get("state", "open")
        base = request.args.get("base")
        head = request.args.get("head")
        head_owner, _, head_ref = head.rpartition(":") if head else ("", "", "")
        pulls = [pr for (name, _), pr in self.state.pulls.items() if name == g.repo.full_name
                 and (state == "all" or pr.state == state)
                 and (base is None or pr.base_ref == base)
                 # a head without an owner is read as the repository owner's branch
                 and (head is None or (pr.head_ref == head_ref
                                       and pr.head_repo.owner.login == (head_owner or g.repo.owner.login)))]
        sort = request.args.get("sort", "created")
        now = _now()
        if sort == "long-running":  # open more than a month, active within the last one
            month = timedelta(days=30)
            pulls = [pr for pr in pulls if now - pr.created_at > month and now - pr.updated_at < month]
        key = {"created": lambda pr: (pr.created_at, pr.number), "long-running": lambda pr: (pr.created_at, pr.number),
               "updated": lambda pr: (pr.updated_at, pr.number),
               "popularity": lambda pr: (len(self.state.issue_comments_for(pr)), pr.number)}[sort]
        descending = request.args.get("direction", "desc" if sort == "created" else "asc") == "desc"
        pulls.sort(key=key, reverse=descending)
        return self._paginated(pulls, self.render.pull_request_simple)

    def get_pull(self, owner: str, repo: str, pull_number: int) -> Response:
        return jsonify(self.render.pull_request(self._pull(pull_number)))

    def list_pull_files(self, owner: str, repo: str, pull_number: int) -> Response:
        pr = self._pull(pull_number)
        files = self.state.pull_files(pr)[:MAX_PR_FILES]
        return self._paginated(files, lambda f: self.render.diff_entry(f, pr.head_repo, pr.head_sha))

    def list_reviews(self, owner: str, repo: str, pull_number: int) -> Response:
        pr = self._pull(pull_number)
        return self._paginated(self.state.reviews_for(pr), self.render.review)

    def create_review(self, owner: str, repo: str, pull_number: int) -> Response:
        pr = self._pull(pull_number)
        body = self._body()
        event = body.get("event")
        commit_id = self._pr_commit(pr, body.get("commit_id"))
        comments = body.get("comments") or []
        if event in ("REQUEST_CHANGES", "COMMENT") and not body.get("body") and not comments:
            raise unprocessable(f"Review body is required for {event} reviews")
        reviewer = self.state.app.bot
        if event is None and any(r.user is reviewer and r.state == "PENDING" for r in self.state.reviews_for(pr)):
            raise unprocessable("User can only have one pending review per pull request")
        # Anchor every comment first: one bad line rejects the whole review, like GitHub.
        files = {f.filename: f for f in self.state.pull_files(pr, commit_id)}
        anchors = [_anchor(files, c) for c in comments]
        review_state = REVIEW_STATE_FOR_EVENT.get(event, "PENDING")
        review = self.state.new_review(pr, reviewer, body.get("body", ""), review_state, commit_id)
        for comment, anchor in zip(comments, anchors):
            self._store_comment(review, comment, anchor, commit_id)
        return jsonify(self.render.review(review))

    def _pr_commit(self, pr: PullRequest, commit_id: str | None) -> str:
        if not commit_id:
            return pr.head_sha
        commit = self.state.commits.get(commit_id)
        if commit is None or not self.state.is_ancestor(commit_id, pr.head_sha):
            raise unprocessable(f"No commit found for SHA: {commit_id}")
        return commit_id

    def _store_comment(self, review: Review, comment: dict[str, Any], anchor: "_Anchor", commit_id: str):
        return self.state.new_review_comment(
            review,
            path=comment["path"],
            body=comment["body"],
            commit_id=commit_id,
            diff_hunk=anchor.diff_hunk,
            line=anchor.line,
            side=anchor.side,
            start_line=anchor.start_line,
            start_side=anchor.start_side,
            position=anchor.position,
            subject_type=anchor.subject_type,
        )

    def list_review_comments(self, owner: str, repo: str, pull_number: int) -> Response:
        pr = self._pull(pull_number)
        comments = self.state.review_comments_for(pr)
        since = request.args.get("since")
        if since:
            threshold = _parse_time(since)
            comments = [c for c in comments if c.updated_at >= threshold]
        key = (lambda c: c.updated_at) if request.args.get("sort") == "updated" else (lambda c: c.id)
        comments.sort(key=key, reverse=request.args.get("direction") == "desc")
        return self._paginated(comments, self.render.review_comment)

    def create_review_comment(self, owner: str, repo: str, pull_number: int) -> Response:
        pr = self._pull(pull_number)
        body = self._body()
        reviewer = self.state.app.bot
        if body.get("in_reply_to") is not None:
            parent = self.state.review_comments.get(body["in_reply_to"])
            if parent is None or parent.pr is not pr:
                raise not_found()
            root = self.state.thread_root(parent)
            review = self.state.new_review(pr, reviewer, "", "COMMENTED", parent.commit_id)
            comment = self.state.new_review_comment(
                review, root.path, body["body"], parent.commit_id, root.diff_hunk, root.line, root.side,
                root.start_line, root.start_side, root.position, root.subject_type, in_reply_to_id=root.id,
            )
            return jsonify(self.render.review_comment(comment)), 201
        commit_id = self._pr_commit(pr, body.get("commit_id"))
        files = {f.filename: f for f in self.state.pull_files(pr, commit_id)}
        anchor = _anchor(files, body)
        review = self.state.new_review(pr, reviewer, "", "COMMENTED", commit_id)
        comment = self._store_comment(review, body, anchor, commit_id)
        return jsonify(self.render.review_comment(comment)), 201

    def _own_review_comment(self, comment_id: int):
        comment = self.state.review_comments.get(comment_id)
        if comment is None or comment.pr.repo is not g.repo:
            raise not_found()
        return comment

    def list_review_comment_reactions(self, owner: str, repo: str, comment_id: int) -> Response:
        comment = self._own_review_comment(comment_id)
        return jsonify([self.render.reaction(r) for r in comment.reactions])

    def update_review_comment(self, owner: str, repo: str, comment_id: int) -> Response:
        comment = self._own_review_comment(comment_id)
        comment.body, comment.updated_at = self._body()["body"], _now()
        return jsonify(self.render.review_comment(comment))

    def delete_review_comment(self, owner: str, repo: str, comment_id: int) -> Response:
        comment = self._own_review_comment(comment_id)
        replies = sorted(
            (c for c in self.state.review_comments.values() if c.in_reply_to_id == comment.id), key=lambda c: c.id
        )
        del self.state.review_comments[comment.id]
        if replies:  # the oldest reply takes over the thread
            new_root, *others = replies
            new_root.in_reply_to_id = None
            for other in others:
                other.in_reply_to_id = new_root.id
            for thread in self.state.review_threads.values():
                if thread.root_comment_id == comment.id:
                    thread.root_comment_id = new_root.id
        return Response(status=204)

    # ------------------------------------------------------------------ checks

    def create_check_run(self, owner: str, repo: str) -> Response:
        body = self._body()
        commit = self.state.commits.get(body["head_sha"])
        if commit is None or commit.network != g.repo.network:
            raise unprocessable(f"No commit found for SHA: {body['head_sha']}")
        run = CheckRun(
            id=self.state.next_id(),
            repo=g.repo,
            app=g.principal.app or self.state.app,  # the App whose token created it
            head_sha=commit.sha,
            name=body["name"],
            status="queued",
            conclusion=None,
            started_at=_now(),
            completed_at=None,
            details_url=body.get("details_url"),
            external_id=body.get("external_id", ""),
            check_suite_id=self._check_suite_id(g.repo, commit.sha),
        )
        self._apply_check_run_changes(run, body)
        self.state.check_runs[run.id] = run
        return jsonify(self.render.check_run(run)), 201

    def _check_suite_id(self, repo: Repository, sha: str) -> int:
        existing = next((r for r in self.state.check_runs.values() if r.repo is repo and r.head_sha == sha), None)
        return existing.check_suite_id if existing else self.state.next_id()

    def update_check_run(self, owner: str, repo: str, check_run_id: int) -> Response:
        run = self.state.check_runs.get(check_run_id)
        if run is None or run.repo is not g.repo:
            raise not_found()
        app = g.principal.app or self.state.app
        if run.app.id != app.id:
            raise EmulatorError(403, f"Invalid app_id `{app.id}` - check run can only be modified by the "
                                     "GitHub App that created it.")
        self._apply_check_run_changes(run, self._body())
        return jsonify(self.render.check_run(run))

    def _apply_check_run_changes(self, run: CheckRun, body: dict[str, Any]) -> None:
        for field in ("name", "details_url", "external_id"):
            if field in body:
                setattr(run, field, body[field])
        if "started_at" in body:
            run.started_at = _parse_time(body["started_at"])
        if "status" in body:
            run.status = body["status"]
        if "conclusion" in body:  # a conclusion implies completion
            run.conclusion, run.status = body["conclusion"], "completed"
        if "completed_at" in body:
            run.completed_at = _parse_time(body["completed_at"])
        if run.status == "completed":
            if run.conclusion is None:
                raise validation_failed("CheckRun", "conclusion", "conclusion is required when status is completed",
                                        code="missing_field")
            run.completed_at = run.completed_at or _now()
        output = body.get("output")
        if output:
            run.output_title = output.get("title", run.output_title)
            run.output_summary = output.get("summary", run.output_summary)
            run.output_text = output.get("text", run.output_text)
            run.annotations.extend(output.get("annotations", []))  # appended, as GitHub documents
            if "images" in output:
                run.images = list(output["images"])
        if "actions" in body:
            run.actions = list(body["actions"])

    def list_check_runs_for_ref(self, owner: str, repo: str, ref: str) -> Response:
        commit = self.state.resolve_ref(g.repo, ref)
        if commit is None:
            raise unprocessable(f"No commit found for SHA: {ref}")
        runs = [r for r in self.state.check_runs.values() if r.repo is g.repo and r.head_sha == commit.sha]
        if name := request.args.get("check_name"):
            runs = [r for r in runs if r.name == name]
        if status := request.args.get("status"):
            runs = [r for r in runs if r.status == status]
        if (app_id := request.args.get("app_id", type=int)) is not None:
            runs = [r for r in runs if r.app.id == app_id]
        if request.args.get("filter", "latest") == "latest":
            latest: dict[str, CheckRun] = {}
            for run in runs:
                if run.name not in latest or run.id > latest[run.name].id:
                    latest[run.name] = run
            runs = list(latest.values())
        runs.sort(key=lambda r: r.id, reverse=True)
        per_page = min(request.args.get("per_page", 30, type=int), MAX_PER_PAGE)
        page = request.args.get("page", 1, type=int)
        shown = runs[(page - 1) * per_page : page * per_page]
        return jsonify({"total_count": len(runs), "check_runs": [self.render.check_run(r) for r in shown]})

    # ------------------------------------------------------------------ contents & git data

    def _commit_at(self, ref: str | None):
        commit = self.state.resolve_ref(g.repo, ref)
        if commit is None:
            raise not_found(f"No commit found for the ref {ref}")
        return commit

    def get_content(self, owner: str, repo: str, path: str = "") -> Response:
        ref = request.args.get("ref") or g.repo.default_branch
        commit = self._commit_at(ref)
        path = path.strip("/")
        if path in commit.tree:
            content = commit.tree[path]
            return jsonify(
                self.render.content_file(g.repo, path, ref, content, blob_sha(content), MAX_CONTENT_INLINE_BYTES)
            )
        if path and not any(p.startswith(path + "/") for p in commit.tree):
            raise not_found()
        _, entries = self.state.tree_listing(commit.sha, path)
        prefix = f"{path}/" if path else ""
        return jsonify([self.render.content_entry(g.repo, prefix + e["path"], ref, e) for e in entries])

    def get_tree(self, owner: str, repo: str, tree_sha: str) -> Response:
        recursive = "recursive" in request.args
        if tree_sha in self.state.trees:
            commit_sha, directory = self.state.trees[tree_sha]
        else:
            commit_sha, directory = self._commit_at(tree_sha).sha, ""
        sha, entries = self.state.tree_listing(commit_sha, directory, recursive=recursive)
        return jsonify(self.render.tree(g.repo, sha, entries))

    def get_blob(self, owner: str, repo: str, file_sha: str) -> Response:
        content = self.state.blobs.get(file_sha)
        if content is None:
            raise not_found()
        if _wants_raw(request.headers.get("Accept", "")):
            # GitHub's documented custom media type for blobs: the bytes themselves, no base64 JSON
            return Response(content, mimetype="application/vnd.github.raw")
        return jsonify(self.render.blob(g.repo, file_sha, content))

    def download_tarball(self, owner: str, repo: str, ref: str) -> Response:
        return self._archive_redirect(ref, "legacy.tar.gz")

    def download_zipball(self, owner: str, repo: str, ref: str) -> Response:
        return self._archive_redirect(ref, "legacy.zip")

    def _archive_redirect(self, ref: str, kind: str) -> Response:
        commit = self._commit_at(ref)
        link_token = secrets.token_urlsafe(16)
        self.state.archive_tokens[link_token] = (g.repo.full_name, time.time() + ARCHIVE_LINK_LIFETIME_S)
        query = urlencode({"token": link_token})
        location = f"{self.render.api}/_codeload/{g.repo.full_name}/{kind}/{commit.sha}?{query}"
        return Response(status=302, headers={"Location": location})

    def codeload_tarball(self, owner: str, repo: str, ref: str) -> Response:
        repository, commit, root = self._archive_source(owner, repo, ref)
        return Response(_tarball(root, commit.tree, commit.created_at),
                        headers={"Content-Type": "application/x-gzip",
                                 "Content-Disposition": f"attachment; filename={root}.tar.gz"})

    def codeload_zipball(self, owner: str, repo: str, ref: str) -> Response:
        repository, commit, root = self._archive_source(owner, repo, ref)
        return Response(_zipball(root, commit.tree, commit.created_at),
                        headers={"Content-Type": "application/zip",
                                 "Content-Disposition": f"attachment; filename={root}.zip"})

    def _archive_source(self, owner: str, repo: str, ref: str):
        full_name, expires = self.state.archive_tokens.get(request.args.get("token", ""), ("", 0))
        repository = self.state.repos.get(full_name)
        if full_name != f"{owner}/{repo}" or expires < time.time() or repository is None:
            raise not_found()
        commit = self.state.resolve_ref(repository, ref)
        if commit is None:
            raise not_found()
        return repository, commit, f"{repository.owner.login}-{repository.name}-{commit.sha[:7]}"

    def compare(self, owner: str, repo: str, basehead: str) -> Response:
        base_ref, separator, head_ref = basehead.partition("...")
        if not separator:
            base_ref, separator, head_ref = basehead.partition("..")
        base, head = self.state.resolve_ref(g.repo, base_ref), self.state.resolve_ref(g.repo, head_ref)
        if not separator or base is None or head is None:
            raise not_found()
        merge_base = self.state.merge_base(base.sha, head.sha)
        base_history = set(self.state.ancestors(base.sha))
        head_history = set(self.state.ancestors(head.sha))
        ahead = [sha for sha in reversed(self.state.ancestors(head.sha)) if sha not in base_history]
        behind_by = len(base_history - head_history)
        status = (
            "identical" if not ahead and not behind_by
            else "ahead" if not behind_by
            else "behind" if not ahead
            else "diverged"
        )
        per_page = min(request.args.get("per_page", 250, type=int), 250)
        page = request.args.get("page", 1, type=int)
        files = self.state.diff(base.sha, head.sha)[:MAX_COMPARE_FILES]
        api = f"{self.render.repo_api_url(g.repo)}/compare/{basehead}"
        html = f"{self.render.web}/{g.repo.full_name}/compare/{basehead}"
        merge_base_commit = self.state.commits[merge_base] if merge_base else base
        return jsonify({
            "url": api,
            "html_url": html,
            "permalink_url": f"{self.render.web}/{g.repo.full_name}/compare/{base.sha[:7]}...{head.sha[:7]}",
            "diff_url": f"{html}.diff",
            "patch_url": f"{html}.patch",
            "base_commit": self.render.commit(g.repo, base),
            "merge_base_commit": self.render.commit(g.repo, merge_base_commit),
            "status": status,
            "ahead_by": len(ahead),
            "behind_by": behind_by,
            "total_commits": len(ahead),
            "commits": [
                self.render.commit(g.repo, self.state.commits[sha])
                for sha in ahead[(page - 1) * per_page : page * per_page]
            ],
            "files": [self.render.diff_entry(f, g.repo, head.sha) for f in files],
        })

    # ------------------------------------------------------------------ issue comments

    def list_issue_comments(self, owner: str, repo: str, issue_number: int) -> Response:
        pr = self._pull(issue_number)
        comments = sorted(self.state.issue_comments_for(pr), key=lambda c: c.id)
        if since := request.args.get("since"):
            threshold = _parse_time(since)
            comments = [c for c in comments if c.updated_at >= threshold]
        return self._paginated(comments, self.render.issue_comment)

    def create_issue_comment(self, owner: str, repo: str, issue_number: int) -> Response:
        pr = self._pull(issue_number)
        comment = self.state.add_issue_comment(pr, self._body()["body"], self.state.app.bot.login)
        return jsonify(self.render.issue_comment(comment)), 201

    def _own_issue_comment(self, comment_id: int):
        comment = self.state.issue_comments.get(comment_id)
        if comment is None or comment.repo is not g.repo:
            raise not_found()
        return comment

    def update_issue_comment(self, owner: str, repo: str, comment_id: int) -> Response:
        comment = self._own_issue_comment(comment_id)
        comment.body, comment.updated_at = self._body()["body"], _now()
        return jsonify(self.render.issue_comment(comment))

    def create_issue_comment_reaction(self, owner: str, repo: str, comment_id: int) -> Response:
        comment = self._own_issue_comment(comment_id)
        content, user = self._body()["content"], self.state.app.bot
        existing = next((r for r in comment.reactions if r.user is user and r.content == content), None)
        if existing is not None:
            return jsonify(self.render.reaction(existing)), 200
        reaction = Reaction(self.state.next_id(), user, content, _now())
        comment.reactions.append(reaction)
        return jsonify(self.render.reaction(reaction)), 201


# ---------------------------------------------------------------------- review anchors


@dataclass(frozen=True)
class _Anchor:
    diff_hunk: str
    line: int | None
    side: str | None
    start_line: int | None
    start_side: str | None
    position: int | None
    subject_type: str


def _anchor(files: dict[str, FileDiff], comment: dict[str, Any]) -> _Anchor:
    """Where a review comment lands in the diff, or the 422 GitHub gives for it."""
    diff = files.get(comment.get("path", ""))
    if diff is None:
        raise unprocessable("Path could not be resolved")
    if comment.get("subject_type") == "file":
        return _Anchor("", None, None, None, None, None, "file")
    if comment.get("line") is None and comment.get("position") is not None:
        row = diff.row_at_position(comment["position"])
        if row is None:
            raise unprocessable("Pull request review thread position is invalid")
        side = "LEFT" if row.kind == "-" else "RIGHT"
        line = row.old_line if side == "LEFT" else row.new_line
        return _Anchor(diff.diff_hunk_for(row), line, side, None, None, comment["position"], "line")
    if comment.get("line") is None:
        raise unprocessable("Pull request review thread line must be part of the diff")
    side = comment.get("side") or "RIGHT"
    if side not in ("LEFT", "RIGHT"):
        raise unprocessable(f"Pull request review thread side is invalid: {side}")
    row = diff.row_for_line(side, comment["line"])
    if row is None:
        raise unprocessable("Pull request review thread line must be part of the diff")
    start_line, start_side = comment.get("start_line"), None
    if start_line is not None:
        start_side = comment.get("start_side") or side
        start_row = diff.row_for_line(start_side, start_line)
        if start_row is None:
            raise unprocessable("Pull request review thread start line must be part of the diff")
        if start_row.hunk != row.hunk:
            raise unprocessable("Pull request review thread start and end lines must be part of the same hunk")
        if diff.position_of(start_row) >= diff.position_of(row):
            raise unprocessable("Pull request review thread start_line must precede the end line")
    position = diff.position_of(row)
    return _Anchor(diff.diff_hunk_for(row), comment["line"], side, start_line, start_side, position, "line")


# ---------------------------------------------------------------------- small helpers


def _parse_time(value: str) -> datetime:
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _zipball(root: str, tree: dict[str, bytes], mtime: datetime) -> bytes:
    """A zip archive laid out like GitHub's zipball: every path under `<owner>-<repo>-<sha7>/`."""
    buffer = io.BytesIO()
    stamp = mtime.timetuple()[:6]
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(zipfile.ZipInfo(f"{root}/", stamp), b"")
        for path in sorted(tree):
            archive.writestr(zipfile.ZipInfo(f"{root}/{path}", stamp), tree[path])
    return buffer.getvalue()


def _tarball(root: str, tree: dict[str, bytes], mtime: datetime) -> bytes:
    """A gzip tarball laid out like GitHub's: every path under `<owner>-<repo>-<sha7>/`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        directory = tarfile.TarInfo(root)
        directory.type, directory.mode, directory.mtime = tarfile.DIRTYPE, 0o755, int(mtime.timestamp())
        archive.addfile(directory)
        for path in sorted(tree):
            info = tarfile.TarInfo(f"{root}/{path}")
            info.size, info.mode, info.mtime = len(tree[path]), 0o644, int(mtime.timestamp())
            archive.addfile(info, io.BytesIO(tree[path]))
    return buffer.getvalue()
