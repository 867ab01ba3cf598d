"""The App end to end: real payloads over real HTTP into Flask, real Redis, a real Celery worker
process, and PyGithub talking to the GitHub emulator."""
from __future__ import annotations

import time
import uuid

from github_emulator.webhooks import issue_comment_payload
from tests.conftest import ROOT, Worker, completed_run, deliver, new_repo, pr_payload, wait_for

BUGGY = (ROOT / "examples" / "buggy_train.py").read_text()
BASE_TRAIN = "import torch\n\n\ndef load(path):\n    return torch.load(path, weights_only=True)\n"
# two bugs: TR601 (the load feeds load_state_dict, so weights_only=True is a safe fix; a preview rule: the test repositories opt in with PREVIEW) and TR810 (stable, high: it fails
# the check, as preview findings never do)
HEAD_TRAIN = (BASE_TRAIN + "\n\ndef resume(model, path):\n    model.load_state_dict(torch.load(path))\n    return model\n"
              "\n\ndef eigen(a):\n    return torch.symeig(a)\n")
FIXED_TRAIN = (BASE_TRAIN + "\n\ndef resume(model, path):\n    model.load_state_dict(torch.load(path, weights_only=True))\n    return model\n"
               "\n\ndef eigen(a):\n    return torch.linalg.eigh(a)\n")
PREVIEW = {".github/torchreview.yml": "preview: true\n"}


def test_pull_request_review_then_fix(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, {"train.py": BASE_TRAIN, **PREVIEW})
    pr = state.open_pull_request(repo, {"train.py": HEAD_TRAIN, "models/buggy.py": BUGGY}, user="alice")
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    run = completed_run(state, pr.head_sha)
    assert run.conclusion == "failure"
    (review,) = state.reviews_for(pr)
    comments = state.review_comments_for(pr)
    assert 0 < len(comments) <= 30
    by_place = {(c.path, c.line) for c in comments}
    assert ("train.py", 9) in by_place  # the new torch.load without weights_only
    unsafe = next(c for c in comments if c.path == "train.py" and c.line == 9)
    assert "TR601" in unsafe.body and "```suggestion" in unsafe.body and "weights_only=True" in unsafe.body
    assert "<!-- torchreview:fingerprint=" in unsafe.body
    assert all(c.path != "train.py" or c.line >= 7 for c in comments)  # never on unchanged base lines
    assert len(run.annotations) >= len(comments)
    assert "Recommended actions" in run.output_summary

    # The author fixes it: synchronize → success, nothing new posted for the fixed head.
    new_head = state.push(pr, {"train.py": FIXED_TRAIN, "models/buggy.py": None})
    assert deliver(stack, "pull_request", pr_payload("synchronize", name, pr)).status_code == 202
    run = completed_run(state, new_head)
    assert run.conclusion == "success"
    assert len(state.reviews_for(pr)) == 1


def test_duplicate_delivery_reviewed_once(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, PREVIEW)
    pr = state.open_pull_request(repo, {"train.py": HEAD_TRAIN})
    data = pr_payload("opened", name, pr)
    delivery = str(uuid.uuid4())
    assert deliver(stack, "pull_request", data, delivery).status_code == 202
    assert deliver(stack, "pull_request", data, delivery).status_code == 200
    # a different delivery for the same head (e.g. check_suite.requested) does not re-post either
    assert deliver(stack, "pull_request", pr_payload("reopened", name, pr)).status_code == 202
    completed_run(state, pr.head_sha)
    time.sleep(2)
    assert len(state.reviews_for(pr)) == 1
    assert len(state.check_runs_for(pr.head_sha, name="torchreview")) == 1


def test_github_errors_are_retried_and_posted_once(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, PREVIEW)
    pr = state.open_pull_request(repo, {"train.py": HEAD_TRAIN})
    state.faults.fail("GET", f"/repos/{name}/pulls/{pr.number}/files*", status=502, times=2)
    state.faults.secondary_rate_limit("POST", f"/repos/{name}/pulls/{pr.number}/reviews", times=1, retry_after=1)
    try:
        assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
        run = completed_run(state, pr.head_sha, timeout=90)
    finally:
        state.faults.clear()
    assert run.conclusion == "failure"
    assert len(state.reviews_for(pr)) == 1
    posts = state.requests_matching("POST", f"/repos/{name}/pulls/{pr.number}/reviews")
    assert [r.status for r in posts] == [403, 200]


def test_worker_killed_mid_job_still_posts_once(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, PREVIEW)
    pr = state.open_pull_request(repo, {"train.py": HEAD_TRAIN})
    # Keep the job busy retrying until the worker is killed.
    state.faults.fail("POST", f"/repos/{name}/pulls/{pr.number}/reviews", status=502, times=None)
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    wait_for(lambda: state.requests_matching("POST", f"/repos/{name}/pulls/{pr.number}/reviews"), 60, "a review attempt")
    stack["worker"].kill()
    state.faults.clear()
    stack["worker"] = Worker(stack["env"])  # a fresh worker picks the job up again
    run = completed_run(state, pr.head_sha, timeout=90)
    assert run.conclusion == "failure"
    assert len(state.reviews_for(pr)) == 1
    assert run.status == "completed"


def test_big_and_odd_pull_request(stack):
    state = stack["state"]
    base = {"cfg.bin": b"\x00\x01", "models/ok.py": "import torch\n"}
    repo, name = new_repo(state, {}, {**base, **PREVIEW})
    files = {f"pkg/mod_{i:03d}.py": f"import torch\nX_{i} = torch.zeros(1)\n" for i in range(396)}
    files["weights.py"] = b"import torch\x00\xff\xfe binary"
    files["broken.py"] = "import torch\ndef broken(:\n"
    files["huge_diff.py"] = "import torch\n" + "".join(f"v{i} = torch.ones({i})\n" for i in range(20000))
    files["train.py"] = HEAD_TRAIN
    pr = state.open_pull_request(repo, files)
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    run = completed_run(state, pr.head_sha, timeout=240)
    summary = run.output_summary
    assert run.conclusion == "failure"
    assert "broken.py" in summary and "weights.py" in summary and "huge_diff.py" in summary
    comments = state.review_comments_for(pr)
    assert any(c.path == "train.py" for c in comments)


def test_config_is_read_from_the_base_branch(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, {".torchreview.toml": 'ignore = ["TR601", "TR810"]\n'})
    # The PR tries to turn on everything and fail on low: ignored, the base config rules.
    pr = state.open_pull_request(repo, {".torchreview.toml": 'fail_on = "low"\n', "train.py": HEAD_TRAIN})
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    run = completed_run(state, pr.head_sha)
    assert run.conclusion == "success"
    assert state.reviews_for(pr) == []


def test_invalid_base_config_fails_the_check_with_the_error(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, {".torchreview.toml": 'fail_on = "sometimes"\n'})
    pr = state.open_pull_request(repo, {"train.py": HEAD_TRAIN})
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    run = completed_run(state, pr.head_sha)
    assert run.conclusion == "failure" and "fail_on" in run.output_summary
    assert state.reviews_for(pr) == []


def test_no_pytorch_files(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, PREVIEW)
    pr = state.open_pull_request(repo, {"docs/guide.md": "# hi\n"})
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    run = completed_run(state, pr.head_sha)
    assert run.conclusion == "success" and "No PyTorch files changed" in run.output_title


def test_review_comment_command_reruns(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, PREVIEW)
    pr = state.open_pull_request(repo, {"train.py": HEAD_TRAIN})
    data = issue_comment_payload(state, pr, "/review", user="octo-maintainer")
    assert deliver(stack, "issue_comment", data).status_code == 202
    run = completed_run(state, pr.head_sha)
    assert run.conclusion == "failure"
    assert len(state.reviews_for(pr)) == 1


def test_inline_comment_limit_from_base_config(stack):
    state = stack["state"]
    repo, name = new_repo(state, {}, {"pyproject.toml": "[tool.torchreview]\nmax_inline_comments = 2\npreview = true\n"
                                              "measured_severities = false\n"})
    pr = state.open_pull_request(repo, {"train.py": BUGGY})
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    run = completed_run(state, pr.head_sha)
    comments = state.review_comments_for(pr)
    assert len(comments) == 2
    assert all("critical" in c.body for c in comments)  # most severe first
    (summary,) = [c for c in state.issue_comments_for(pr) if "torchreview:summary" in c.body]
    assert "More findings" in summary.body
    assert len(run.annotations) > 10  # every finding is still an annotation


def test_a_review_command_run_again_reuses_its_own_check_run(stack):
    """A /review job handed out again (its worker died after completing the run) finds its run even when
    a newer one exists: GitHub lists only the newest run per name unless asked for all."""
    from bot.jobs import route_event, send
    from bot.settings import Settings

    state = stack["state"]
    repo, name = new_repo(state, {}, PREVIEW)
    pr = state.open_pull_request(repo, {"train.py": HEAD_TRAIN})
    first_delivery = str(uuid.uuid4())
    first = issue_comment_payload(state, pr, "/review", user="octo-maintainer")
    assert deliver(stack, "issue_comment", first, first_delivery).status_code == 202

    def run_of(delivery):
        runs = [r for r in state.check_runs_for(pr.head_sha, name="torchreview")
                if r.external_id == delivery and r.status == "completed"]
        return runs[0] if runs else None

    run = wait_for(lambda: run_of(first_delivery), 60, "the first command's run")
    second_delivery = str(uuid.uuid4())
    second = issue_comment_payload(state, pr, "/review", user="octo-maintainer")
    assert deliver(stack, "issue_comment", second, second_delivery).status_code == 202
    wait_for(lambda: run_of(second_delivery), 60, "the second command's run")
    edits = len(state.requests_matching("PATCH", f"/repos/{name}/check-runs/{run.id}"))
    settings = Settings(app_id=4242, private_key=None, webhook_secret=None, redis_url=stack["env"]["REDIS_URL"])
    (job,) = route_event("issue_comment", first, first_delivery, settings)
    send(job, settings)  # the broker's redelivery of the first job
    wait_for(lambda: len(state.requests_matching("PATCH", f"/repos/{name}/check-runs/{run.id}")) > edits, 60,
             "the first run to be completed again")
    runs = state.check_runs_for(pr.head_sha, name="torchreview")
    assert sorted(r.external_id for r in runs) == sorted([first_delivery, second_delivery])
    assert all(r.status == "completed" for r in runs)
