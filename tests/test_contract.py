"""GitHub's contract data: fetched by the project, verified against pinned hashes, trimmed, and used."""
from __future__ import annotations

import io
import json
import tarfile

import jsonschema
import pytest
from openapi_schema_validator import OAS30Validator

from github_emulator import contract
from github_emulator.contract import (
    PACKAGES,
    TRIMMED_SPEC,
    WEBHOOK_SCHEMA,
    ContractError,
    Package,
    contract_dir,
    integrity_of,
    is_current,
    require,
    trim_openapi,
    verified_tarball,
)

ROOT = contract._REPO_ROOT


def _tarball(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_the_cache_in_use_is_built_from_the_pinned_packages():
    assert is_current(contract_dir())


def test_a_tarball_that_is_not_the_pinned_one_is_refused(tmp_path):
    genuine = _tarball({"schema.json": b"{}"})
    package = Package("@octokit/webhooks-schemas", "7.6.1", integrity_of(genuine))
    (tmp_path / package.tarball_name).write_bytes(genuine)
    assert verified_tarball(package, tmp_path) == genuine

    (tmp_path / package.tarball_name).write_bytes(_tarball({"schema.json": b'{"tampered": true}'}))
    with pytest.raises(ContractError, match="integrity mismatch"):
        verified_tarball(package, tmp_path)


def test_trimming_keeps_exactly_what_the_kept_operations_reach():
    full = {
        "openapi": "3.0.3", "info": {"title": "t", "version": "1"},
        "tags": [{"name": "pulls"}, {"name": "unused"}],
        "paths": {
            "/a": {"get": {"operationId": "a/get", "tags": ["pulls"], "responses": {
                "200": {"$ref": "#/components/responses/ok"}}}},
            "/b": {"get": {"operationId": "b/get", "responses": {
                "200": {"$ref": "#/components/responses/other"}}}},
        },
        "x-webhooks": {"ping": {"post": {"requestBody": {"$ref": "#/components/schemas/hook"}}}},
        "components": {
            "responses": {"ok": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/x"}}}},
                          "other": {"description": "not reached"}},
            "schemas": {"x": {"properties": {"y": {"$ref": "#/components/schemas/y"}}}, "y": {"type": "string"},
                        "hook": {"type": "object"}, "orphan": {"type": "integer"}},
        },
    }
    trimmed = trim_openapi(full, operations=["GET /a"], webhooks=["ping"])
    assert list(trimmed["paths"]) == ["/a"]
    assert trimmed["components"] == {"responses": {"ok": full["components"]["responses"]["ok"]},
                                     "schemas": {"hook": {"type": "object"}, "x": full["components"]["schemas"]["x"],
                                                 "y": {"type": "string"}}}
    assert trimmed["tags"] == [{"name": "pulls"}]
    with pytest.raises(ContractError, match="GET /missing"):
        trim_openapi(full, operations=["GET /missing"], webhooks=[])


def test_every_reference_in_the_trimmed_description_resolves():
    spec = json.loads(require(TRIMMED_SPEC).read_text())
    refs = set(contract._refs(spec))
    assert refs, "the description uses $ref"
    for ref in refs:
        contract._pointer_get(spec, ref)  # raises KeyError when trimming dropped a target
    assert {f"{m.upper()} {p}" for p, item in spec["paths"].items() for m in item if m != "parameters"} == set(
        contract.OPERATIONS)


@pytest.mark.parametrize("name", sorted(contract.EXAMPLES) + [
    "derived/pull_request.edited", "derived/issue_comment.created.on_pull_request",
    "derived/issue_comment.edited.on_pull_request"])
def test_payloads_validate_against_the_webhook_schemas(name):
    payload = json.loads(require(f"webhooks/{name}.json").read_text())
    definitions = json.loads(require(WEBHOOK_SCHEMA).read_text())["definitions"]
    event = name.removeprefix("derived/").split(".")[0]
    action = payload.get("action", "event")
    jsonschema.Draft7Validator({"$ref": f"#/definitions/{event}${action}", "definitions": definitions}).validate(payload)
    if name.startswith("derived/"):  # our edits must also satisfy GitHub's own (stricter) x-webhooks schema
        spec = json.loads(require(TRIMMED_SPEC).read_text())
        hook = f"{event.replace('_', '-')}-{action.replace('_', '-')}"
        schema = spec["x-webhooks"][hook]["post"]["requestBody"]["content"]["application/json"]["schema"]
        OAS30Validator(dict(schema, components=spec["components"])).validate(payload)


def test_a_comment_on_a_pull_request_is_derived_from_the_real_issue_comment():
    real = json.loads(require("webhooks/issue_comment.created.json").read_text())
    derived = json.loads(require("webhooks/derived/issue_comment.created.on_pull_request.json").read_text())
    assert "pull_request" not in real["issue"]
    assert derived["issue"]["pull_request"]["html_url"].endswith(f"/pull/{real['issue']['number']}")
    assert derived["comment"]["body"] == real["comment"]["body"]


def test_pins_name_three_distinct_packages():
    assert len({p.name for p in PACKAGES}) == 3
    assert all(p.integrity.startswith("sha512-") for p in PACKAGES)


def test_nothing_in_the_project_reads_a_shared_directory_beside_the_checkout():
    offenders = []
    for path in ROOT.rglob("*"):
        if not path.is_file() or path.suffix not in {".py", ".sh", ".toml", ".yml", ".yaml", ".cfg", ""}:
            continue
        if set(path.relative_to(ROOT).parts[:-1]) & {".venv", ".git", ".cache", "node_modules", ".torchreview-data"}:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        # the patterns are built, not spelled, so this file does not match itself
        sibling = ".." + "/shared"
        if sibling in text.replace(" ", "") or "parent / " + '"shared"' in text:
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, offenders
