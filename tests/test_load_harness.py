"""bench/load.py, scaled down: the same storm code on real parts (Redis with the deploy's persistence,
gunicorn, Celery workers, the emulator with faults), with a worker killed, Redis restarted and a gunicorn
worker killed; every check of the harness must hold. And the checks themselves must be able to fail."""
from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _load_harness():
    spec = importlib.util.spec_from_file_location("bench_load", ROOT / "bench" / "load.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


load = _load_harness()

SMALL = load.Storm(deliveries=100, pull_requests=20, installations=10, workers=2, burst_seconds=15.0,
                   kill_every=8.0, redis_restarts=1, web_kills=1, visibility_timeout=15, drain_timeout=90.0)


@pytest.fixture(scope="module")
def storm(tmp_path_factory):
    outcome = load.run_storm(SMALL, tmp_path_factory.mktemp("storm"))
    return outcome


def _worker_lines_about(storm, problems: list[str], limit: int = 60) -> str:
    """The workers' log lines that name a pull request a problem names, and the faults around them: what the
    next person needs when a rare interleaving of faults loses a head (the storm's folder is gone by then)."""
    names = {problem.split(":", 1)[0] for problem in problems if "#" in problem.split(":", 1)[0]}
    lines = [line for line in storm.logs.splitlines() if any(name in line for name in names)]
    faults = [f"{at - storm.burst_started:.1f}s {event}" for at, event in storm.events]
    return "\n".join(["", "worker log lines about them:", *lines[-limit:], "faults:", *faults])


def test_the_app_holds_through_a_small_storm(storm):
    problems = load.check(storm)
    assert problems == [], "\n".join(problems) + _worker_lines_about(storm, problems)
    figures = load.figures(storm)
    faults = " ".join(figures["faults"])
    assert faults.count("worker SIGKILLed") == 1 and faults.count("redis restarted") == 1
    assert faults.count("gunicorn worker") == 1
    assert figures["github_502"] > 0 and figures["github_rate_limited"] > 0  # the faults did happen
    assert figures["heads_completed"] > 0 and figures["reviews"] >= SMALL.pull_requests


def test_the_checks_catch_what_they_promise_to(storm):
    """Doctored copies of the storm's outcome: each broken promise is reported."""
    def broken(edit) -> list[str]:
        outcome = copy.deepcopy(storm)
        edit(outcome.snapshot, outcome)
        return load.check(outcome)

    first = storm.snapshot["prs"][0]

    def second_review(shot, _):
        shot["prs"][0]["reviews"].append({"id": -1, "commit": first["head"]})

    def repeated_comment(shot, _):
        shot["prs"][0]["fingerprints"].append(first["fingerprints"][0])

    def open_run(shot, _):
        shot["prs"][0]["runs"].append({"id": 10**9, "head": first["head"], "status": "in_progress",
                                       "conclusion": None, "external_id": "x"})

    def write_burst(shot, _):
        shot["requests"].extend((1000.0 + i * 0.5, "POST", "/repos/o/r/check-runs", 201, 1, True, None, "w")
                                for i in range(81))

    pushed = next(n for n, pr in enumerate(storm.snapshot["prs"]) if pr["heads"][1] in pr["landed"])
    pushed_pr = storm.snapshot["prs"][pushed]

    def stale_verdict(shot, outcome):
        """A run on the superseded first head completed `failure` by a worker that had read the new head."""
        landed = pushed_pr["landed"][pushed_pr["heads"][1]]
        shot["prs"][pushed]["runs"].append({"id": 10**9 + 1, "head": pushed_pr["heads"][0], "status": "completed",
                                            "conclusion": "failure", "external_id": "stale"})
        shot["requests"].extend([(landed + 1, "GET", load.pull_path(outcome.world, pushed), 200, 1, False, None, "w9"),
                                 (landed + 2, "PATCH", f"/repos/o/r/check-runs/{10**9 + 1}", 200, 1, True,
                                  "completed", "w9")])

    def leftovers(_, outcome):
        outcome.leftovers = {**outcome.leftovers, "unacked": 1, "locks": ["torchreview:lock:o/r#1"]}

    def violation(shot, _):
        shot["violations"].append({"method": "GET", "path": "/nope", "errors": ["no such operation"]})

    def unanswered(_, outcome):
        outcome.accepted = {i: t for i, t in outcome.accepted.items() if i != 0}

    assert first["fingerprints"], "the storm's first PR got inline comments"
    assert any("1 deliveries were never acknowledged (e.g. plan #0, answered [" in p for p in broken(unanswered))
    assert any("2 reviews on" in p for p in broken(second_review))
    assert any("posted twice" in p for p in broken(repeated_comment))
    assert any("not completed" in p for p in broken(open_run))
    assert any("81 content-creating requests within 60 s" in p for p in broken(write_burst))
    assert any("unacknowledged" in p for p in broken(leftovers)) and any("left locked" in p for p in broken(leftovers))
    assert any("OpenAPI" in p for p in broken(violation))
    assert any("read the newer head" in p for p in broken(stale_verdict))


def test_a_superseded_run_is_judged_by_its_own_workers_last_read_of_the_head():
    path = "/repos/o/r/pulls/1"
    reads = {("w1", path): [10.0, 20.0], ("w2", path): [31.0], ("w1", "/repos/o/r/pulls/2"): [26.0]}
    pushed = 25.0
    assert load._judged_a_stale_head((24.0, "w1"), reads, path, pushed) == ""  # completed before the push
    # read at 20 (before the push), written at 29: the push landed in between, which no client can see
    assert load._judged_a_stale_head((29.0, "w1"), reads, path, pushed) == ""
    assert "read the newer head" in load._judged_a_stale_head((32.0, "w2"), reads, path, pushed)
    assert "without reading" in load._judged_a_stale_head((32.0, "w3"), reads, path, pushed)
    assert load._judged_a_stale_head((32.0, "w2"), reads, path, float("inf")) == ""  # never superseded


def test_max_in_window():
    assert load.max_in_window([], 60) == 0
    assert load.max_in_window([0, 59.9, 60, 119.9], 60) == 2
    assert load.max_in_window([0, 1, 2, 61], 60) == 3


def _redis_args(command: list[str]) -> dict[str, str]:
    args = [a for a in command if a != "redis-server"]
    return {args[i].lstrip("-"): args[i + 1] for i in range(0, len(args) - 1, 2) if args[i].startswith("--")}


def test_the_harness_runs_redis_with_the_deploy_files_persistence():
    """The storm's Redis restart proves what deploy/ promises only if both use the same settings."""
    promised = _redis_args(list(load.REDIS_PERSISTENCE))
    assert promised == {"appendonly": "yes", "appendfsync": "everysec"}
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    assert promised.items() <= _redis_args(compose["services"]["redis"]["command"]).items()
    manifests = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "redis.yaml").read_text()))
    workload = next(m for m in manifests if m["kind"] in ("Deployment", "StatefulSet"))
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    assert promised.items() <= _redis_args(container["args"]).items()
    # ... and the data outlives the pod: a volume claim, not an emptyDir
    claims = workload["spec"].get("volumeClaimTemplates") or []
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}
    assert any(c["metadata"]["name"] == "data" for c in claims) or "persistentVolumeClaim" in volumes.get("data", {})
