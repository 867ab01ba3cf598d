"""No lost events: deliveries the App missed are redelivered by the sweep (bot/recover.py), each event once.

Real parts throughout: the emulator sends each event to the webhook over HTTP and logs every attempt as
GitHub does (a refused connection is a failed delivery), the webhook runs in-process behind a real HTTP
server, a `torchreview worker` process reviews from a private Redis, and the sweep runs as the CLI
(`torchreview recover`), as the Celery task the beat schedules, and in `torchreview serve`'s own beat.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone

import pytest
import requests
from github import Auth, GithubIntegration
from prometheus_client.parser import text_string_to_metric_families

from bot.recover import DurationError, attempts_since, parse_duration, sweep
from github_emulator.local import ProcessGroup, free_port
from github_emulator.webhooks import pull_request_payload
from tests.conftest import ROOT, WEBHOOK_SECRET, answer, completed_run, new_repo, wait_for

# TR810 (a stable rule: its high finding fails the check; preview rules never do)
FINDING = 'import torch\n\nm = torch.symeig(a)\n'


def reviews_of(state, pr) -> list:
    """The App's completed check runs on the PR's head: one per review."""
    return [r for r in state.check_runs_for(pr.head_sha, name="torchreview") if r.status == "completed"]


def recover_cli(stack, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bot.cli", "recover", *args], env=stack["env"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def hook(stack):
    """The App's webhook on the emulator's side; ``down()`` points it at a port nobody listens on."""
    webhook = stack["state"].app_webhook
    webhook.configure(stack["url"], WEBHOOK_SECRET)
    # The module's tests share the emulator: GitHub's log of the App's deliveries starts with this test's own,
    # whichever tests ran before it (those that leave an event undelivered would be redelivered here too).
    webhook.deliveries.clear()
    webhook.down = lambda: webhook.configure(f"http://127.0.0.1:{free_port()}/api/github/webhooks", WEBHOOK_SECRET)
    webhook.up = lambda: webhook.configure(stack["url"], WEBHOOK_SECRET)
    yield webhook
    webhook.wait_for_redeliveries()
    webhook.up()


def test_ten_deliveries_missed_while_the_app_was_down_are_each_reviewed_once(stack, hook, redis_client):
    state = stack["state"]
    repo, _name = new_repo(state, {})
    prs = [state.open_pull_request(repo, {f"train_{n}.py": FINDING}) for n in range(10)]
    hook.down()
    missed = [hook.deliver("pull_request", pull_request_payload("opened", pr)) for pr in prs]
    assert {(d.status, d.status_code) for d in missed} == {("failed to connect", 0)}
    hook.up()

    done = recover_cli(stack, "--since", "1h")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "10 redelivered" in done.stdout
    assert sorted(line.split()[1] for line in done.stdout.splitlines() if line.startswith("redelivered ")) == \
        sorted(d.guid for d in missed)
    hook.wait_for_redeliveries()
    for pr, delivery in zip(prs, missed):
        completed_run(state, pr.head_sha, timeout=120)
        attempts = hook.attempts_of(delivery.guid)
        assert [(a.redelivery, a.status_code) for a in attempts] == [(False, 0), (True, 202)]

    again = recover_cli(stack, "--since", "1h")  # every event has a successful attempt now
    assert again.returncode == 0 and "0 redelivered" in again.stdout, again.stdout + again.stderr
    assert all(len(hook.attempts_of(d.guid)) == 2 for d in missed)
    for pr in prs:
        assert len(reviews_of(state, pr)) == 1
        assert len(state.reviews_for(pr)) == 1


def test_recover_says_why_when_github_does_not_list_the_deliveries(stack):
    stack["state"].faults.fail("GET", "/app/hook/deliveries", status=502, body={"message": "Server Error"})
    done = recover_cli(stack, "--since", "2h")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "cannot list the App's webhook deliveries" in done.stderr and "502 Server Error" in done.stderr


def requester(stack):
    env = stack["env"]
    return GithubIntegration(base_url=env["GITHUB_API_URL"],
                             auth=Auth.AppAuth(int(env["GITHUB_APP_ID"]), env["GITHUB_PRIVATE_KEY"])).requester


def test_a_redelivery_on_its_way_or_an_event_already_taken_is_not_sent_again(stack, hook):
    from bot.store import make_store

    state = stack["state"]
    store = make_store(stack["env"]["REDIS_URL"], None)
    since = datetime.now(timezone.utc) - timedelta(minutes=5)
    repo, _name = new_repo(state, {})
    pr, taken_pr = (state.open_pull_request(repo, {f"m{n}.py": FINDING}) for n in range(2))
    hook.down()
    missed = hook.deliver("pull_request", pull_request_payload("opened", pr))
    # GitHub logged a failure (a timeout, say) but the App did take this one: it sent it itself, once
    taken = hook.deliver("pull_request", pull_request_payload("opened", taken_pr))
    hook.up()
    body = taken.body
    assert requests.post(stack["url"], data=body, headers=taken.request_headers, timeout=10).status_code == 202
    completed_run(state, taken_pr.head_sha, timeout=120)

    hook.down()  # the first redelivery fails too: the App is still down
    first = sweep(requester(stack), store, since)
    assert first.redelivered == [missed.guid] and first.processed == 1
    second = sweep(requester(stack), store, since)  # while the redelivery may still be on its way
    assert second.redelivered == [] and second.in_flight == 1 and second.processed == 1
    hook.wait_for_redeliveries()
    assert [a.status_code for a in hook.attempts_of(missed.guid)] == [0, 0]

    hook.up()
    store.release(f"torchreview:recover:redelivered:{missed.guid}")  # as REDELIVERY_GRACE lapsing does
    third = sweep(requester(stack), store, since)
    assert third.redelivered == [missed.guid]
    hook.wait_for_redeliveries()
    completed_run(state, pr.head_sha, timeout=120)
    # GitHub sending the same redelivery twice (or two sweeps racing): the webhook's dedupe answers the copy
    newest = hook.attempts_of(missed.guid)[-1]
    requester(stack).requestJsonAndCheck("POST", f"/app/hook/deliveries/{newest.id}/attempts")
    hook.wait_for_redeliveries()
    assert [a.status_code for a in hook.attempts_of(missed.guid)] == [0, 0, 202, 200]
    assert len(reviews_of(state, pr)) == 1 and len(reviews_of(state, taken_pr)) == 1
    assert len(hook.attempts_of(taken.guid)) == 1  # never redelivered
    assert state.contract_violations == []


def test_the_scheduled_sweep_runs_as_a_celery_task_in_the_worker(stack, hook):
    from bot.jobs import RECOVER_TASK, REVIEW_QUEUE, make_celery, recover_interval
    from bot.settings import Settings

    state = stack["state"]
    repo, _name = new_repo(state, {})
    pr = state.open_pull_request(repo, {"train.py": FINDING})
    hook.down()
    missed = hook.deliver("pull_request", pull_request_payload("opened", pr))
    hook.up()
    celery = make_celery(Settings.from_env(stack["env"], require_github=False, role="web"))
    schedule = celery.conf.beat_schedule["recover-webhook-deliveries"]
    assert schedule["task"] == RECOVER_TASK and schedule["schedule"] == recover_interval() == 600
    from bot.cli import build_parser, worker_command

    assert build_parser().parse_args(["worker", "--beat"]).beat  # compose's worker; serve's runs it too
    assert worker_command(2, "reviews", beat=True)[-2:] == ["--beat", "--scheduler=celery.beat:Scheduler"]
    assert "--beat" not in worker_command(2, "reviews")
    celery.send_task(RECOVER_TASK, queue=REVIEW_QUEUE)  # what beat sends
    completed_run(state, pr.head_sha, timeout=120)
    assert [a.redelivery for a in hook.attempts_of(missed.guid)] == [False, True]


@pytest.mark.parametrize("text, seconds", [("24h", 86400), ("90m", 5400), ("2d", 172800), ("1h30m", 5400),
                                           (" 45s ", 45), ("1w", None), ("4d", None), ("0h", None), ("", None),
                                           ("24", None), ("h", None), ("-2h", None), ("2 h", None), ("1.5h", None)])
def test_recover_since_takes_a_duration_within_what_github_keeps(text, seconds):
    if seconds is None:
        with pytest.raises(DurationError):
            parse_duration(text)
    else:
        assert parse_duration(text) == timedelta(seconds=seconds)


def test_recover_rejects_a_bad_duration_clearly_before_reading_any_setting(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "REDIS_"))}
    env["PYTHONPATH"] = str(ROOT)
    for since, says in (("soon", "is not a duration"), ("5d", "longer than GitHub keeps deliveries"),
                        ("0m", "must be longer than 0")):
        done = subprocess.run([sys.executable, "-m", "bot.cli", "recover", "--since", since], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and f"--since: '{since}'" in done.stderr and says in done.stderr, done.stderr
    done = subprocess.run([sys.executable, "-m", "bot.cli", "recover", "--since", "2h"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "GITHUB_APP_ID is not set" in done.stderr


def samples(text: str, name: str) -> dict[tuple, float]:
    return {tuple(sorted(s.labels.items())): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name}


@pytest.fixture
def own_emulator(app_key):
    """An emulator of its own: its delivery log holds only this test's events."""
    from github_emulator import EmulatorState, serve

    running = serve(EmulatorState(app_public_key_pem=app_key[1], app_id=4242))
    yield running
    running.state.app_webhook.wait_for_redeliveries()
    running.shutdown()


def test_one_machine_recovers_what_it_missed_while_down_on_its_own(own_emulator, app_key, tmp_path):
    """`torchreview serve` (embedded broker, no Redis) is down when the event happens; once up, its own
    beat sweeps, the review is posted, and the web's /metrics shows it (and what its workers counted)."""
    emulator = own_emulator
    state = emulator.state
    repo, _name = new_repo(state, {})
    pr = state.open_pull_request(repo, {"train.py": FINDING})
    port = free_port()
    webhook = state.app_webhook
    webhook.configure(f"http://127.0.0.1:{port}/api/github/webhooks", WEBHOOK_SECRET)
    missed = webhook.deliver("pull_request", pull_request_payload("opened", pr))
    assert missed.status == "failed to connect"

    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "PROMETHEUS_", "REDIS_"))}
    env.update({"GITHUB_APP_ID": "4242", "GITHUB_PRIVATE_KEY": app_key[0], "GITHUB_WEBHOOK_SECRET": WEBHOOK_SECRET,
                "GITHUB_API_URL": emulator.url, "TORCHREVIEW_DATA_DIR": str(tmp_path / "data"),
                "PYTHONPATH": str(ROOT), "TORCHREVIEW_GITHUB_WRITE_INTERVAL": "0", "LOG_LEVEL": "WARNING",
                "TORCHREVIEW_RECOVER_INTERVAL": "10"})
    with ProcessGroup([sys.executable, "-m", "bot.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                       "--concurrency", "1", "--web-workers", "1"], tmp_path / "serve.log", env=env, cwd=tmp_path,
                      grace=30) as serve:
        completed_run(state, pr.head_sha, timeout=120)
        webhook.wait_for_redeliveries()
        assert [(a.redelivery, a.status_code) for a in webhook.attempts_of(missed.guid)] == [(False, 0), (True, 202)]

        def scraped():
            scrape = answer(serve, f"http://127.0.0.1:{port}/metrics")
            return scrape.text if scrape and samples(scrape.text, "torchreview_reviews_total") else None

        text = wait_for(scraped, 60, "the review on the web's /metrics")
        assert samples(text, "torchreview_deliveries_recovered_total") == {(): 1}
        assert samples(text, "torchreview_delivery_sweep_last_success_timestamp_seconds")
        depth = samples(text, "torchreview_queue_depth")
        # the reviews queue may hold the sweep the beat sent a moment ago (every 10 s here)
        assert set(depth) == {(("queue", "reviews"),), (("queue", "gpu"),)} and depth[(("queue", "gpu"),)] == 0
        assert depth[(("queue", "reviews"),)] <= 1
        assert samples(text, "torchreview_queue_depth_up") == {(): 1}
        # counted in the embedded workers, shown by the web
        assert samples(text, "torchreview_reviews_total") == {(("outcome", "done"),): 1}
        assert samples(text, "torchreview_github_responses_total")[(("status", "201"),)] >= 2
        assert 0 < samples(text, "torchreview_github_rate_limit_remaining")[(("resource", "core"),)] <= 5000
        assert len(reviews_of(state, pr)) == 1


def test_the_emulator_logs_and_serves_the_apps_deliveries_as_github_describes_them(app_key):
    """Every response checked against the OpenAPI description: the cursor pages, one delivery in full,
    a redelivery, GitHub's status classes, and the errors."""
    from github_emulator import EmulatorState, serve

    with serve(EmulatorState(app_public_key_pem=app_key[1], app_id=4242), check_responses=True) as emulator:
        state = emulator.state
        repo, _name = new_repo(state, {})
        pr = state.open_pull_request(repo, {"train.py": FINDING})
        webhook = state.app_webhook
        with pytest.raises(RuntimeError, match="not configured"):
            webhook.deliver("pull_request", pull_request_payload("opened", pr))
        webhook.configure(f"http://127.0.0.1:{free_port()}/hook", WEBHOOK_SECRET)
        sent = [webhook.deliver("pull_request", pull_request_payload("opened", pr)) for _ in range(5)]
        gh = GithubIntegration(base_url=emulator.url, auth=Auth.AppAuth(4242, app_key[0]))
        listed = list(attempts_since(gh.requester, datetime.now(timezone.utc) - timedelta(hours=1), per_page=2))
        assert [a.id for a in listed] == [d.id for d in reversed(sent)]  # newest first, over three pages
        pages = [r for r in state.requests if r.path == "/app/hook/deliveries"]
        assert len(pages) == 3 and pages[1].query["cursor"] == f"v1_{sent[3].id}"
        assert {(a.status, a.status_code, a.event, a.action, a.redelivery) for a in listed} == \
            {("failed to connect", 0, "pull_request", "opened", False)}
        _headers, full = gh.requester.requestJsonAndCheck("GET", f"/app/hook/deliveries/{sent[0].id}")
        assert full["guid"] == sent[0].guid and full["request"]["payload"]["pull_request"]["number"] == pr.number
        assert full["request"]["headers"]["X-GitHub-Delivery"] == sent[0].guid and full["response"]["payload"] is None

        _headers, accepted = gh.requester.requestJsonAndCheck("POST", f"/app/hook/deliveries/{sent[0].id}/attempts")
        assert accepted == {}
        webhook.wait_for_redeliveries()
        again = webhook.attempts_of(sent[0].guid)
        assert [(a.redelivery, a.body == sent[0].body) for a in again] == [(False, True), (True, True)]
        # GitHub's classes: "failure" is a 4xx/5xx answer, so an attempt that got none is in neither
        _headers, failures = gh.requester.requestJsonAndCheck("GET", "/app/hook/deliveries", {"status": "failure"})
        assert failures == []
        for path, status in ((f"/app/hook/deliveries/{sent[-1].id + 1000}", 404),
                             ("/app/hook/deliveries?cursor=nope", 400),
                             (f"/app/hook/deliveries/{sent[0].id + 1000}/attempts", 404)):
            method = "POST" if path.endswith("attempts") else "GET"
            response = requests.request(method, emulator.url + path, timeout=10,
                                        headers={"Authorization": f"Bearer {gh.auth.token}"})
            assert response.status_code == status, path
        assert requests.get(emulator.url + "/app/hook/deliveries", timeout=10).status_code == 401  # the App's JWT only
        assert emulator.app.config["RESPONSE_PROBLEMS"] == [] and state.contract_violations == []


def test_the_deployments_sweep_compose_in_its_worker_kubernetes_in_a_cronjob():
    import yaml

    from bot.cli import build_parser

    kubernetes = ROOT / "deploy" / "kubernetes"
    (cronjob,) = [d for d in yaml.safe_load_all((kubernetes / "recover-cronjob.yaml").read_text()) if d]
    assert "recover-cronjob.yaml" in (kubernetes / "kustomization.yaml").read_text()
    assert cronjob["kind"] == "CronJob" and cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "recover" and parse_duration(args.since) >= timedelta(minutes=20)
    env = {e["name"] for e in container["env"]}
    assert "GITHUB_PRIVATE_KEY_PATH" in env and "GITHUB_WEBHOOK_SECRET" not in env
    assert container["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    services = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())["services"]
    assert build_parser().parse_args(services["worker"]["command"]).beat
