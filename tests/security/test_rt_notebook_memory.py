"""Red team: notebooks were parsed in the review worker's own process (not in the isolated child), before any
budget applied. Two shapes, each under the deploy's 2 GiB worker limit (a cgroup made here):

* nested: bot/pipeline.py `_parse_cost` -> analyzers.notebook.read_cells kept one Python list per open JSON
  bracket; 30 MB of '[' (a few KB once git compresses it) needed ~2.6 GB.
* outputs: the review plan re-parsed a notebook with findings in full with the pure-Python JSON scanner
  (analyzers.notebook.json_source_lines), outputs included: 22 million one-character output strings.

The pool process was OOM-killed, and `task_acks_late` + `task_reject_on_worker_lost` put the job back at the head
of the queue: the same PR killed the next attempt, and every other PR's review waited behind it."""
from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path

import pytest

from bot.cli import worker_command
from github_emulator.local import ProcessGroup
from tests.conftest import ROOT, deliver, new_repo, pr_payload

LIMIT = 2 << 30  # deploy/kubernetes/worker.yaml: limits.memory 2Gi
NESTED = b'{"cells": [' + b"[" * 30_000_000
CELL = {"cell_type": "code", "execution_count": 1, "metadata": {}, "source": ["import torch\n", "m = torch.symeig(x)\n"],
        "outputs": [{"output_type": "stream", "name": "stdout", "text": ["a"] * 22_000_000}]}
BIG_OUTPUTS = json.dumps({"cells": [CELL], "metadata": {}, "nbformat": 4, "nbformat_minor": 5},
                         separators=(",", ":")).encode()


def cgroup(tag):
    lines = [line for line in Path("/proc/self/cgroup").read_text().splitlines() if ":memory:" in line]
    if not lines or not Path("/sys/fs/cgroup/memory").is_dir():
        pytest.skip("needs a cgroup v1 memory controller to give the worker the deploy's memory limit")
    base = Path("/sys/fs/cgroup/memory" + lines[0].split(":", 2)[2])
    cg = base / f"rt-worker-{tag}"
    cg.mkdir()
    (cg / "memory.limit_in_bytes").write_text(str(LIMIT))
    return cg


def oom_kills(cg):
    text = (cg / "memory.oom_control").read_text()
    m = re.search(r"oom_kill (\d+)", text)
    return int(m.group(1)) if m else -1


@pytest.mark.parametrize("notebook", [NESTED, BIG_OUTPUTS], ids=["nested", "outputs"])
def test_hostile_notebook_kills_the_worker_again_and_again(stack, notebook):
    state = stack["state"]
    stack["worker"].stop()  # only the memory-limited worker below consumes the review queue
    tag = uuid.uuid4().hex[:6]
    cg = cgroup(tag)
    log = Path(stack["env"]["TORCHREVIEW_DATA_DIR"]) / f"oom-worker-{tag}.log"
    argv = ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh", *worker_command(1, "reviews")]
    worker = ProcessGroup(argv, log, env=stack["env"], cwd=ROOT)
    try:
        time.sleep(8)
        repo, name = new_repo(state, {})
        evil = state.open_pull_request(repo, {"analysis.ipynb": notebook}, user="mallory", head="nb")
        assert deliver(stack, "pull_request", pr_payload("opened", name, evil)).status_code == 202
        time.sleep(3)
        repo2, name2 = new_repo(state, {})
        victim = state.open_pull_request(repo2, {"train.py": "import torch\nx = torch.symeig(a)\n"}, user="alice")
        assert deliver(stack, "pull_request", pr_payload("opened", name2, victim)).status_code == 202
        started = time.time()
        samples = []
        while time.time() - started < 240:
            victim_done = [r for r in state.check_runs_for(victim.head_sha, name="torchreview") if r.status == "completed"]
            evil_done = [r for r in state.check_runs_for(evil.head_sha, name="torchreview") if r.status == "completed"]
            samples.append((round(time.time() - started), oom_kills(cg), bool(victim_done)))
            if victim_done and (oom_kills(cg) >= 3 or evil_done):  # a completed job is acknowledged: never re-run
                break
            time.sleep(5)
        text = log.read_text(errors="replace")
        lost = len(re.findall(r"signal 9|WorkerLostError|SIGKILL", text))
        evil_runs = [(r.status, r.conclusion) for r in state.check_runs_for(evil.head_sha, name="torchreview")]
        print({"oom_kills": oom_kills(cg), "worker_lost_log_lines": lost,
               "max_usage_MiB": int((cg / "memory.max_usage_in_bytes").read_text()) >> 20,
               "evil_check_runs": evil_runs, "victim_completed_after_s": next((s[0] for s in samples if s[2]), None),
               "timeline(s, ooms, victim_done)": samples[::4]})
        assert oom_kills(cg) < 2, "the poisoned job was retried into another OOM kill"
        assert victim_done, "the other PR's review waited behind the poisoned one"
        assert [status for status, _ in evil_runs] == ["completed"], "the hostile notebook's review has no verdict"
    finally:
        worker.kill()
        for pid in (cg / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        time.sleep(1)
        cg.rmdir()
