"""Locate and load GitHub's OpenAPI description (shared/github, see its README).

Loading the trimmed description into openapi-core takes a few seconds, so both the
raw JSON and the OpenAPI object are cached for the life of the process.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

SPEC_DIR_ENV = "TORCHREVIEW_GITHUB_SPEC_DIR"
TRIMMED_SPEC = "openapi/api.github.com.trimmed.json"
OPERATIONS_INDEX = "openapi/operations.json"

# Repo root is the parent of this package directory.
_REPO_ROOT = Path(__file__).resolve().parents[1]


class SpecNotFoundError(RuntimeError):
    pass


def spec_dir() -> Path:
    """The shared/github directory: $TORCHREVIEW_GITHUB_SPEC_DIR or <repo root>/../shared/github."""
    configured = os.environ.get(SPEC_DIR_ENV)
    directory = Path(configured) if configured else _REPO_ROOT.parent / "shared" / "github"
    if not (directory / TRIMMED_SPEC).is_file():
        raise SpecNotFoundError(
            f"GitHub OpenAPI description not found at {directory / TRIMMED_SPEC}. "
            f"Set {SPEC_DIR_ENV} to the shared/github directory "
            f"(the one holding {TRIMMED_SPEC})."
        )
    return directory


@functools.lru_cache(maxsize=None)
def _load_json(path: str) -> Any:
    return json.loads(Path(path).read_text())


def operations_index() -> list[dict[str, Any]]:
    """The 26 operations the app uses (operations.json)."""
    return _load_json(str(spec_dir() / OPERATIONS_INDEX))["operations"]


@functools.lru_cache(maxsize=None)
def _openapi_for(path: str):
    from openapi_core import OpenAPI

    return OpenAPI.from_file_path(path)


def openapi():
    """openapi-core's OpenAPI object for the trimmed description (slow first call)."""
    return _openapi_for(str(spec_dir() / TRIMMED_SPEC))
