"""A small GraphQL endpoint: enough of GitHub's schema for review threads.

Supports `repository(owner, name) { pullRequest(number) { reviewThreads(first, after) ... } }`
and the `resolveReviewThread` / `unresolveReviewThread` mutations. The parser handles
operations, variables (with defaults), aliases, arguments, nested selections and
inline fragments; named fragments and directives are not supported.
"""

from __future__ import annotations

import base64
import json
import re
from datetime import datetime, timezone
from dataclasses import dataclass, field
from typing import Any, Callable

from .auth import InstallationPrincipal
from .state import EmulatorState, PullRequest, Repository, ReviewComment, ReviewThread, iso, node_id, parse_node_id


class GraphQLError(Exception):
    def __init__(self, message: str, error_type: str | None = None, path: list[Any] | None = None) -> None:
        super().__init__(message)
        self.message, self.type, self.path = message, error_type, path or []

    def as_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"message": self.message}
        if self.type:
            error["type"] = self.type
        if self.path:
            error["path"] = self.path
        return error


# ----------------------------------------------------------------------------- parsing

_TOKEN = re.compile(
    r'(?P<skip>[\s,]+|\#[^\n]*)|(?P<spread>\.\.\.)|(?P<punct>[{}()\[\]:!$=@])'
    r'|(?P<string>"(?:[^"\\]|\\.)*")|(?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|(?P<name>[_A-Za-z][_0-9A-Za-z]*)'
)


@dataclass
class Field:
    name: str
    alias: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    selections: list["Field"] = field(default_factory=list)
    inline_fragment: bool = False  # `... on Type { }`: its selections merge into the parent

    @property
    def key(self) -> str:
        return self.alias or self.name


@dataclass
class Operation:
    kind: str  # query | mutation
    selections: list[Field]
    variable_defaults: dict[str, Any]


@dataclass(frozen=True)
class _Variable:
    name: str


class _Parser:
    def __init__(self, source: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        position = 0
        while position < len(source):
            match = _TOKEN.match(source, position)
            if match is None:
                raise GraphQLError(f"Parse error on {source[position]!r} at offset {position}")
            position = match.end()
            if match.lastgroup != "skip":
                self.tokens.append((match.lastgroup, match.group()))
        self.index = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token[1] != expected):
            found = token[1] if token else "end of document"
            raise GraphQLError(f"Parse error on {found!r}" + (f", expected {expected!r}" if expected else ""))
        self.index += 1
        return token[1]

    def at(self, value: str) -> bool:
        token = self.peek()
        return token is not None and token[1] == value

    def operation(self) -> Operation:
        kind, defaults = "query", {}
        if not self.at("{"):
            kind = self.take()
            if kind not in ("query", "mutation"):
                raise GraphQLError(f"Unsupported definition {kind!r}: only queries and mutations")
            if self.peek() and self.peek()[0] == "name":
                self.take()  # operation name
            if self.at("("):
                defaults = self.variable_definitions()
        selections = self.selection_set()
        if self.peek() is not None:
            raise GraphQLError("Only one operation per document is supported")
        return Operation(kind, selections, defaults)

    def variable_definitions(self) -> dict[str, Any]:
        defaults: dict[str, Any] = {}
        self.take("(")
        while not self.at(")"):
            self.take("$")
            name = self.take()
            self.take(":")
            self.type_reference()
            if self.at("="):
                self.take("=")
                defaults[name] = self.value()
        self.take(")")
        return defaults

    def type_reference(self) -> None:
        if self.at("["):
            self.take("[")
            self.type_reference()
            self.take("]")
        else:
            self.take()
        if self.at("!"):
            self.take("!")

    def selection_set(self) -> list[Field]:
        self.take("{")
        fields = []
        while not self.at("}"):
            fields.append(self.selection())
        self.take("}")
        return fields

    def selection(self) -> Field:
        if self.at("..."):
            self.take("...")
            if not self.at("on"):
                raise GraphQLError("Named fragments are not supported")
            self.take("on")
            type_name = self.take()
            return Field(type_name, selections=self.selection_set(), inline_fragment=True)
        name, alias = self.take(), None
        if self.at(":"):
            self.take(":")
            alias, name = name, self.take()
        arguments = self.arguments() if self.at("(") else {}
        selections = self.selection_set() if self.at("{") else []
        return Field(name, alias, arguments, selections)

    def arguments(self) -> dict[str, Any]:
        self.take("(")
        arguments = {}
        while not self.at(")"):
            name = self.take()
            self.take(":")
            arguments[name] = self.value()
        self.take(")")
        return arguments

    def value(self) -> Any:
        kind, text = self.peek() or ("", "")
        if text == "$":
            self.take("$")
            return _Variable(self.take())
        if text == "[":
            self.take("[")
            items = []
            while not self.at("]"):
                items.append(self.value())
            self.take("]")
            return items
        if text == "{":
            self.take("{")
            obj = {}
            while not self.at("}"):
                key = self.take()
                self.take(":")
                obj[key] = self.value()
            self.take("}")
            return obj
        self.take()
        if kind == "string":
            return json.loads(text)  # GraphQL string escapes are JSON's
        if kind == "number":
            return float(text) if any(c in text for c in ".eE") else int(text)
        return {"true": True, "false": False, "null": None}.get(text, text)  # enums stay strings


def parse(source: str) -> Operation:
    return _Parser(source).operation()


def _substitute(value: Any, variables: dict[str, Any]) -> Any:
    if isinstance(value, _Variable):
        return variables.get(value.name)
    if isinstance(value, list):
        return [_substitute(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, variables) for k, v in value.items()}
    return value


# ----------------------------------------------------------------------------- schema

SCALAR = "Scalar"
Resolver = Callable[[Any, dict[str, Any], "Context"], Any]


@dataclass
class Context:
    state: EmulatorState
    principal: InstallationPrincipal
    base_url: str


@dataclass
class Connection:
    """A Relay connection page over `items` (cursor = opaque offset)."""

    node_type: str
    items: list[Any]
    offset: int
    total: int
    has_next: bool


def _cursor(offset: int) -> str:
    return base64.b64encode(f"cursor:v2:{offset}".encode()).decode()


def _connection(node_type: str, items: list[Any], args: dict[str, Any]) -> Connection:
    start = 0
    if args.get("after"):
        try:
            start = int(base64.b64decode(args["after"]).decode().rsplit(":", 1)[1]) + 1
        except (ValueError, IndexError):
            raise GraphQLError(f"`{args['after']}` does not appear to be a valid cursor.") from None
    first = args.get("first") or 100
    if first > 100:
        raise GraphQLError(f"Requesting {first} records on the connection exceeds the `first` limit of 100 records.")
    page = items[start : start + first]
    return Connection(node_type, page, start, len(items), start + first < len(items))


def _repository(_: Any, args: dict[str, Any], ctx: Context) -> Repository:
    repo = ctx.state.repos.get(f"{args.get('owner')}/{args.get('name')}")
    if repo is None or not ctx.principal.can_access(repo):
        raise GraphQLError(
            f"Could not resolve to a Repository with the name '{args.get('owner')}/{args.get('name')}'.", "NOT_FOUND"
        )
    return repo


def _pull_request(repo: Repository, args: dict[str, Any], ctx: Context) -> PullRequest:
    pr = ctx.state.pull(repo, args.get("number"))
    if pr is None:
        raise GraphQLError(f"Could not resolve to a PullRequest with the number of {args.get('number')}.", "NOT_FOUND")
    return pr


def _thread_root(thread: ReviewThread, ctx: Context) -> ReviewComment:
    return ctx.state.review_comments[thread.root_comment_id]


def _thread_is_outdated(thread: ReviewThread, args: dict[str, Any], ctx: Context) -> bool:
    """Outdated when the commented line is gone from, or changed in, the current diff."""
    root = _thread_root(thread, ctx)
    if root.subject_type == "file" or root.line is None:
        return False
    current = {f.filename: f for f in ctx.state.pull_files(thread.pr)}.get(root.path)
    row = current.row_for_line(root.side or "RIGHT", root.line) if current else None
    return row is None or row.text != root.diff_hunk.rsplit("\n", 1)[-1]


def _set_resolution(resolved: bool) -> Resolver:
    def mutate(_: Any, args: dict[str, Any], ctx: Context) -> dict[str, Any]:
        payload = args.get("input") or {}
        parsed = parse_node_id(str(payload.get("threadId", "")))
        thread = ctx.state.review_threads.get(parsed[1]) if parsed and parsed[0] == "PullRequestReviewThread" else None
        if thread is None or not ctx.principal.can_access(thread.pr.repo):
            raise GraphQLError(
                f"Could not resolve to a node with the global id of '{payload.get('threadId')}'", "NOT_FOUND"
            )
        if not ctx.principal.has_permission("pull_requests", "write"):
            raise GraphQLError("Resource not accessible by integration", "FORBIDDEN")
        thread.is_resolved = resolved
        thread.resolved_by = ctx.state.app.bot if resolved else None
        return {"clientMutationId": payload.get("clientMutationId"), "thread": thread}

    return mutate


def _attr(name: str) -> Resolver:
    return lambda obj, args, ctx: getattr(obj, name)


def _key(name: str) -> Resolver:
    return lambda obj, args, ctx: obj[name]


SCHEMA: dict[str, dict[str, tuple[str, Resolver]]] = {
    "Query": {
        "repository": ("Repository", _repository),
        "viewer": ("Actor", lambda _, args, ctx: ctx.state.app.bot),
        "rateLimit": (
            "RateLimit",
            lambda _, args, ctx: ctx.state.rate_limit_bucket(f"installation:{ctx.principal.installation.id}"),
        ),
    },
    "Mutation": {
        "resolveReviewThread": ("ResolveReviewThreadPayload", _set_resolution(True)),
        "unresolveReviewThread": ("ResolveReviewThreadPayload", _set_resolution(False)),
    },
    "ResolveReviewThreadPayload": {
        "clientMutationId": (SCALAR, _key("clientMutationId")),
        "thread": ("PullRequestReviewThread", _key("thread")),
    },
    "RateLimit": {
        "limit": (SCALAR, _attr("limit")),
        "remaining": (SCALAR, _attr("remaining")),
        "used": (SCALAR, _attr("used")),
        "cost": (SCALAR, lambda obj, args, ctx: 1),
        "resetAt": (SCALAR, lambda obj, args, ctx: iso(datetime.fromtimestamp(obj.reset, timezone.utc))),
    },
    "Actor": {
        "login": (SCALAR, _attr("login")),
        "__typename": (SCALAR, lambda obj, args, ctx: "Bot" if obj.type == "Bot" else "User"),
    },
    "Repository": {
        "id": (SCALAR, lambda r, args, ctx: node_id("Repository", r.id)),
        "databaseId": (SCALAR, _attr("id")),
        "name": (SCALAR, _attr("name")),
        "nameWithOwner": (SCALAR, _attr("full_name")),
        "owner": ("Actor", _attr("owner")),
        "pullRequest": ("PullRequest", _pull_request),
    },
    "PullRequest": {
        "id": (SCALAR, lambda pr, args, ctx: node_id("PullRequest", pr.id)),
        "databaseId": (SCALAR, _attr("id")),
        "number": (SCALAR, _attr("number")),
        "title": (SCALAR, _attr("title")),
        "isDraft": (SCALAR, _attr("draft")),
        "state": (SCALAR, lambda pr, args, ctx: pr.state.upper()),
        "headRefOid": (SCALAR, _attr("head_sha")),
        "baseRefOid": (SCALAR, _attr("base_sha")),
        "headRefName": (SCALAR, _attr("head_ref")),
        "baseRefName": (SCALAR, _attr("base_ref")),
        "url": (SCALAR, lambda pr, args, ctx: f"{ctx.base_url}/{pr.repo.full_name}/pull/{pr.number}"),
        "author": ("Actor", _attr("user")),
        "reviewThreads": (
            "Connection:PullRequestReviewThread",
            lambda pr, args, ctx: _connection(
                "PullRequestReviewThread", sorted(ctx.state.threads_for(pr), key=lambda t: t.id), args
            ),
        ),
    },
    "PullRequestReviewThread": {
        "id": (SCALAR, lambda t, args, ctx: node_id("PullRequestReviewThread", t.id)),
        "isResolved": (SCALAR, _attr("is_resolved")),
        "isOutdated": (SCALAR, _thread_is_outdated),
        "isCollapsed": (SCALAR, _attr("is_resolved")),
        "path": (SCALAR, lambda t, args, ctx: _thread_root(t, ctx).path),
        "line": (SCALAR, lambda t, args, ctx: None if _thread_is_outdated(t, args, ctx) else _thread_root(t, ctx).line),
        "originalLine": (SCALAR, lambda t, args, ctx: _thread_root(t, ctx).line),
        "startLine": (SCALAR, lambda t, args, ctx: _thread_root(t, ctx).start_line),
        "originalStartLine": (SCALAR, lambda t, args, ctx: _thread_root(t, ctx).start_line),
        "diffSide": (SCALAR, lambda t, args, ctx: _thread_root(t, ctx).side),
        "startDiffSide": (SCALAR, lambda t, args, ctx: _thread_root(t, ctx).start_side),
        "subjectType": (SCALAR, lambda t, args, ctx: _thread_root(t, ctx).subject_type.upper()),
        "resolvedBy": ("Actor", _attr("resolved_by")),
        "viewerCanResolve": (SCALAR, lambda t, args, ctx: not t.is_resolved),
        "viewerCanUnresolve": (SCALAR, lambda t, args, ctx: t.is_resolved),
        "viewerCanReply": (SCALAR, lambda t, args, ctx: True),
        "pullRequest": ("PullRequest", _attr("pr")),
        "comments": (
            "Connection:PullRequestReviewComment",
            lambda t, args, ctx: _connection(
                "PullRequestReviewComment", sorted(ctx.state.thread_comments(t), key=lambda c: c.id), args
            ),
        ),
    },
    "PullRequestReviewComment": {
        "id": (SCALAR, lambda c, args, ctx: node_id("PullRequestReviewComment", c.id)),
        "databaseId": (SCALAR, _attr("id")),
        "fullDatabaseId": (SCALAR, lambda c, args, ctx: str(c.id)),
        "body": (SCALAR, _attr("body")),
        "path": (SCALAR, _attr("path")),
        "line": (SCALAR, _attr("line")),
        "originalLine": (SCALAR, _attr("line")),
        "startLine": (SCALAR, _attr("start_line")),
        "diffHunk": (SCALAR, _attr("diff_hunk")),
        "outdated": (SCALAR, lambda c, args, ctx: c.commit_id != c.pr.head_sha),
        "createdAt": (SCALAR, lambda c, args, ctx: iso(c.created_at)),
        "updatedAt": (SCALAR, lambda c, args, ctx: iso(c.updated_at)),
        "url": (
            SCALAR,
            lambda c, args, ctx: f"{ctx.base_url}/{c.pr.repo.full_name}/pull/{c.pr.number}#discussion_r{c.id}",
        ),
        "author": ("Actor", _attr("user")),
        "replyTo": ("PullRequestReviewComment", lambda c, args, ctx: ctx.state.review_comments.get(c.in_reply_to_id)),
        "commit": ("Commit", lambda c, args, ctx: c.commit_id),
        "pullRequestReview": ("PullRequestReview", lambda c, args, ctx: ctx.state.reviews.get(c.review_id)),
    },
    "PullRequestReview": {
        "id": (SCALAR, lambda r, args, ctx: node_id("PullRequestReview", r.id)),
        "databaseId": (SCALAR, _attr("id")),
        "state": (SCALAR, _attr("state")),
        "author": ("Actor", _attr("user")),
    },
    "Commit": {"oid": (SCALAR, lambda sha, args, ctx: sha)},
    "PageInfo": {
        "hasNextPage": (SCALAR, lambda c, args, ctx: c.has_next),
        "hasPreviousPage": (SCALAR, lambda c, args, ctx: c.offset > 0),
        "startCursor": (SCALAR, lambda c, args, ctx: _cursor(c.offset) if c.items else None),
        "endCursor": (SCALAR, lambda c, args, ctx: _cursor(c.offset + len(c.items) - 1) if c.items else None),
    },
}


def _connection_fields(node_type: str) -> dict[str, tuple[str, Resolver]]:
    return {
        "totalCount": (SCALAR, lambda c, args, ctx: c.total),
        "nodes": (f"[{node_type}]", lambda c, args, ctx: c.items),
        "edges": (
            f"[Edge:{node_type}]",
            lambda c, args, ctx: [(c.offset + i, item) for i, item in enumerate(c.items)],
        ),
        "pageInfo": ("PageInfo", lambda c, args, ctx: c),
    }


def _fields_of(type_name: str) -> dict[str, tuple[str, Resolver]]:
    if type_name.startswith("Connection:"):
        return _connection_fields(type_name.split(":", 1)[1])
    if type_name.startswith("Edge:"):
        node_type = type_name.split(":", 1)[1]
        return {
            "cursor": (SCALAR, lambda edge, args, ctx: _cursor(edge[0])),
            "node": (node_type, lambda edge, args, ctx: edge[1]),
        }
    return SCHEMA[type_name]


def _public_name(type_name: str) -> str:
    kind, _, node = type_name.partition(":")
    return f"{node}{kind}" if node else type_name


# ----------------------------------------------------------------------------- execution


def _check_fields(type_name: str, selections: list[Field], path: list[str]) -> list[GraphQLError]:
    """Static validation: every selected field exists (GitHub rejects the whole query otherwise)."""
    errors = []
    fields = _fields_of(type_name)
    for selection in selections:
        if selection.inline_fragment:
            errors += _check_fields(type_name, selection.selections, path)
            continue
        if selection.name == "__typename":
            continue
        if selection.name not in fields:
            message = f"Field '{selection.name}' doesn't exist on type '{_public_name(type_name)}'"
            errors.append(GraphQLError(message, path=path + [selection.name]))
            continue
        field_type = fields[selection.name][0].strip("[]")
        if field_type == SCALAR and selection.selections:
            errors.append(GraphQLError(f"Selections can't be made on scalars (field '{selection.name}')"))
        elif field_type != SCALAR:
            if not selection.selections:
                message = f"Field must have selections (field '{selection.name}' returns {_public_name(field_type)})"
                errors.append(GraphQLError(message))
            errors += _check_fields(field_type, selection.selections, path + [selection.key])
    return errors


def _execute(type_name: str, value: Any, selections: list[Field], ctx: Context, variables: dict[str, Any],
             path: list[Any], errors: list[GraphQLError]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    fields = _fields_of(type_name)
    for selection in selections:
        if selection.inline_fragment:
            result.update(_execute(type_name, value, selection.selections, ctx, variables, path, errors))
            continue
        if selection.name == "__typename" and "__typename" not in fields:
            result[selection.key] = _public_name(type_name)
            continue
        field_type, resolver = fields[selection.name]
        field_path = path + [selection.key]
        try:
            resolved = resolver(value, _substitute(selection.arguments, variables), ctx)
            result[selection.key] = _complete(field_type, resolved, selection, ctx, variables, field_path, errors)
        except GraphQLError as error:
            error.path = error.path or field_path
            errors.append(error)
            result[selection.key] = None
    return result


def _complete(field_type: str, value: Any, selection: Field, ctx: Context, variables: dict[str, Any],
              path: list[Any], errors: list[GraphQLError]) -> Any:
    if value is None or field_type == SCALAR:
        return value
    if field_type.startswith("["):
        item_type = field_type[1:-1]
        return [
            _complete(item_type, item, selection, ctx, variables, path + [index], errors)
            for index, item in enumerate(value)
        ]
    return _execute(field_type, value, selection.selections, ctx, variables, path, errors)


def execute(
    state: EmulatorState, principal: InstallationPrincipal, base_url: str, body: dict[str, Any]
) -> dict[str, Any]:
    """Run a GraphQL request body ({query, variables}); returns GitHub's response JSON."""
    try:
        operation = parse(str(body.get("query") or ""))
    except GraphQLError as error:
        return {"errors": [error.as_json()]}
    root = "Mutation" if operation.kind == "mutation" else "Query"
    problems = _check_fields(root, operation.selections, [operation.kind])
    if problems:
        return {"errors": [p.as_json() for p in problems]}
    variables = {**operation.variable_defaults, **(body.get("variables") or {})}
    errors: list[GraphQLError] = []
    context = Context(state, principal, base_url)
    data = _execute(root, None, operation.selections, context, variables, [], errors)
    response: dict[str, Any] = {"data": data}
    if errors:
        response["errors"] = [e.as_json() for e in errors]
    return response
