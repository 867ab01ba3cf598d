"""Red team: what the worker writes to its log when fetching the head's archive fails (a codeload 5xx/404):
the signed archive URL, query token included?"""
from __future__ import annotations

import re
import time
from pathlib import Path

from tests.conftest import completed_run, deliver, new_repo, pr_payload


def test_archive_token_in_worker_log(stack):
    state = stack["state"]
    repo, name = new_repo(state, {})
    pr = state.open_pull_request(repo, {"train.py": "import torch\nx = torch.symeig(a)\n"}, user="alice")
    state.faults.fail("GET", "/_codeload/*", status=404, times=None)
    try:
        assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
        run = completed_run(state, pr.head_sha, timeout=120)
    finally:
        state.faults.clear()
    time.sleep(1)
    logs = sorted(Path(stack["env"]["TORCHREVIEW_DATA_DIR"]).glob("worker-*.log"))
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    issued = {t for t in state.archive_tokens}
    leaked = sorted({m for m in re.findall(r"token=([A-Za-z0-9_-]+)", text) if m in issued})
    line = next((l for l in text.splitlines() if "token=" in l), "")
    print({"check_run": (run.status, run.conclusion), "archive_tokens_issued": len(issued),
           "archive_tokens_in_worker_log": len(leaked), "log_line": line[:300]})
    assert not leaked, "the worker logs live archive tokens"


def test_redaction_covers_arguments_and_tracebacks():
    """The filter rewrites what a handler writes: the formatted message and the exception text."""
    import io
    import logging

    from bot.log_redaction import redact_handlers

    stream = io.StringIO()
    logger = logging.getLogger("torchreview.test-redaction")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.propagate = False
    redact_handlers(logger)
    try:
        try:
            raise RuntimeError("GET https://x-access-token:ghs_secret1@github.com/o/r.git failed")
        except RuntimeError:
            logger.exception("fetching %s", "https://codeload.example/o/r/tar.gz/abc?token=secret2#frag")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert "https://codeload.example/o/r/tar.gz/abc" in text and "https://github.com/o/r.git" in text
    assert "secret1" not in text and "secret2" not in text and "frag" not in text
