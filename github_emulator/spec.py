"""Load GitHub's OpenAPI description from the contract cache (see :mod:`github_emulator.contract`).

Loading the trimmed description into openapi-core takes a few seconds, so both the
raw JSON and the OpenAPI object are cached for the life of the process.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from .contract import OPERATIONS_INDEX, TRIMMED_SPEC, ContractError, require


@functools.lru_cache(maxsize=None)
def _load_json(path: str) -> Any:
    return json.loads(Path(path).read_text())


def operations_index() -> list[dict[str, Any]]:
    """The operations the app uses (operations.json)."""
    return _load_json(str(require(OPERATIONS_INDEX)))["operations"]


@functools.lru_cache(maxsize=None)
def _openapi_for(path: str):
    from openapi_core import OpenAPI

    return OpenAPI.from_file_path(path)


def openapi():
    """openapi-core's OpenAPI object for the trimmed description (slow first call)."""
    return _openapi_for(str(require(TRIMMED_SPEC)))


__all__ = ["ContractError", "openapi", "operations_index"]
