"""JSON bodies in GitHub's shapes (modelled on the description's components/examples).

API urls point at the emulator; html urls too, under the same host, so links the
bot prints are clickable in a demo. Every field the response schemas require is
present, which the test-suite checks with response validation switched on.
"""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any
from urllib.parse import quote

from .app_webhook import HookDelivery
from .diffing import FileDiff
from .state import (
    App,
    CheckRun,
    Commit,
    EmulatorState,
    Installation,
    InstallationToken,
    IssueComment,
    PullRequest,
    Reaction,
    Repository,
    Review,
    ReviewComment,
    User,
    iso,
    node_id,
)

_REPO_URL_TEMPLATES = {
    "archive_url": "/{archive_format}{/ref}",
    "assignees_url": "/assignees{/user}",
    "blobs_url": "/git/blobs{/sha}",
    "branches_url": "/branches{/branch}",
    "collaborators_url": "/collaborators{/collaborator}",
    "comments_url": "/comments{/number}",
    "commits_url": "/commits{/sha}",
    "compare_url": "/compare/{base}...{head}",
    "contents_url": "/contents/{+path}",
    "contributors_url": "/contributors",
    "deployments_url": "/deployments",
    "downloads_url": "/downloads",
    "events_url": "/events",
    "forks_url": "/forks",
    "git_commits_url": "/git/commits{/sha}",
    "git_refs_url": "/git/refs{/sha}",
    "git_tags_url": "/git/tags{/sha}",
    "hooks_url": "/hooks",
    "issue_comment_url": "/issues/comments{/number}",
    "issue_events_url": "/issues/events{/number}",
    "issues_url": "/issues{/number}",
    "keys_url": "/keys{/key_id}",
    "labels_url": "/labels{/name}",
    "languages_url": "/languages",
    "merges_url": "/merges",
    "milestones_url": "/milestones{/number}",
    "notifications_url": "/notifications{?since,all,participating}",
    "pulls_url": "/pulls{/number}",
    "releases_url": "/releases{/id}",
    "stargazers_url": "/stargazers",
    "statuses_url": "/statuses/{sha}",
    "subscribers_url": "/subscribers",
    "subscription_url": "/subscription",
    "tags_url": "/tags",
    "teams_url": "/teams",
    "trees_url": "/git/trees{/sha}",
}


class Renderer:
    def __init__(self, state: EmulatorState, base_url: str) -> None:
        self.state = state
        self.api = base_url.rstrip("/")
        self.web = self.api  # the emulator serves both roles

    # ------------------------------------------------------------------ people & apps

    def user(self, user: User | None) -> dict[str, Any] | None:
        if user is None:
            return None
        api_user = f"{self.api}/users/{quote(user.login)}"
        return {
            "login": user.login,
            "id": user.id,
            "node_id": node_id(user.type if user.type != "Organization" else "Organization", user.id),
            "avatar_url": f"{self.web}/avatars/{quote(user.login)}",
            "gravatar_id": "",
            "url": api_user,
            "html_url": f"{self.web}/{quote(user.login)}",
            "followers_url": f"{api_user}/followers",
            "following_url": f"{api_user}/following{{/other_user}}",
            "gists_url": f"{api_user}/gists{{/gist_id}}",
            "starred_url": f"{api_user}/starred{{/owner}}{{/repo}}",
            "subscriptions_url": f"{api_user}/subscriptions",
            "organizations_url": f"{api_user}/orgs",
            "repos_url": f"{api_user}/repos",
            "events_url": f"{api_user}/events{{/privacy}}",
            "received_events_url": f"{api_user}/received_events",
            "type": user.type,
            "user_view_type": "public",
            "site_admin": False,
        }

    def app(self, app: App) -> dict[str, Any]:
        return {
            "id": app.id,
            "slug": app.slug,
            "client_id": app.client_id,
            "node_id": node_id("Integration", app.id),
            "owner": self.user(app.owner),
            "name": app.name,
            "description": "Reviews PyTorch pull requests",
            "external_url": f"{self.web}/apps/{app.slug}",
            "html_url": f"{self.web}/apps/{app.slug}",
            "created_at": iso(app.created_at),
            "updated_at": iso(app.created_at),
            "permissions": dict(app.permissions),
            "events": list(app.events),
            "installations_count": len(self.state.installations),
        }

    def installation(self, installation: Installation) -> dict[str, Any]:
        app = self.state.app
        return {
            "id": installation.id,
            "account": self.user(installation.account),
            "repository_selection": installation.repository_selection,
            "access_tokens_url": f"{self.api}/app/installations/{installation.id}/access_tokens",
            "repositories_url": f"{self.api}/installation/repositories",
            "html_url": (
                f"{self.web}/organizations/{installation.account.login}/settings/installations/{installation.id}"
            ),
            "app_id": app.id,
            "client_id": app.client_id,
            "app_slug": app.slug,
            "target_id": installation.account.id,
            "target_type": installation.account.type,
            "permissions": dict(installation.permissions),
            "events": list(app.events),
            "created_at": iso(installation.created_at),
            "updated_at": iso(installation.created_at),
            "single_file_name": None,
            "has_multiple_single_files": False,
            "single_file_paths": [],
            "suspended_at": None,
            "suspended_by": None,
        }

    def installation_token(self, token: InstallationToken) -> dict[str, Any]:
        body: dict[str, Any] = {
            "token": token.token,
            "expires_at": iso(token.expires_at),
            "permissions": dict(token.permissions),
            "repository_selection": "all" if token.repository_names is None else "selected",
        }
        if token.repository_names is not None:
            repos = [self.state.repos[name] for name in sorted(token.repository_names) if name in self.state.repos]
            body["repositories"] = [self.repository(repo) for repo in repos]
        return body

    # ------------------------------------------------------------------ repositories

    def repo_api_url(self, repo: Repository) -> str:
        return f"{self.api}/repos/{repo.full_name}"

    def repository(self, repo: Repository, full: bool = False) -> dict[str, Any]:
        api = self.repo_api_url(repo)
        pushed = max((self.state.commits[sha].created_at for sha in repo.branches.values()), default=repo.created_at)
        body: dict[str, Any] = {
            "id": repo.id,
            "node_id": node_id("Repository", repo.id),
            "name": repo.name,
            "full_name": repo.full_name,
            "owner": self.user(repo.owner),
            "private": repo.private,
            "html_url": f"{self.web}/{repo.full_name}",
            "description": repo.description,
            "fork": repo.fork_of is not None,
            "url": api,
            **{key: api + suffix for key, suffix in _REPO_URL_TEMPLATES.items()},
            "git_url": f"git://{self._host()}/{repo.full_name}.git",
            "ssh_url": f"git@{self._host()}:{repo.full_name}.git",
            "clone_url": f"{self.web}/{repo.full_name}.git",
            "svn_url": f"{self.web}/{repo.full_name}",
            "mirror_url": None,
            "homepage": None,
            "language": "Python",
            "forks_count": 0,
            "forks": 0,
            "stargazers_count": 0,
            "watchers_count": 0,
            "watchers": 0,
            "size": self._size_kb(repo),
            "default_branch": repo.default_branch,
            "open_issues_count": 0,
            "open_issues": 0,
            "is_template": False,
            "topics": [],
            "has_issues": True,
            "has_projects": True,
            "has_wiki": False,
            "has_pages": False,
            "has_downloads": True,
            "has_discussions": False,
            "archived": False,
            "disabled": False,
            "visibility": "private" if repo.private else "public",
            "license": None,
            "pushed_at": iso(pushed),
            "created_at": iso(repo.created_at),
            "updated_at": iso(pushed),
            "permissions": {"admin": False, "maintain": False, "push": False, "triage": False, "pull": True},
            "allow_forking": True,
            "web_commit_signoff_required": False,
        }
        if full:
            body.update(
                network_count=0,
                subscribers_count=0,
                allow_rebase_merge=True,
                allow_squash_merge=True,
                allow_merge_commit=True,
                allow_auto_merge=False,
                delete_branch_on_merge=False,
                temp_clone_token=None,
            )
            if repo.fork_of is not None:
                body["parent"] = self.repository(repo.fork_of)
                body["source"] = self.repository(repo.fork_of)
        return body

    def _size_kb(self, repo: Repository) -> int:
        default_head = repo.branches.get(repo.default_branch)
        return sum(map(len, self.state.commits[default_head].tree.values())) // 1024 if default_head else 0

    def _host(self) -> str:
        return self.api.split("://", 1)[-1]

    def collaborator_permission(self, repo: Repository, user: User) -> dict[str, Any]:
        permission, role = self.state.permission_of(repo, user.login)
        collaborator = self.user(user)
        collaborator["role_name"] = role
        collaborator["permissions"] = {
            "admin": permission == "admin",
            "maintain": role in ("admin", "maintain"),
            "push": permission in ("admin", "write"),
            "triage": permission in ("admin", "write") or role == "triage",
            "pull": permission != "none",
        }
        return {"permission": permission, "role_name": role, "user": collaborator}

    # ------------------------------------------------------------------ pull requests

    def _label(self, repo: Repository, name: str) -> dict[str, Any]:
        label_id = zlib.crc32(f"{repo.full_name}:{name}".encode())
        return {
            "id": label_id,
            "node_id": node_id("Label", label_id),
            "url": f"{self.repo_api_url(repo)}/labels/{quote(name)}",
            "name": name,
            "description": None,
            "color": "ededed",
            "default": False,
        }

    def _pull_part(self, pr: PullRequest, repo: Repository, ref: str, sha: str) -> dict[str, Any]:
        return {
            "label": f"{repo.owner.login}:{ref}",
            "ref": ref,
            "sha": sha,
            "user": self.user(repo.owner),
            "repo": self.repository(repo),
        }

    def pull_request_simple(self, pr: PullRequest) -> dict[str, Any]:
        """A pull request as GitHub lists it (``pull-request-simple``): no counts, no mergeability."""
        api = f"{self.repo_api_url(pr.repo)}/pulls/{pr.number}"
        issue = f"{self.repo_api_url(pr.repo)}/issues/{pr.number}"
        html = f"{self.web}/{pr.repo.full_name}/pull/{pr.number}"
        links = {
            "self": api,
            "html": html,
            "issue": issue,
            "comments": f"{issue}/comments",
            "review_comments": f"{api}/comments",
            "review_comment": f"{self.repo_api_url(pr.repo)}/pulls/comments{{/number}}",
            "commits": f"{api}/commits",
            "statuses": f"{self.repo_api_url(pr.repo)}/statuses/{pr.head_sha}",
        }
        return {
            "url": api,
            "id": pr.id,
            "node_id": node_id("PullRequest", pr.id),
            "html_url": html,
            "diff_url": f"{html}.diff",
            "patch_url": f"{html}.patch",
            "issue_url": issue,
            "commits_url": links["commits"],
            "review_comments_url": links["review_comments"],
            "review_comment_url": links["review_comment"],
            "comments_url": links["comments"],
            "statuses_url": links["statuses"],
            "number": pr.number,
            "state": pr.state,
            "locked": False,
            "title": pr.title,
            "user": self.user(pr.user),
            "body": pr.body,
            "labels": [self._label(pr.repo, name) for name in pr.labels],
            "milestone": None,
            "active_lock_reason": None,
            "created_at": iso(pr.created_at),
            "updated_at": iso(pr.updated_at),
            "closed_at": None,
            "merged_at": None,
            "merge_commit_sha": None,
            "assignee": None,
            "assignees": [],
            "requested_reviewers": [],
            "requested_teams": [],
            "head": self._pull_part(pr, pr.head_repo, pr.head_ref, pr.head_sha),
            "base": self._pull_part(pr, pr.repo, pr.base_ref, pr.base_sha),
            "_links": {key: {"href": href} for key, href in links.items()},
            "author_association": pr.author_association,
            "auto_merge": None,
            "draft": pr.draft,
        }

    def pull_request(self, pr: PullRequest) -> dict[str, Any]:
        files = self.state.pull_files(pr)
        base_history = set(self.state.ancestors(pr.base_sha))
        head_commits = [sha for sha in self.state.ancestors(pr.head_sha) if sha not in base_history]
        return {
            **self.pull_request_simple(pr),
            "merged": pr.merged,
            "mergeable": True,
            "rebaseable": True,
            "mergeable_state": "clean",
            "merged_by": None,
            "comments": len(self.state.issue_comments_for(pr)),
            "review_comments": len(self.state.review_comments_for(pr)),
            "maintainer_can_modify": pr.head_repo is not pr.repo,
            "commits": len(head_commits),
            "additions": sum(f.additions for f in files),
            "deletions": sum(f.deletions for f in files),
            "changed_files": len(files),
        }

    def diff_entry(self, diff: FileDiff, repo: Repository, ref: str) -> dict[str, Any]:
        path = quote(diff.filename)
        body: dict[str, Any] = {
            "sha": diff.sha,
            "filename": diff.filename,
            "status": diff.status,
            "additions": diff.additions,
            "deletions": diff.deletions,
            "changes": diff.changes,
            "blob_url": f"{self.web}/{repo.full_name}/blob/{ref}/{path}",
            "raw_url": f"{self.web}/{repo.full_name}/raw/{ref}/{path}",
            "contents_url": f"{self.repo_api_url(repo)}/contents/{path}?ref={ref}",
        }
        if diff.patch is not None:
            body["patch"] = diff.patch
        if diff.previous_filename is not None:
            body["previous_filename"] = diff.previous_filename
        return body

    def review(self, review: Review) -> dict[str, Any]:
        pr_url = f"{self.repo_api_url(review.pr.repo)}/pulls/{review.pr.number}"
        html = f"{self.web}/{review.pr.repo.full_name}/pull/{review.pr.number}#pullrequestreview-{review.id}"
        body: dict[str, Any] = {
            "id": review.id,
            "node_id": node_id("PullRequestReview", review.id),
            "user": self.user(review.user),
            "body": review.body,
            "state": review.state,
            "html_url": html,
            "pull_request_url": pr_url,
            "_links": {"html": {"href": html}, "pull_request": {"href": pr_url}},
            "commit_id": review.commit_id,
            "author_association": review.author_association,
        }
        if review.submitted_at is not None:
            body["submitted_at"] = iso(review.submitted_at)
        return body

    def review_comment(self, comment: ReviewComment) -> dict[str, Any]:
        repo_api = self.repo_api_url(comment.pr.repo)
        url = f"{repo_api}/pulls/comments/{comment.id}"
        pr_url = f"{repo_api}/pulls/{comment.pr.number}"
        html = f"{self.web}/{comment.pr.repo.full_name}/pull/{comment.pr.number}#discussion_r{comment.id}"
        body: dict[str, Any] = {
            "url": url,
            "pull_request_review_id": comment.review_id,
            "id": comment.id,
            "node_id": node_id("PullRequestReviewComment", comment.id),
            "diff_hunk": comment.diff_hunk,
            "path": comment.path,
            "position": comment.position,
            "original_position": comment.position,
            "commit_id": comment.commit_id,
            "original_commit_id": comment.original_commit_id,
            "user": self.user(comment.user),
            "body": comment.body,
            "created_at": iso(comment.created_at),
            "updated_at": iso(comment.updated_at),
            "html_url": html,
            "pull_request_url": pr_url,
            "author_association": comment.author_association,
            "_links": {"self": {"href": url}, "html": {"href": html}, "pull_request": {"href": pr_url}},
            "subject_type": comment.subject_type,
            "start_line": comment.start_line,
            "original_start_line": comment.start_line,
            "start_side": comment.start_side,
            "line": comment.line,
            "original_line": comment.line,
            "side": comment.side,
        }
        if comment.in_reply_to_id is not None:
            body["in_reply_to_id"] = comment.in_reply_to_id
        return body

    # ------------------------------------------------------------------ issues

    def issue_comment(self, comment: IssueComment) -> dict[str, Any]:
        repo_api = self.repo_api_url(comment.repo)
        return {
            "id": comment.id,
            "node_id": node_id("IssueComment", comment.id),
            "url": f"{repo_api}/issues/comments/{comment.id}",
            "html_url": f"{self.web}/{comment.repo.full_name}/pull/{comment.issue_number}#issuecomment-{comment.id}",
            "body": comment.body,
            "user": self.user(comment.user),
            "created_at": iso(comment.created_at),
            "updated_at": iso(comment.updated_at),
            "issue_url": f"{repo_api}/issues/{comment.issue_number}",
            "author_association": comment.author_association,
            "reactions": self._reaction_rollup(comment),
        }

    def _reaction_rollup(self, comment: IssueComment) -> dict[str, Any]:
        keys = {"+1": "+1", "-1": "-1", "laugh": "laugh", "confused": "confused", "heart": "heart",
                "hooray": "hooray", "eyes": "eyes", "rocket": "rocket"}
        rollup: dict[str, Any] = {
            "url": f"{self.repo_api_url(comment.repo)}/issues/comments/{comment.id}/reactions",
            "total_count": len(comment.reactions),
        }
        for content, key in keys.items():
            rollup[key] = sum(1 for r in comment.reactions if r.content == content)
        return rollup

    def reaction(self, reaction: Reaction) -> dict[str, Any]:
        return {
            "id": reaction.id,
            "node_id": node_id("Reaction", reaction.id),
            "user": self.user(reaction.user),
            "content": reaction.content,
            "created_at": iso(reaction.created_at),
        }

    # ------------------------------------------------------------------ checks

    def check_run(self, run: CheckRun) -> dict[str, Any]:
        url = f"{self.repo_api_url(run.repo)}/check-runs/{run.id}"
        pulls = [
            pr for (name, _), pr in self.state.pulls.items()
            if name == run.repo.full_name and pr.head_sha == run.head_sha and pr.head_repo is pr.repo
        ]
        return {
            "id": run.id,
            "head_sha": run.head_sha,
            "node_id": node_id("CheckRun", run.id),
            "external_id": run.external_id,
            "url": url,
            "html_url": f"{self.web}/{run.repo.full_name}/runs/{run.id}",
            "details_url": run.details_url or f"{self.web}/apps/{run.app.slug}",
            "status": run.status,
            "conclusion": run.conclusion,
            "started_at": iso(run.started_at),
            "completed_at": iso(run.completed_at),
            "output": {
                "title": run.output_title,
                "summary": run.output_summary,
                "text": run.output_text,
                "annotations_count": len(run.annotations),
                "annotations_url": f"{url}/annotations",
            },
            "name": run.name,
            "check_suite": {"id": run.check_suite_id},
            "app": self.app(run.app),
            "pull_requests": [self._check_run_pull(pr) for pr in pulls],
        }

    def _check_run_pull(self, pr: PullRequest) -> dict[str, Any]:
        def part(repo: Repository, ref: str, sha: str) -> dict[str, Any]:
            return {"ref": ref, "sha": sha, "repo": {"id": repo.id, "url": self.repo_api_url(repo), "name": repo.name}}

        return {
            "id": pr.id,
            "number": pr.number,
            "url": f"{self.repo_api_url(pr.repo)}/pulls/{pr.number}",
            "head": part(pr.head_repo, pr.head_ref, pr.head_sha),
            "base": part(pr.repo, pr.base_ref, pr.base_sha),
        }

    # ------------------------------------------------------------------ git data

    def _content_links(self, repo: Repository, path: str, ref: str, sha: str, kind: str) -> dict[str, Any]:
        quoted = quote(path)
        url = f"{self.repo_api_url(repo)}/contents/{quoted}?ref={quote(ref, safe='')}"
        git_kind = "trees" if kind == "dir" else "blobs"
        git_url = f"{self.repo_api_url(repo)}/git/{git_kind}/{sha}"
        html = f"{self.web}/{repo.full_name}/{'tree' if kind == 'dir' else 'blob'}/{ref}/{quoted}"
        return {
            "url": url,
            "git_url": git_url,
            "html_url": html,
            "download_url": f"{self.api}/_raw/{repo.full_name}/{ref}/{quoted}" if kind == "file" else None,
            "_links": {"self": url, "git": git_url, "html": html},
        }

    def content_file(
        self, repo: Repository, path: str, ref: str, content: bytes, sha: str, inline_limit: int
    ) -> dict[str, Any]:
        body = {
            "type": "file",
            "name": path.rsplit("/", 1)[-1],
            "path": path,
            "sha": sha,
            "size": len(content),
            **self._content_links(repo, path, ref, sha, "file"),
        }
        if len(content) <= inline_limit:
            body.update(encoding="base64", content=_wrapped_base64(content))
        else:  # GitHub: files over 1 MB come back without content
            body.update(encoding="none", content="")
        return body

    def content_entry(self, repo: Repository, path: str, ref: str, entry: dict[str, Any]) -> dict[str, Any]:
        kind = "dir" if entry["type"] == "tree" else "file"
        return {
            "type": kind,
            "name": path.rsplit("/", 1)[-1],
            "path": path,
            "sha": entry["sha"],
            "size": entry.get("size", 0),
            **self._content_links(repo, path, ref, entry["sha"], kind),
        }

    def tree(self, repo: Repository, sha: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
        def with_url(entry: dict[str, Any]) -> dict[str, Any]:
            kind = "trees" if entry["type"] == "tree" else "blobs"
            return {**entry, "url": f"{self.repo_api_url(repo)}/git/{kind}/{entry['sha']}"}

        return {
            "sha": sha,
            "url": f"{self.repo_api_url(repo)}/git/trees/{sha}",
            "tree": [with_url(e) for e in entries],
            "truncated": False,
        }

    def blob(self, repo: Repository, sha: str, content: bytes) -> dict[str, Any]:
        return {
            "sha": sha,
            "node_id": node_id("Blob", int(sha[:12], 16)),
            "size": len(content),
            "url": f"{self.repo_api_url(repo)}/git/blobs/{sha}",
            "content": _wrapped_base64(content),
            "encoding": "base64",
        }

    def commit(self, repo: Repository, commit: Commit) -> dict[str, Any]:
        api = f"{self.repo_api_url(repo)}/commits/{commit.sha}"
        tree_sha, _ = self.state.tree_listing(commit.sha)
        signature = {"name": commit.author.login, "email": f"{commit.author.login}@users.noreply.github.com",
                     "date": iso(commit.created_at)}
        return {
            "url": api,
            "sha": commit.sha,
            "node_id": node_id("Commit", int(commit.sha[:12], 16)),
            "html_url": f"{self.web}/{repo.full_name}/commit/{commit.sha}",
            "comments_url": f"{api}/comments",
            "commit": {
                "url": f"{self.repo_api_url(repo)}/git/commits/{commit.sha}",
                "author": signature,
                "committer": signature,
                "message": commit.message,
                "comment_count": 0,
                "tree": {"sha": tree_sha, "url": f"{self.repo_api_url(repo)}/git/trees/{tree_sha}"},
            },
            "author": self.user(commit.author),
            "committer": self.user(commit.author),
            "parents": [
                {"sha": p, "url": f"{self.repo_api_url(repo)}/commits/{p}",
                 "html_url": f"{self.web}/{repo.full_name}/commit/{p}"}
                for p in commit.parents
            ],
        }

    # ------------------------------------------------------------------ the App's webhook deliveries

    def hook_delivery_item(self, delivery: HookDelivery) -> dict[str, Any]:
        return {
            "id": delivery.id,
            "guid": delivery.guid,
            "delivered_at": iso(delivery.delivered_at),
            "redelivery": delivery.redelivery,
            "duration": delivery.duration,
            "status": delivery.status,
            "status_code": delivery.status_code,
            "event": delivery.event,
            "action": delivery.action,
            "installation_id": delivery.installation_id,
            "repository_id": delivery.repository_id,
            "throttled_at": None,
        }

    def hook_delivery(self, delivery: HookDelivery) -> dict[str, Any]:
        return {
            **self.hook_delivery_item(delivery),
            "url": delivery.url,
            "request": {"headers": dict(delivery.request_headers), "payload": json.loads(delivery.body)},
            "response": {"headers": dict(delivery.response_headers) or None, "payload": delivery.response_body},
        }

    # ------------------------------------------------------------------ rate limit

    def rate_limit(self, limit: int, used: int, reset: int) -> dict[str, Any]:
        core = {"limit": limit, "used": used, "remaining": max(limit - used, 0), "reset": reset}
        search = {"limit": 30, "used": 0, "remaining": 30, "reset": reset}
        return {"resources": {"core": core, "search": search, "graphql": dict(core)}, "rate": core}


def _wrapped_base64(content: bytes) -> str:
    """GitHub wraps base64 content at 60 characters with '\\n'."""
    encoded = base64.b64encode(content).decode()
    return "".join(encoded[i : i + 60] + "\n" for i in range(0, len(encoded), 60))
