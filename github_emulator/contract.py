"""GitHub's contract data, fetched by the project itself: `python -m github_emulator.contract`.

GitHub publishes its REST OpenAPI description and real webhook deliveries as MIT-licensed npm packages.
This module fetches pinned versions with the ordinary npm client (`npm pack`), checks each tarball against
its pinned integrity hash, and builds a cache outside git (default ``<repo>/.cache/github-contract``,
or ``$TORCHREVIEW_GITHUB_CONTRACT_DIR``) holding only what the emulator, the tests, the demo and the
benches read:

- ``openapi/api.github.com.trimmed.json``: the operations the App calls and the webhook schemas it
  receives, with every component they reach through ``$ref`` (openapi-core loads the 13 MB original in
  ~50 s, the subset in ~3 s); kept objects are unchanged;
- ``openapi/operations.json``: an index of those operations;
- ``webhook-schemas/schema.json``: the combined JSON Schema of every webhook payload;
- ``webhooks/EVENT.ACTION.json``: one real example delivery per event/action, and
  ``webhooks/derived/*.json``: real examples with small, documented edits for the cases the package has
  no example for (a comment on a pull request, ``pull_request.edited``).
"""
from __future__ import annotations

import argparse
import base64
import copy
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

CONTRACT_DIR_ENV = "TORCHREVIEW_GITHUB_CONTRACT_DIR"
FETCH_COMMAND = "python -m github_emulator.contract"
_REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = _REPO_ROOT / ".cache" / "github-contract"

TRIMMED_SPEC = "openapi/api.github.com.trimmed.json"
OPERATIONS_INDEX = "openapi/operations.json"
WEBHOOK_SCHEMA = "webhook-schemas/schema.json"
STAMP = "contract.json"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    integrity: str  # npm's Subresource-Integrity string for the tarball

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def tarball_name(self) -> str:  # what `npm pack` writes
        return f"{self.name.lstrip('@').replace('/', '-')}-{self.version}.tgz"


OPENAPI = Package("@octokit/openapi", "23.0.2",
                  "sha512-pV8M7L9GY23AybNvTmo2nyjmpmnt6+2sRE/tqr0ZLQcPS4lnw7u5eZGNmwRNkBC3D7gZXbFx5AHzLUVRBXGDhg==")
WEBHOOK_EXAMPLES = Package("@octokit/webhooks-examples", "7.6.1",
                           "sha512-De6U3XB6O3DtCa7bKgCMzTHdeopqqZ6SNivMYJnK65ierKL1AnNIA0tkRYCRS7lwGT792d+Ps1WbfHlso6MynQ==")
WEBHOOK_SCHEMAS = Package("@octokit/webhooks-schemas", "7.6.1",
                          "sha512-qW0Bwtb76r4m2WzVhKDyfEeEnt1GEQoRjkCqmq2ZeB0nNVDJ+Z2LBDS9FDPyduuMXf/ZTWiCJp9PFFHgRfBe3A==")
PACKAGES = (OPENAPI, WEBHOOK_EXAMPLES, WEBHOOK_SCHEMAS)

# The REST operations the App calls (bot/github_client.py and PyGithub underneath) — the emulator serves these.
OPERATIONS = (
    "GET /app",
    "POST /app/installations/{installation_id}/access_tokens",
    "GET /repos/{owner}/{repo}/installation",
    "GET /repos/{owner}/{repo}/pulls",
    "GET /repos/{owner}/{repo}/pulls/{pull_number}",
    "GET /repos/{owner}/{repo}/pulls/{pull_number}/files",
    "GET /repos/{owner}/{repo}/pulls/{pull_number}/reviews",
    "POST /repos/{owner}/{repo}/pulls/{pull_number}/reviews",
    "GET /repos/{owner}/{repo}/pulls/{pull_number}/comments",
    "PATCH /repos/{owner}/{repo}/pulls/comments/{comment_id}",
    "DELETE /repos/{owner}/{repo}/pulls/comments/{comment_id}",
    "POST /repos/{owner}/{repo}/pulls/{pull_number}/comments",
    "POST /repos/{owner}/{repo}/check-runs",
    "PATCH /repos/{owner}/{repo}/check-runs/{check_run_id}",
    "GET /repos/{owner}/{repo}/commits/{ref}/check-runs",
    "GET /repos/{owner}/{repo}/contents/{path}",
    "GET /repos/{owner}/{repo}/git/trees/{tree_sha}",
    "GET /repos/{owner}/{repo}/git/blobs/{file_sha}",
    "GET /repos/{owner}/{repo}/tarball/{ref}",
    "GET /repos/{owner}/{repo}/zipball/{ref}",
    "GET /repos/{owner}/{repo}/compare/{basehead}",
    "POST /repos/{owner}/{repo}/issues/{issue_number}/comments",
    "GET /repos/{owner}/{repo}/issues/{issue_number}/comments",
    "PATCH /repos/{owner}/{repo}/issues/comments/{comment_id}",
    "POST /repos/{owner}/{repo}/issues/comments/{comment_id}/reactions",
    "GET /repos/{owner}/{repo}/pulls/comments/{comment_id}/reactions",
    "GET /repos/{owner}/{repo}/collaborators/{username}/permission",
    "GET /repos/{owner}/{repo}",
    "GET /rate_limit",
    # the delivery sweep (bot/recover.py): the App's webhook deliveries, and redelivering the failed ones
    "GET /app/hook/deliveries",
    "GET /app/hook/deliveries/{delivery_id}",
    "POST /app/hook/deliveries/{delivery_id}/attempts",
)
# GitHub's own payload schemas (``x-webhooks``) for the deliveries the App handles.
WEBHOOKS = (
    "pull-request-opened", "pull-request-synchronize", "pull-request-reopened", "pull-request-ready-for-review",
    "pull-request-closed", "pull-request-edited", "pull-request-labeled", "issue-comment-created",
    "issue-comment-edited", "check-run-rerequested", "check-run-requested-action", "check-run-created",
    "check-suite-requested", "check-suite-rerequested", "installation-created", "installation-deleted",
    "installation-repositories-added", "ping", "push",
)
# One example per event/action, by its index in the package's api.github.com/index.json. Picked once:
# an App delivery (with `installation`) where one exists, then the fewest schema errors.
EXAMPLES = {
    "pull_request.opened": ("pull_request", 12),
    "pull_request.synchronize": ("pull_request", 22),
    "pull_request.reopened": ("pull_request", 18),
    "pull_request.ready_for_review": ("pull_request", 16),
    "pull_request.closed": ("pull_request", 3),
    "pull_request.labeled": ("pull_request", 8),
    "issue_comment.created": ("issue_comment", 3),
    "issue_comment.edited": ("issue_comment", 7),
    "check_run.rerequested": ("check_run", 7),
    "check_run.requested_action": ("check_run", 6),
    "check_run.created": ("check_run", 4),
    "check_suite.requested": ("check_suite", 4),
    "check_suite.rerequested": ("check_suite", 7),
    "installation.created": ("installation", 1),
    "installation.deleted": ("installation", 3),
    "installation_repositories.added": ("installation_repositories", 1),
    "ping": ("ping", 2),
    "push": ("push", 4),  # a branch's first push, as an App receives it
}


class ContractError(RuntimeError):
    """The contract data is missing, or a fetched package is not the pinned one."""


def contract_dir() -> Path:
    """Where the built contract lives: $TORCHREVIEW_GITHUB_CONTRACT_DIR or <repo>/.cache/github-contract."""
    configured = os.environ.get(CONTRACT_DIR_ENV)
    return Path(configured) if configured else DEFAULT_DIR


def require(relative: str) -> Path:
    """A file of the built contract, or an error that names the one command that fetches it."""
    directory = contract_dir()
    path = directory / relative
    if not path.is_file():
        raise ContractError(
            f"GitHub contract data not found: {path} is missing. Fetch it once with `{FETCH_COMMAND}` "
            f"(needs npm; scripts/test.sh and scripts/demo.sh run it), or set {CONTRACT_DIR_ENV} to a "
            f"directory built by it."
        )
    return path


# --- fetching ----------------------------------------------------------------------------------------------


def integrity_of(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def npm_pack(packages: Iterable[Package], destination: Path) -> None:
    """Download the tarballs by name with the ordinary npm client (no install, no scripts run)."""
    npm = shutil.which("npm")
    if npm is None:
        raise ContractError("npm is not installed (Debian: apt-get install npm); it fetches GitHub's contract data")
    specs = [p.spec for p in packages]
    result = subprocess.run([npm, "pack", "--ignore-scripts", "--pack-destination", str(destination), *specs],
                            cwd=destination, capture_output=True, text=True)
    if result.returncode != 0:
        raise ContractError(f"`npm pack {' '.join(specs)}` failed:\n{result.stderr.strip()[-2000:]}")


def verified_tarball(package: Package, directory: Path) -> bytes:
    path = directory / package.tarball_name
    if not path.is_file():
        raise ContractError(f"{package.spec}: {path.name} not found in {directory}")
    data = path.read_bytes()
    actual = integrity_of(data)
    if actual != package.integrity:
        raise ContractError(f"{package.spec}: integrity mismatch (pinned {package.integrity}, got {actual}); "
                            f"refusing to use {path}")
    return data


def _member_json(tarball: bytes, member: str) -> Any:
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        try:
            handle = archive.extractfile(f"package/{member}")
        except KeyError:
            handle = None
        if handle is None:
            raise ContractError(f"package/{member} is not in the tarball")
        return json.load(handle)


# --- building -----------------------------------------------------------------------------------------------


def _refs(node: Any) -> Iterable[str]:
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str):
                yield ref
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _pointer_get(document: Any, pointer: str) -> Any:
    node = document
    for part in pointer.lstrip("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def trim_openapi(full: dict[str, Any], operations: Iterable[str] = OPERATIONS,
                 webhooks: Iterable[str] = WEBHOOKS) -> dict[str, Any]:
    """A valid subset: the listed operations and x-webhooks plus every component they reach."""
    paths: dict[str, dict[str, Any]] = {}
    for operation in operations:
        method, path = operation.split(" ", 1)
        try:
            paths.setdefault(path, {})[method.lower()] = full["paths"][path][method.lower()]
        except KeyError:
            raise ContractError(f"{operation} is not in the OpenAPI description") from None
    for path, item in paths.items():  # path-level parameters apply to every kept method
        if "parameters" in full["paths"][path]:
            item["parameters"] = full["paths"][path]["parameters"]
    kept_webhooks = {}
    for name in webhooks:
        if name not in full.get("x-webhooks", {}):
            raise ContractError(f"webhook {name} is not in the OpenAPI description")
        kept_webhooks[name] = full["x-webhooks"][name]

    components: dict[str, dict[str, Any]] = {}
    pending = list(_refs([paths, kept_webhooks]))
    seen: set[str] = set()
    while pending:
        ref = pending.pop()
        if ref in seen or not ref.startswith("#/components/"):
            continue
        seen.add(ref)
        _, _, kind, name = ref.split("/", 3)
        target = full["components"][kind][name]
        components.setdefault(kind, {})[name] = target
        pending.extend(_refs(target))

    trimmed = {key: full[key] for key in ("openapi", "info", "tags", "servers", "externalDocs") if key in full}
    trimmed["info"] = dict(full["info"], **{"x-trimmed": {
        "note": "Subset built by github_emulator.contract: only these operations and x-webhooks, plus every "
                "component they reach through $ref. Kept objects are unchanged.",
        "source_package": OPENAPI.name, "source_version": OPENAPI.version,
        "source_file": "generated/api.github.com.json",
        "operations": list(operations), "webhooks": list(webhooks)}})
    used_tags = {tag for item in paths.values() for spec in item.values() if isinstance(spec, dict)
                 for tag in spec.get("tags", [])}
    trimmed["tags"] = [tag for tag in full.get("tags", []) if tag.get("name") in used_tags]
    trimmed["paths"] = paths
    trimmed["x-webhooks"] = kept_webhooks
    trimmed["components"] = {kind: dict(sorted(items.items())) for kind, items in sorted(components.items())}
    return trimmed


def operations_index(trimmed: dict[str, Any]) -> dict[str, Any]:
    entries = []
    for operation in trimmed["info"]["x-trimmed"]["operations"]:
        method, path = operation.split(" ", 1)
        spec = trimmed["paths"][path][method.lower()]
        entries.append({"method": method, "path": path, "operationId": spec["operationId"],
                        "summary": spec.get("summary", ""), "docs": spec.get("externalDocs", {}).get("url", "")})
    return {"source": TRIMMED_SPEC, "openapi_info_version": OPENAPI.version, "operations": entries}


def pick_examples(index: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by_event = {entry["name"]: entry["examples"] for entry in index}
    picked = {}
    for name, (event, position) in EXAMPLES.items():
        example = by_event[event][position]
        expected_action = name.split(".", 1)[1] if "." in name else None
        if expected_action is not None and example.get("action") != expected_action:
            raise ContractError(f"{event} example {position} is {example.get('action')!r}, not {expected_action!r}")
        picked[name] = example
    return picked


def _on_pull_request(comment_payload: dict[str, Any]) -> dict[str, Any]:
    """An issue_comment delivery as GitHub sends it for a pull request: `issue.pull_request` and /pull/ URLs."""
    data = copy.deepcopy(comment_payload)
    issue = data["issue"]
    issue_html = issue["html_url"]
    pull_html = issue_html.replace("/issues/", "/pull/")
    api_repo = issue["repository_url"]
    issue["html_url"] = pull_html
    issue["pull_request"] = {"url": f"{api_repo}/pulls/{issue['number']}", "html_url": pull_html,
                             "diff_url": f"{pull_html}.diff", "patch_url": f"{pull_html}.patch", "merged_at": None}
    data["comment"]["html_url"] = data["comment"]["html_url"].replace(issue_html, pull_html)
    return data


def derived_examples(picked: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Stand-ins for the deliveries the package has no example of (small, documented edits of real ones)."""
    edited = copy.deepcopy(picked["pull_request.opened"])
    edited["action"] = "edited"
    edited["changes"] = {"title": {"from": "Update the README"}}
    return {
        "pull_request.edited": edited,
        "issue_comment.created.on_pull_request": _on_pull_request(picked["issue_comment.created"]),
        "issue_comment.edited.on_pull_request": _on_pull_request(picked["issue_comment.edited"]),
    }


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def build(tarballs: dict[Package, bytes], destination: Path) -> None:
    """Build the cache from verified tarballs, atomically (a half-built cache is never seen)."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".contract-", dir=destination.parent))
    try:
        trimmed = trim_openapi(_member_json(tarballs[OPENAPI], "generated/api.github.com.json"))
        _write_json(staging / TRIMMED_SPEC, trimmed)
        _write_json(staging / OPERATIONS_INDEX, operations_index(trimmed))
        _write_json(staging / WEBHOOK_SCHEMA, _member_json(tarballs[WEBHOOK_SCHEMAS], "schema.json"))
        picked = pick_examples(_member_json(tarballs[WEBHOOK_EXAMPLES], "api.github.com/index.json"))
        for name, data in picked.items():
            _write_json(staging / "webhooks" / f"{name}.json", data)
        for name, data in derived_examples(picked).items():
            _write_json(staging / "webhooks" / "derived" / f"{name}.json", data)
        _write_json(staging / STAMP, _stamp())
        if destination.exists():
            shutil.rmtree(destination)
        staging.rename(destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _stamp() -> dict[str, Any]:
    """What a built cache was built from: the pinned packages and what was picked from them."""
    picked = json.dumps([OPERATIONS, WEBHOOKS, sorted(EXAMPLES.items())], sort_keys=True)
    return {"packages": {p.name: {"version": p.version, "integrity": p.integrity} for p in PACKAGES},
            "selection": hashlib.sha256(picked.encode()).hexdigest()}


def is_current(directory: Path) -> bool:
    try:
        stamp = json.loads((directory / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return stamp == _stamp()  # a new operation picked rebuilds the cache as surely as a new package


def fetch(destination: Path | None = None, tarball_dir: Path | None = None, force: bool = False) -> Path:
    """Fetch (or take from ``tarball_dir``), verify and build the contract; a no-op when already current."""
    destination = destination or contract_dir()
    if not force and is_current(destination):
        return destination
    with tempfile.TemporaryDirectory(prefix="github-contract-") as scratch:
        source = tarball_dir or Path(scratch)
        if tarball_dir is None:
            npm_pack(PACKAGES, source)
        build({package: verified_tarball(package, source) for package in PACKAGES}, destination)
    return destination


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=FETCH_COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, help=f"cache directory (default: ${CONTRACT_DIR_ENV} or {DEFAULT_DIR})")
    parser.add_argument("--from-tarballs", type=Path, metavar="DIR",
                        help="use tarballs already downloaded with `npm pack` instead of fetching them")
    parser.add_argument("--force", action="store_true", help="rebuild even when the cache is current")
    args = parser.parse_args(argv)
    try:
        where = fetch(args.dest, args.from_tarballs, args.force)
    except ContractError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"GitHub contract data ready in {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
