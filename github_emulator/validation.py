"""Check requests (and optionally responses) against GitHub's OpenAPI description."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from openapi_core.templating.paths.exceptions import PathError
from openapi_core.testing import MockRequest, MockResponse
from openapi_core.validation.request.exceptions import (
    MissingRequestBodyError,
    ParameterValidationError,
    RequestBodyValidationError,
)

from .spec import openapi

# openapi-core matches the request URL against the description's server.
SPEC_SERVER = "https://api.github.com"


@dataclass
class RequestProblem:
    """Why a request does not fit the description: status 404 (bad path) or 422."""

    status: int
    errors: list[dict[str, Any]]


def spec_request(
    method: str,
    path: str,
    query: Mapping[str, str],
    body: bytes,
    content_type: str | None,
    headers: Mapping[str, str] | None = None,
) -> MockRequest:
    """`path` must already have `/` inside path parameters percent-encoded."""
    return MockRequest(
        SPEC_SERVER,
        method,
        path,
        args=dict(query),
        headers=dict(headers or {}),
        data=body or None,
        content_type=content_type or "application/json",
    )


def check_request(request: MockRequest) -> RequestProblem | None:
    errors: list[dict[str, Any]] = []
    for error in openapi().iter_request_errors(request):
        if isinstance(error, PathError):
            return RequestProblem(404, [{"code": "not_found", "message": str(error)}])
        if isinstance(error, ParameterValidationError) and error.location == "path":
            return RequestProblem(404, [{"code": "invalid", "field": error.name, "message": str(error)}])
        errors.extend(_describe(error))
    return RequestProblem(422, errors) if errors else None


def check_response(request: MockRequest, status: int, body: bytes, content_type: str) -> list[str]:
    """Schema violations of a response (empty when it fits the description)."""
    response = MockResponse(body, status_code=status, content_type=content_type)
    problems = []
    for error in openapi().iter_response_errors(request, response):
        schema_errors = getattr(error.__cause__, "schema_errors", None)
        if schema_errors and all(_is_nullable_enum_false_positive(e) for e in schema_errors):
            continue
        problems.append(_flatten(error))
    return problems


def _is_nullable_enum_false_positive(error: Any) -> bool:
    """`nullable: true` + an `enum` without null (e.g. check-run conclusion) rejects the
    null GitHub really sends; the validator's reading, not a real mismatch."""
    schema = error.schema if isinstance(error.schema, dict) else {}
    return error.validator == "enum" and error.instance is None and bool(schema.get("nullable"))


def _describe(error: Exception) -> Iterable[dict[str, Any]]:
    """GitHub `validation-error` items for one openapi-core error."""
    if isinstance(error, ParameterValidationError):
        yield {"resource": "Request", "field": error.name, "code": "invalid", "message": _flatten(error)}
    elif isinstance(error, MissingRequestBodyError):
        yield {"resource": "Request", "field": "body", "code": "missing", "message": str(error)}
    elif isinstance(error, RequestBodyValidationError):
        schema_errors = getattr(error.__cause__, "schema_errors", None) or ()
        if not schema_errors:
            yield {"resource": "Request", "field": "body", "code": "invalid", "message": _flatten(error)}
        for schema_error in schema_errors:
            yield _schema_error_item(schema_error)
    else:
        yield {"resource": "Request", "code": "invalid", "message": _flatten(error)}


def _schema_error_item(error: Any) -> dict[str, Any]:
    """Concise item for a jsonschema ValidationError; its own message repeats the whole value."""
    field = ".".join(str(part) for part in error.absolute_path) or None
    validator, limit = error.validator, error.validator_value
    if validator == "required":
        missing = str(error.message).split("'")[1] if "'" in str(error.message) else None
        field = ".".join(filter(None, [field, missing]))
        return {"resource": "Request", "field": field, "code": "missing_field", "message": error.message}
    messages = {
        "maxLength": f"is too long (maximum is {limit} characters)",
        "maxItems": f"has too many items (maximum is {limit})",
        "minItems": f"has too few items (minimum is {limit})",
        "enum": f"{_short(error.instance)} is not one of {limit}",
        "type": f"{_short(error.instance)} is not of type {limit}",
    }
    message = messages.get(validator, _short(error.message, 300))
    item = {"resource": "Request", "code": "invalid", "message": f"{field} {message}" if field else message}
    if field:
        item["field"] = field
    return item


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _flatten(error: BaseException) -> str:
    """An error and its causes on one line, without huge embedded values."""
    parts = []
    while error is not None:
        schema_errors = getattr(error, "schema_errors", None)
        if schema_errors:
            parts.extend(
                f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {_short(e.message, 300)}" for e in schema_errors
            )
            break
        parts.append(_short(str(error), 300))
        error = error.__cause__
    return "; ".join(parts)
