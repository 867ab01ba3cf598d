"""Red team: how big can one smoke run's report get, end to end? Each target's framed report from the worker is kept
up to 4 MiB (the worker's output cap, fresh for every new worker), `_sanitized` keeps any number of checks, the
executor returns it all, and the GPU worker stores it in Redis for 24 h (`...:report`)."""
from __future__ import annotations

import json

import pytest
import redis

from tests.conftest import Worker, completed_run, deliver, new_repo, pr_payload, wait_for
from github_emulator.webhooks import issue_comment_payload

SMOKE = "torchreview / smoke"
N = 8
CLASS = '''

class Big{i}(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        f = sys._getframe()
        while f is not None and not ("nonce" in f.f_locals and "out" in f.f_locals):
            f = f.f_back
        nonce, out = f.f_locals["nonce"], f.f_locals["out"]
        report = {{"status": "failed", "measures": {{}}, "loss_curve": [0.5] * 1000,
                  "checks": [{{"name": "c%d" % k, "status": "fail", "message": "m" * 3990}} for k in range(980)]}}
        data = (nonce + json.dumps(report) + "\\n").encode()
        view = memoryview(data)
        while view:
            view = view[os.write(out, view):]
        os._exit(0)

    def forward(self, x):
        return self.fc(x)
'''
MODEL = "import json, os, sys\nimport torch.nn as nn\n" + "".join(CLASS.format(i=i) for i in range(N))


@pytest.fixture(scope="module")
def gpu_worker(stack):
    with Worker(stack["env"], queues="gpu", concurrency=1) as worker:  # stopped however the module ends
        yield worker


def test_one_smoke_run_stores_megabytes_in_redis(stack, gpu_worker):
    state = stack["state"]
    store = redis.Redis.from_url(stack["env"]["REDIS_URL"])
    repo, name = new_repo(state, {}, {".github/torchreview.yml": "smoke:\n  enabled: false\n  timeout: 120\n"})
    pr = state.open_pull_request(repo, {"models/many.py": MODEL}, user="mallory")
    assert deliver(stack, "pull_request", pr_payload("opened", name, pr)).status_code == 202
    completed_run(state, pr.head_sha, timeout=120)
    data = issue_comment_payload(state, pr, f"/review smoke {pr.head_sha}", user="octo-maintainer")
    assert deliver(stack, "issue_comment", data).status_code == 202
    run = wait_for(lambda: next((r for r in state.check_runs_for(pr.head_sha, name=SMOKE) if r.status == "completed"),
                                None), 900, "the smoke run")
    keys = [k for k in store.scan_iter(match="torchreview:smoke:*:report")]
    sizes = {k.decode()[-60:]: store.strlen(k) for k in keys}
    mine = max(sizes.values())
    print({"targets": N, "redis_report_bytes": mine, "per_target_MiB": round(mine / N / 2**20, 2),
           "ttl_s": store.ttl(keys[0]), "check_run": (run.conclusion, run.output_title), "summary_len": len(run.output_summary)})
    assert mine <= 2 << 20, "one smoke run stored more than 2 MiB in Redis"


# ---- issue 23 item 8: the bounds themselves ----------------------------------------------------------------------

SMALL = "import torch.nn as nn\n" + "".join(f'''

class Small{i}(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)
''' for i in range(5))


def test_targets_past_max_targets_are_listed_not_run(stack, gpu_worker):
    state = stack["state"]
    store = redis.Redis.from_url(stack["env"]["REDIS_URL"])
    repo, name = new_repo(state, {}, {".github/torchreview.yml": "smoke:\n  enabled: false\n  max_targets: 2\n"})
    pr = state.open_pull_request(repo, {"models/small.py": SMALL}, user="mallory")
    data = issue_comment_payload(state, pr, f"/review smoke {pr.head_sha}", user="octo-maintainer")
    assert deliver(stack, "issue_comment", data).status_code == 202
    run = wait_for(lambda: next((r for r in state.check_runs_for(pr.head_sha, name=SMOKE) if r.status == "completed"),
                                None), 600, "the smoke run")
    assert "3 not run" in run.output_title and run.conclusion == "neutral"  # nobody passes untested targets
    assert "**3 more target(s) not smoke-trained**: a run trains at most 2 (`smoke.max_targets`" in run.output_summary
    assert all(f"`models/small.py:Small{i}`" in run.output_summary for i in range(5))
    (key,) = [k for k in store.scan_iter(match=f"torchreview:smoke:{name}#*:report")]
    assert len(json.loads(store.get(key))["report"]["targets"]) == 2


def test_a_hostile_report_is_bounded_per_target():
    from gpu_runner.runner import MAX_REPORT_BYTES, _sanitized

    hostile = {"status": "failed", "loss_curve": [0.5] * 100_000, "traceback": "t" * 100_000,
               "measures": {f"m{i}": i for i in range(10_000)}, "notes": ["n" * 5000] * 100,
               "checks": [{"name": f"c{k}", "status": "fail", "message": "m" * 3990, "extra": "e" * 4000,
                           "details": {"k" * 10: "v" * 15_000}} for k in range(980)],
               "findings": [{"verdict": "confirmed", "line": 1, "rule": "TR401", "path": "p" * 600,
                             "evidence": "e" * 2000, "details": {f"k{i}": "v" * 300 for i in range(30)}}] * 100}
    clean = _sanitized(hostile, "models/a.py:A")
    assert len(json.dumps(clean)) <= MAX_REPORT_BYTES
    assert clean["checks"] and all(set(c) == {"name", "status", "message", "details"} for c in clean["checks"])
    assert any("left out" in note for note in clean["notes"]) or len(clean["checks"]) == 40
    ordinary = {"status": "passed", "measures": {"params": 10}, "loss_curve": [1.0, 0.5],
                "checks": [{"name": "gradients", "status": "pass", "message": "ok", "details": {"line": 3}}]}
    assert _sanitized(ordinary, "a.py:B") == {"target": "a.py:B", "status": "passed", "checks": ordinary["checks"],
                                              "measures": {"params": 10}, "reason": "", "notes": [], "findings": [],
                                              "loss_curve": [1.0, 0.5]}


def test_configured_targets_are_chosen_first():
    from bot.smoke import within_target_limit
    from gpu_runner.runner import TargetRequest

    found = [TargetRequest(f"m.py:Added{i}") for i in range(5)]
    configured = TargetRequest("models/net.py:build_model")
    kept, left = within_target_limit(found + [configured], {("model", "models/net.py:build_model")}, 3)
    assert [r.target for r in kept] == ["m.py:Added0", "m.py:Added1", "models/net.py:build_model"]
    assert left == ["m.py:Added2", "m.py:Added3", "m.py:Added4"]


def test_a_run_keeps_no_report_over_the_cap(stack):
    from bot.smoke import MAX_STORED_REPORT_BYTES, keep_report
    from bot.store import make_store

    store = make_store(stack["env"]["REDIS_URL"], stack["env"]["TORCHREVIEW_DATA_DIR"])
    assert keep_report(store, "torchreview:smoke:test#1:small:report", "{}")
    assert store.get("torchreview:smoke:test#1:small:report") == "{}"
    assert not keep_report(store, "torchreview:smoke:test#1:big:report", "x" * (MAX_STORED_REPORT_BYTES + 1))
    assert store.get("torchreview:smoke:test#1:big:report") is None
