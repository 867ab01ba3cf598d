"""What the runner's tests share: a code tree written from strings and one torch thread for tiny models (the
modules a test imports from its tree are forgotten after it by conftest's ``isolated_imports``)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """``files`` (path -> source, dedented) written under ``root``; returns ``root``."""
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return root


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core box spinning OpenMP workers make
    the suite several times slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
