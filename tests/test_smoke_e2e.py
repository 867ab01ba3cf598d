"""The GPU runner wired into the App: static review first, then the ``torchreview / smoke`` check run."""
from __future__ import annotations

import time

import pytest

from github_emulator.webhooks import issue_comment_payload
from tests.conftest import Worker, completed_run, deliver, new_repo, pr_payload, wait_for

SMOKE_CONFIG = ".github/torchreview.yml"
MODELS = '''import torch
import torch.nn as nn


class HealthyMLP(nn.Module):
    def __init__(self, in_features=16, hidden=32, num_classes=4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)


class DetachedEncoder(nn.Module):
    def __init__(self, in_features=16, hidden=32, num_classes=4):
        super().__init__()
        self.encoder = nn.Linear(in_features, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x):
        features = self.encoder(x).detach()
        return self.head(torch.relu(features))
'''


@pytest.fixture(scope="module")
def gpu_worker(stack):
    with Worker(stack["env"], queues="gpu", concurrency=1) as worker:
        yield worker


def smoke_run(state, sha: str, timeout: float = 240.0):
    def done():
        runs = [r for r in state.check_runs_for(sha, name="torchreview / smoke") if r.status == "completed"]
        return runs[0] if runs else None

    return wait_for(done, timeout, f"a completed smoke check run on {sha[:7]}")


def test_collaborator_pr_gets_static_review_then_smoke_results(stack, gpu_worker):
    state = stack["state"]
    # preview: true: the static findings these tests use (TR601, TR513, TR401) are preview rules
    repo, name = new_repo(state, {}, {SMOKE_CONFIG: "preview: true\nsmoke:\n  enabled: true\n  timeout: 120\n"})
    state.add_collaborator(repo, "alice", role="write")
    pr = state.open_pull_request(repo, {"models/net.py": MODELS}, user="alice")
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    static = completed_run(state, pr.head_sha)
    smoke = smoke_run(state, pr.head_sha)
    assert static.completed_at <= smoke.completed_at  # static review posts first
    assert smoke.conclusion == "failure"
    summary = smoke.output_summary
    assert "models/net.py:HealthyMLP" in summary and "models/net.py:DetachedEncoder" in summary
    assert "encoder.weight" in summary  # the gradients check names the parameters that get none
    comments = [c for c in state.review_comments_for(pr) if "smoke" in c.body]
    assert len(comments) == 1 and comments[0].path == "models/net.py"
    assert 14 <= comments[0].line <= 23  # on the DetachedEncoder class


def test_fork_prs_never_smoke_automatically_but_review_smoke_runs_pinned(stack, gpu_worker):
    state = stack["state"]
    repo, name = new_repo(state, {}, {SMOKE_CONFIG: "preview: true\nsmoke:\n  enabled: true\n  timeout: 120\n"})
    fork = state.fork(repo, "mallory")
    pr = state.open_pull_request(repo, {"models/net.py": MODELS.split("class DetachedEncoder")[0]},
                                 user="mallory", head_repo=fork)
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    completed_run(state, pr.head_sha)
    time.sleep(3)
    assert state.check_runs_for(pr.head_sha, name="torchreview / smoke") == []
    # a maintainer asks for it explicitly
    deliver(stack, "issue_comment", issue_comment_payload(state, pr, "/review smoke", user="octo-maintainer"))
    smoke = smoke_run(state, pr.head_sha)
    assert smoke.conclusion == "success"


DETACHED = '''import torch
import torch.nn as nn


class DetachedEncoder(nn.Module):
    def __init__(self, in_features=16, hidden=32, num_classes=4):
        super().__init__()
        self.encoder = nn.Linear(in_features, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x):
        features = self.encoder(x).detach()
        return self.head(torch.relu(features))


def load(path):
    return torch.load(path)
'''


def test_smoke_threads_are_commented_once_and_resolved_when_fixed(stack, gpu_worker):
    state = stack["state"]
    repo, name = new_repo(state, {}, {SMOKE_CONFIG: "preview: true\nsmoke:\n  enabled: true\n  timeout: 120\n"})
    state.add_collaborator(repo, "alice", role="write")
    pr = state.open_pull_request(repo, {"models/net.py": DETACHED}, user="alice")
    deliver(stack, "pull_request", pr_payload("opened", name, pr))
    completed_run(state, pr.head_sha)
    assert smoke_run(state, pr.head_sha).conclusion == "failure"

    def smoke_threads():
        bodies = {c.id: c.body for c in state.review_comments_for(pr)}
        return [t for t in state.threads_for(pr) if "**smoke**" in bodies[t.root_comment_id]]

    assert len(smoke_threads()) == 1 and len(state.threads_for(pr)) == 2  # TR601 and the smoke failure

    # Fix only the static finding: its thread resolves; the smoke failure, still there, keeps its one
    # open thread (the static review never touches smoke threads, and the smoke job does not repeat itself).
    head = state.push(pr, {"models/net.py": DETACHED.replace("torch.load(path)", "torch.load(path, weights_only=True)")})
    deliver(stack, "pull_request", pr_payload("synchronize", name, pr))
    assert completed_run(state, head).conclusion == "success"
    assert smoke_run(state, head).conclusion == "failure"
    assert len(smoke_threads()) == 1 and not smoke_threads()[0].is_resolved
    assert [t.is_resolved for t in state.threads_for(pr) if t not in smoke_threads()] == [True]

    # Fix the model: the smoke job resolves its own thread.
    head = state.push(pr, {"models/net.py": DETACHED.replace(".detach()", "")})
    deliver(stack, "pull_request", pr_payload("synchronize", name, pr))
    completed_run(state, head)
    assert smoke_run(state, head).conclusion == "success"
    threads = state.threads_for(pr)
    assert len(threads) == 2 and all(t.is_resolved for t in threads)


TRAIN_WITHOUT_ZERO_GRAD = '''import torch
from models.net import HealthyMLP


def train_one_epoch(model, loader, optimizer, criterion, device):
    model.train()
    for x, y in loader:
        loss = criterion(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
'''


def test_a_changed_training_step_is_run_and_commented_on_its_line(stack, gpu_worker):
    state = stack["state"]
    repo, name = new_repo(state, {}, {SMOKE_CONFIG: "preview: true\nsmoke:\n  enabled: true\n  timeout: 120\n",
                                      "models/net.py": MODELS})
    state.add_collaborator(repo, "alice", role="write")
    pr = state.open_pull_request(repo, {"train.py": TRAIN_WITHOUT_ZERO_GRAD}, user="alice")
    deliver(stack, "pull_request", pr_payload("opened", name, pr))
    smoke = smoke_run(state, pr.head_sha)
    assert smoke.conclusion == "failure" and "train.py:train_one_epoch" in smoke.output_summary, smoke.output_summary
    assert "zero-grad" in smoke.output_summary
    comments = [c for c in state.review_comments_for(pr) if "**smoke**" in c.body]
    # the step's failure and the static finding it confirms are one observation: one comment says both
    assert len(comments) == 1 and comments[0].path == "train.py"
    assert "Confirmed by running" in comments[0].body and "TR101" in comments[0].body
    assert comments[0].line == 10  # optimizer.step(), the step whose gradients are never reset


DROPOUT_ALWAYS_ON = '''import torch.nn as nn
import torch.nn.functional as F


class Tagger(nn.Module):
    def __init__(self, in_features=16, hidden=32, tags=5, dropout=0.3):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, tags)
        self.dropout = dropout

    def forward(self, x):
        h = F.dropout(F.relu(self.fc1(x)), p=self.dropout)
        return self.fc2(h)


class Scorer(nn.Module):
    def __init__(self, in_features=16, classes=4):
        super().__init__()
        self.fc = nn.Linear(in_features, classes)

    def forward(self, x):
        return F.softmax(self.fc(x), dim=-1)
'''
TRAIN_ON_PROBABILITIES = '''import torch
import torch.nn as nn

from models.tagger import Scorer


def fit(loader, epochs=3):
    model = Scorer()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
'''


def test_a_static_finding_the_smoke_run_confirms_is_said_on_its_line(stack, gpu_worker):
    state = stack["state"]
    repo, name = new_repo(state, {}, {SMOKE_CONFIG: "preview: true\nsmoke:\n  enabled: true\n  timeout: 120\n"})
    state.add_collaborator(repo, "alice", role="write")
    pr = state.open_pull_request(repo, {"models/tagger.py": DROPOUT_ALWAYS_ON, "train.py": TRAIN_ON_PROBABILITIES},
                                 user="alice")
    deliver(stack, "pull_request", pr_payload("opened", name, pr))
    completed_run(state, pr.head_sha)
    smoke = smoke_run(state, pr.head_sha)
    assert "**Confirmed by running** (TR513 functional-dropout-always-on at `models/tagger.py:13`" \
        in smoke.output_summary, smoke.output_summary
    on_line = [c for c in state.review_comments_for(pr) if c.path == "models/tagger.py" and c.line == 13]
    static = [c for c in on_line if "TR513" in c.body and "**smoke**" not in c.body]
    confirmed = [c for c in on_line if "**smoke**" in c.body]
    assert len(static) == 1 and len(confirmed) == 1, [c.body for c in on_line]
    assert "Confirmed by running" in confirmed[0].body
    assert "still ran with training=True and p=0.3" in confirmed[0].body
    assert "two eval-mode forwards of the same batch differ" in confirmed[0].body
    # a finding in the training script about the model's forward, confirmed on the model's target
    assert "**Confirmed by running** (TR401 softmax-before-cross-entropy at `train.py:14`, on " \
        "`models/tagger.py:Scorer`)" in smoke.output_summary, smoke.output_summary.split("Static findings")[-1]
    floor = [c for c in state.review_comments_for(pr) if c.path == "train.py" and "**smoke**" in c.body]
    assert len(floor) == 1 and floor[0].line == 14
    assert "cannot fall below log(1 + 3/e) = 0.744" in floor[0].body
