"""The ``/review`` command layer: parse a PR comment, decide who may run it, answer on the PR.

Pure parsing and reply text, plus small functions over PyGithub objects. Every GitHub call here is
one of the operations the emulator serves (and the App's permissions cover):

* ``may_run``      GET  /repos/{o}/{r}/collaborators/{username}/permission  (always: never the association)
* ``acknowledge``  POST /repos/{o}/{r}/issues/comments/{id}/reactions        (a repeat gets 200: idempotent)
* ``react``        the same, with another reaction (👎 to an unauthorized command)
* ``reply``        POST /repos/{o}/{r}/issues/{n}/comments                    (+ GET .../comments with ``dedupe_key``)

The objects are built lazily (``completed=False`` / a ``lazy=True`` client), so no GET of the
issue or the comment is ever made: those endpoints are not among the App's operations.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional
from urllib.parse import quote

import github
from github import GithubException

from analyzers.markdown import code_block, code_span
from bot.github_client import issue_ref

COMMAND_WORD = "/review"
SUBCOMMANDS = ("smoke", "config", "help")
REPLY_MARKER = "<!-- torchreview:reply -->"
# Repository roles, weakest first. ``role_name`` tells maintain from write (the legacy ``permission``
# field reports maintain as write and triage as read); a custom role falls back to ``permission``.
ROLES = ("none", "read", "triage", "write", "maintain", "admin")
ALLOWED_PERMISSIONS = frozenset({"admin", "maintain", "write"})
MAINTAINER_PERMISSIONS = frozenset({"admin", "maintain"})

_COMMAND_LINE = re.compile(r"/review(?:[ \t]+(?P<args>.*))?", re.IGNORECASE)
_FENCE = re.compile(r"(?P<fence>`{3,}|~{3,})")
_REPLY_KEY = re.compile(r"<!-- torchreview:reply-key (?P<key>[^ ]+) -->")


@dataclass(frozen=True)
class Command:
    """A parsed ``/review`` command.

    name: "review" (bare ``/review``), "smoke", "config", "help", or "unknown" (``args[0]`` is the
    word that was not understood). args: the further words of the command line. raw: the command
    line as written (stripped).
    """

    name: str
    args: tuple[str, ...]
    raw: str


def parse_command(body: Optional[str]) -> Optional[Command]:
    """The command in a comment, or None when it is not one.

    The first line that is not blank, not quoted (``> ...``) and not code (fenced or indented)
    must be ``/review`` or ``/review <word> ...``; the command word is case-insensitive and must
    end there (``/reviewer``, ``/review.`` and ``please /review`` are not commands). Lines after
    the command line are free text.
    """
    line = _first_prose_line(body or "")
    if line is None:
        return None
    match = _COMMAND_LINE.fullmatch(line)
    if match is None:
        return None
    words = tuple((match.group("args") or "").split())
    if not words:
        return Command("review", (), line)
    sub = words[0].lower()
    if sub in SUBCOMMANDS:
        return Command(sub, words[1:], line)
    return Command("unknown", words, line)


def _first_prose_line(body: str) -> Optional[str]:
    fence: Optional[str] = None  # the open fence's marker, while inside one
    in_quote = False  # a quote goes on until a blank line ("lazy continuation" lines belong to it)
    for raw_line in body.splitlines():
        expanded = raw_line.replace("\t", "    ")
        indent = len(expanded) - len(expanded.lstrip(" "))
        line = expanded.strip()
        if fence is not None:  # inside fenced code: only a closing fence ends it
            m = _FENCE.match(line)
            if indent < 4 and m and m.group("fence")[0] == fence[0] and len(m.group("fence")) >= len(fence) \
                    and line == m.group("fence"):
                fence = None
            continue
        if not line:
            in_quote = False
            continue
        m = _FENCE.match(line)
        if m and indent < 4:  # a fence opens code (and, like a blank line, ends a quote)
            fence, in_quote = m.group("fence"), False
            continue
        if in_quote or line.startswith(">"):  # quoted text, e.g. a reply quoting someone's "/review"
            in_quote = True
            continue
        if indent >= 4:  # indented code block
            continue
        return raw_line.strip()  # as written (tabs kept)
    return None


# ---------------------------------------------------------------------------------- replies

USAGE = """\
**torchreview commands** — comment on a pull request with the command as the first line:

| Command | What it does |
|---|---|
| `/review` | Review the current head of this pull request again: a fresh review and check run. |
| `/review smoke` | Smoke-train the models this pull request changes, at the head you saw when you commented, in the sandboxed GPU runner. |
| `/review smoke <sha>` | The same at exactly that commit (the head or an earlier commit of this pull request). |
| `/review config` | Show the configuration torchreview uses for this pull request and where it was read from. |
| `/review help` | Show this help. |

Who may run them: users with write access to this repository (the write, maintain or admin role, \
as GitHub reports it). Commands from anyone else run nothing; the bot reacts with 👎."""


def help_reply() -> str:
    return USAGE


def unknown_reply(command: Command) -> str:
    """Answer to ``/review <something we do not know>``: name it (mention-safe), then the usage."""
    word = command.args[0] if command.args else command.raw
    return f"I don't know the command {_code('/review ' + word, 48)}.\n\n{USAGE}"


_SHA = re.compile(r"[0-9a-f]{7,40}")


def smoke_sha_argument(command: Command) -> tuple[Optional[str], Optional[str]]:
    """(sha, None) for ``/review smoke <sha>``, (None, None) for ``/review smoke``, (None, problem)."""
    if not command.args:
        return None, None
    word = command.args[0].lower()
    if len(command.args) > 1 or not _SHA.fullmatch(word):
        return None, (f"`/review smoke` takes at most one argument, a commit SHA of this pull request (7 to 40 hex "
                      f"digits); I could not read {_code(' '.join(command.args), 80)}.")
    return word, None


def smoke_head_moved_reply(pinned: str, current: str) -> str:
    """``/review smoke`` whose head changed after the comment: nothing runs."""
    return (f"The head of this pull request changed after your comment (you saw `{pinned[:12]}`, it is now "
            f"`{current[:12]}`), so nothing was run: PR code runs only at a commit someone with write access has "
            f"looked at. To smoke-train the new head, comment `/review smoke {current}`.")


def smoke_unknown_head_reply(current: str) -> str:
    """``/review smoke`` when it is not known which head the comment saw (e.g. a push at the same time)."""
    return (f"I cannot tell which commit was the head when you commented (a push may have raced your comment), "
            f"so nothing was run. To smoke-train the current head, comment `/review smoke {current}`.")


def smoke_not_in_pr_reply(sha: str) -> str:
    return (f"{_code(sha, 40)} is not a commit of this pull request, so nothing was run. `/review smoke <sha>` "
            "takes the head or an earlier commit of this pull request.")


def smoke_prefix_unknown_head_reply(prefix: str) -> str:
    """``/review smoke <prefix>`` when it is not known which commits the PR had when the comment was written."""
    return (f"I cannot tell which commits this pull request had when you commented (a push may have raced your "
            f"comment), so {_code(prefix, 40)} was not resolved and nothing was run. Comment `/review smoke` with the "
            "commit's full 40-hex SHA.")


def smoke_ambiguous_reply(prefix: str, candidates: list[str]) -> str:
    """``/review smoke <prefix>`` that names more than one commit of the PR: nothing runs."""
    listed = ", ".join(f"`{sha}`" for sha in candidates[:5])
    return (f"{_code(prefix, 40)} names {len(candidates)} commits of this pull request ({listed}), so nothing was "
            "run. Comment `/review smoke` with the commit's full 40-hex SHA.")


def config_reply(config: Any, base_ref: str, base_sha: str) -> str:
    """The effective configuration as a code block, and where it came from.

    ``config`` needs ``to_dict()`` and ``source`` ("defaults" when no file configured it). The block
    is YAML when the source is a ``.yml``/``.yaml`` file, TOML otherwise (the keys as they would
    be written in that file).
    """
    source = str(getattr(config, "source", "") or "defaults")
    data = config.to_dict()
    where = f"the base branch {_code(base_ref, 100)} at {_code(base_sha[:7], 7)}"
    if source == "defaults":
        origin = f"No torchreview configuration was found on {where}: these are the defaults."
    else:
        origin = f"Read from {_code(source, 200)} on {where}."
    toml_source = bool(re.search(r"\.toml\b", source, re.IGNORECASE))
    block = _to_toml(data) if toml_source else _to_yaml(data)
    lang = "toml" if toml_source else "yaml"
    return (f"**torchreview configuration for this pull request**\n\n{origin}\n\n{code_block(block, lang)}\n\n"
            "The configuration always comes from the base branch, so changes a pull request makes to it "
            "take effect once they are merged.")


def is_own_reply(body: Optional[str]) -> bool:
    """Whether a comment body is one of our replies (ends with the hidden marker)."""
    return REPLY_MARKER in (body or "")


# ----------------------------------------------------------------------------- GitHub calls


def permission_level(repo, login: str) -> str:
    """``login``'s role on the repository (one of ROLES), from GitHub: one GET of the collaborator
    permission. 404 (unknown user) is "none"; other errors propagate, so a transient failure retries
    the job instead of refusing the user."""
    if not login:
        return "none"
    try:
        _headers, data = repo.requester.requestJsonAndCheck(
            "GET", f"{repo.url}/collaborators/{quote(login, safe='')}/permission")
    except GithubException as exc:
        if exc.status == 404:
            return "none"
        raise
    role = str((data or {}).get("role_name") or "").lower()
    if role in ROLES:
        return role
    permission = str((data or {}).get("permission") or "none").lower()
    return permission if permission in ROLES else "none"


def may_run(repo, login: str, author_association: Optional[str] = None, *,
            allowed: frozenset = ALLOWED_PERMISSIONS) -> bool:
    """Whether ``login`` has one of the ``allowed`` roles (default: write, maintain or admin).

    Always asks GitHub: the webhook's author_association (OWNER/MEMBER/COLLABORATOR) says nothing
    about the permission level (an organization member or a collaborator may have read access
    only), so it is ignored here.
    """
    return permission_level(repo, login) in allowed


def react(repo, comment_id: int, content: str):
    """Add a reaction to a comment without fetching it; a repeat gets GitHub's 200 (idempotent)."""
    comment = github.IssueComment.IssueComment(repo.requester, url=f"{repo.url}/issues/comments/{int(comment_id)}",
                                               completed=False)  # no GET of the comment
    return comment.create_reaction(content)


def acknowledge(repo, comment_id: int):
    """Add the 👀 reaction to the command comment; returns PyGithub's Reaction.

    Repeating it is harmless: GitHub answers an existing reaction with 200 and the same reaction.
    """
    return react(repo, comment_id, "eyes")


def reply(pr_or_issue_number: int, repo, body: str, *, dedupe_key: Optional[str] = None):
    """Post ``body`` (with the hidden reply marker at the end) on the PR's conversation.

    With ``dedupe_key`` (e.g. the command comment's id), the reply also carries that key and is
    not posted again when a reply with it already exists — a retried job answers once. That costs
    one listing of the PR's comments. Returns the new (or existing) IssueComment.
    """
    issue = _issue(repo, int(pr_or_issue_number))
    text = body.rstrip()
    if dedupe_key is not None:
        key = re.sub(r"[^A-Za-z0-9._:-]", "_", str(dedupe_key))
        key_marker = f"<!-- torchreview:reply-key {key} -->"
        for existing in issue.get_comments():
            if key_marker in (existing.body or ""):
                return existing
        text = f"{text}\n\n{key_marker}"
    if not text.endswith(REPLY_MARKER):
        text = f"{text}\n\n{REPLY_MARKER}"
    return issue.create_comment(text)


def _issue(repo, number: int):
    """The issue of a PR without fetching it (GET /issues/{n} is not one of the App's operations)."""
    return issue_ref(repo, number)


# ---------------------------------------------------------------------------------- helpers


def _code(text: str, limit: int) -> str:
    """User-controlled text (a login, a word, a branch) as inline code of bounded length."""
    clean = " ".join(str(text).split())
    return code_span(clean if len(clean) <= limit else clean[: limit - 1] + "…")


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_key(key: Any) -> str:
    key = str(key)
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _scalar(value: Any) -> str:
    """A scalar or a list of them, in the syntax TOML and (flow-style) YAML share."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return "[" + ", ".join(_scalar(v) for v in _ordered(value)) + "]"
    if isinstance(value, dict):  # a table inside a list (rare): an inline table
        return "{ " + ", ".join(f"{_toml_key(k)} = {_scalar(v)}" for k, v in value.items() if v is not None) + " }"
    return json.dumps(str(getattr(value, "value", value)), ensure_ascii=False)


def _to_toml(data: dict[str, Any], prefix: str = "") -> str:
    """Scalars first, then one ``[table]`` per nested mapping (recursively)."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, Any]]] = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            tables.append((f"{prefix}{_toml_key(key)}", value))
        elif value is None:
            lines.append(f"# {_toml_key(key)}: not set")
        else:
            lines.append(f"{_toml_key(key)} = {'{}' if value == {} else _scalar(value)}")
    for name, table in tables:
        if lines:
            lines.append("")
        lines.append(f"[{name}]")
        lines.append(_to_toml(table, f"{name}."))
    return "\n".join(line for line in lines if line is not None).strip("\n")


_YAML_RESERVED = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}  # YAML 1.1 bools/null


def _yaml_key(key: Any) -> str:
    key = str(key)
    plain = _BARE_KEY.fullmatch(key) and not key[0].isdigit() and key[0] != "-" and key.lower() not in _YAML_RESERVED
    return key if plain else json.dumps(key)


def _to_yaml(data: dict[str, Any], indent: str = "") -> str:
    """Block mappings; scalars and lists in flow style (JSON-compatible: every string quoted)."""
    lines = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            lines.append(f"{indent}{_yaml_key(key)}:")
            lines.append(_to_yaml(value, indent + "  "))
        elif value is None:
            lines.append(f"{indent}{_yaml_key(key)}: null")
        else:
            lines.append(f"{indent}{_yaml_key(key)}: {'{}' if value == {} else _scalar(value)}")
    return "\n".join(lines)


def _ordered(values: Iterable[Any]) -> list[Any]:
    return sorted(values, key=str) if isinstance(values, (set, frozenset)) else list(values)
