"""What TR620, TR621 and TR622 share.

They report on files, not on code: :mod:`analyzers.pickles` reads the file and builds their findings,
so they declare no handlers, and their examples are files built by ``tests/test_pickle_scan.py``.
"""
from __future__ import annotations

from analyzers.rules.base import Rule


class CheckpointFileRule(Rule):
    """Reports on a checkpoint file (see :data:`analyzers.pickles.CHECKPOINT_SUFFIXES`), never on code."""

    scans_files = True
