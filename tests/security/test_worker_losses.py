"""A job whose runs kill the worker holding them (a hostile file, out of memory) is failed with a clear check
run after two losses, never re-queued for good (acks_late + reject_on_worker_lost re-queue it after each)."""
from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.conftest import completed_run, deliver, new_repo, pr_payload, wait_for

HOLD_SECONDS = 12.0  # under the App's GitHub timeout (20 s): the job waits on the request, it does not time out


def pool_processes(worker) -> list[int]:
    pid = worker.proc.pid
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def kill_pool_mid_job(state, hold, worker, losses: int) -> None:
    """Wait until the job is held in its ``losses``-th request, then SIGKILL every pool process of the worker
    (the one running the job among them), as the kernel's OOM killer would."""
    wait_for(lambda: hold.hits >= losses, 150, f"attempt {losses} of the job, held mid-review")
    for pid in pool_processes(worker):
        os.kill(pid, signal.SIGKILL)


def test_a_job_that_kills_its_worker_twice_is_failed_not_requeued(stack):
    state = stack["state"]
    repo, name = new_repo(state, {})
    pr = state.open_pull_request(repo, {"train.py": "import torch\nx = torch.symeig(a)\n"}, user="mallory")
    files = f"/repos/{name}/pulls/{pr.number}/files"
    hold = state.faults.hold("GET", files + "*", seconds=HOLD_SECONDS, times=None)
    try:
        assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
        for losses in (1, 2):
            kill_pool_mid_job(state, hold, stack["worker"], losses)
        run = completed_run(state, pr.head_sha, timeout=90)
    finally:
        state.faults.clear()
    assert run.conclusion == "failure"
    assert "stopped the worker running it 2 times" in run.output_summary, run.output_summary
    assert hold.hits == 2  # the third delivery of the job ran nothing of the review
    assert state.reviews_for(pr) == []
    assert stack["worker"].proc.poll() is None  # the worker itself is alive and takes the next job
    other_repo, other_name = new_repo(state, {})
    other = state.open_pull_request(other_repo, {"train.py": "import torch\nx = torch.symeig(a)\n"})
    assert deliver(stack, "pull_request", pr_payload("opened", other_name, other)).status_code == 202
    assert completed_run(state, other.head_sha, timeout=90).conclusion == "failure"  # reviewed: the finding
