"""A load and fault storm for the App, on real parts, and the checks that nothing was lost or done twice.

Real parts only: a private redis-server (with the persistence settings of deploy/), ``torchreview serve``
under gunicorn, N ``torchreview worker`` processes (Celery), and the GitHub emulator, which validates every
request against GitHub's OpenAPI description, in a process of its own. The harness:

1. builds a world of installations, repositories and pull requests, and plans a burst of signed deliveries:
   ``opened``, rapid ``synchronize`` pushes to the same PR, ``/review`` comments from writers and from
   outsiders, redeliveries of an earlier ``X-GitHub-Delivery`` (the same bytes), check-run re-requests;
2. sends them open loop on schedule, while GitHub answers a share of all calls with 502 and another with a
   secondary rate limit (``Retry-After``), a worker is SIGKILLed every ``--kill-every`` seconds (and
   replaced), Redis is restarted once and one gunicorn worker is killed; a delivery that is not acknowledged
   is delivered again a little later, as an operator's "redeliver failed deliveries" would;
3. waits until the queues drain, then checks: one completed ``torchreview`` run per trigger on every PR's
   latest head, one review per head, no inline comment twice (by fingerprint), runs of superseded heads
   neutral, every writer's ``/review`` answered once, at most 80 content-creating requests per installation in
   any 60 s, nothing queued or locked, no request outside GitHub's OpenAPI description;
4. prints the figures: deliveries/s accepted, webhook ack p50/p99, delivery -> check run completed
   p50/p95/p99, GitHub calls per review, retries, jobs redelivered after a kill.

    python bench/load.py                         # the full storm (1,000 deliveries, 200 PRs, 20 installations)
    python bench/load.py --workers 1,2,4         # the same storm once per worker count, and a table
    python bench/load.py --ack-rates 100,200,300 # the webhook alone, open loop, at these rates

``tests/test_load_harness.py`` runs the same code, scaled down.
"""
from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import requests

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bot.settings import DEFAULT_WEBHOOK_PATH  # noqa: E402
from github_emulator.local import ProcessGroup  # noqa: E402

SECRET = "load-harness-webhook-secret-4f1c9a"
APP_ID = 4242
WRITER, OUTSIDER = "maintainer", "passer-by"
CHECK_NAME = "torchreview"
WRITES_PER_MINUTE = 80  # GitHub's secondary limit on content-creating requests, per installation
# The Redis persistence of deploy/docker-compose.yml and deploy/kubernetes/redis.yaml (a test keeps them equal):
# every write is in the append-only file within a second, and a restart replays it.
REDIS_PERSISTENCE = ("--appendonly", "yes", "--appendfsync", "everysec")
BASE_TRAIN = "import torch\n\n\ndef load(path):\n    return torch.load(path, weights_only=True)\n"


def train_py(push: int) -> str:
    """The PR's train.py after ``push`` pushes: each push adds an unsafe load (a new finding, so every head
    needs a review) and drops the one from two pushes ago (its thread gets resolved)."""
    text = BASE_TRAIN
    for k in (push - 1, push):
        if k >= 0:
            text += f"\n\ndef resume_{k}(path):\n    state_{k} = torch.load(path + '.{k}')\n    return state_{k}\n"
    return text


@dataclass
class Storm:
    deliveries: int = 1000
    pull_requests: int = 200
    installations: int = 20
    workers: int = 2  # `torchreview worker` processes
    concurrency: int = 1  # review jobs at once per worker
    web_workers: int = 2  # gunicorn processes
    burst_seconds: float = 50.0  # the deliveries' send times spread over this
    error_rate: float = 0.05  # share of GitHub calls answered 502
    rate_limit_rate: float = 0.02  # share answered 403 secondary rate limit
    retry_after: int = 2
    kill_every: float = 20.0  # SIGKILL a worker this often during the burst (0: never)
    redis_restarts: int = 1
    web_kills: int = 1
    visibility_timeout: int = 30  # seconds before a dead worker's job is delivered again
    write_interval: float = 0.0  # PyGithub's pause between writes (production default 1 s)
    drain_timeout: float = 900.0
    seed: int = 16


# ---- the world and the plan (built in the emulator process) --------------------------------------------


def build_world(state, storm: Storm) -> dict:
    """Installations, repositories, PRs with every push precomputed, and the delivery plan (plain data)."""
    from github_emulator.webhooks import issue_comment_payload, pull_request_payload, real_payload

    rng = random.Random(storm.seed)
    prs = []
    repos_per_installation = max(1, storm.pull_requests // storm.installations // 2)
    repos = []
    for i in range(storm.installations):
        state.add_installation(f"org-{i:02d}", installation_id=i + 1)
        for r in range(repos_per_installation):
            repo = state.add_repo(f"org-{i:02d}/models-{r}", files={"README.md": "# models\n", "train.py": BASE_TRAIN,
                                                                       # TR601 is a preview rule: opted into
                                                                       ".github/torchreview.yml": "preview: true\n"})
            state.add_collaborator(repo, WRITER, "maintain")
            repos.append((repo, i + 1))
    for n in range(storm.pull_requests):
        repo, installation = repos[n % len(repos)]
        pr = state.open_pull_request(repo, {"train.py": train_py(0)}, user="contributor", head=f"feature-{n}")
        prs.append({"pr": pr, "installation": installation, "heads": [pr.head_sha]})

    # Times: each PR opens in the first 40 % of the burst; everything else for it comes after.
    burst = storm.burst_seconds
    opened_at = [rng.uniform(0, 0.4 * burst) for _ in prs]
    planned: list[dict] = [{"at": opened_at[n], "kind": "opened", "pr": n} for n in range(len(prs))]
    kinds = ["synchronize", "redelivery", "command", "rerequest"]
    weights = [0.45, 0.2, 0.2, 0.15]
    while len(planned) < storm.deliveries:
        kind = rng.choices(kinds, weights)[0]
        n = rng.randrange(len(prs))
        at = rng.uniform(opened_at[n] + 0.2, burst)
        if kind == "synchronize":  # a few rapid pushes to the same PR
            for m in range(min(rng.randint(2, 4), storm.deliveries - len(planned))):
                planned.append({"at": at + m * rng.uniform(0.05, 0.4), "kind": kind, "pr": n})
        else:
            planned.append({"at": at, "kind": kind, "pr": n})
    planned.sort(key=lambda d: d["at"])

    deliveries = []
    pushes = [0] * len(prs)
    for d in planned:
        entry = prs[d["pr"]]
        pr = entry["pr"]
        head = entry["heads"][pushes[d["pr"]]]  # the head when this delivery is sent
        out = {"at": d["at"], "kind": d["kind"], "pr": d["pr"], "delivery": str(uuid.UUID(int=rng.getrandbits(128)))}
        if d["kind"] in ("opened", "synchronize"):
            if d["kind"] == "synchronize":
                pushes[d["pr"]] += 1
                head = state.commit(pr.head_repo, {"train.py": train_py(pushes[d["pr"]])}, parent=head,
                                    message=f"push {pushes[d['pr']]}", author=pr.user.login)
                entry["heads"].append(head)
            payload = pull_request_payload(d["kind"], pr, installation_id=entry["installation"])
            payload["pull_request"]["head"]["sha"] = head
            out.update(event="pull_request", payload=payload, head=head, push=pushes[d["pr"]])
        elif d["kind"] == "command":
            writer = rng.random() < 0.8
            body = "/review help" if writer and rng.random() < 0.25 else "/review"
            payload = issue_comment_payload(state, pr, body, user=WRITER if writer else OUTSIDER,
                                            installation_id=entry["installation"],
                                            author_association="MEMBER" if writer else "NONE")
            out.update(event="issue_comment", payload=payload, writer=writer, command=body,
                       comment_id=payload["comment"]["id"])
        elif d["kind"] == "rerequest":
            payload = real_payload("check_run.rerequested")
            _point_at(payload, pr.repo.full_name, entry["installation"])
            run = payload["check_run"]
            run.update(name=CHECK_NAME, head_sha=head, external_id="")
            run["app"]["id"] = APP_ID
            run["pull_requests"] = [{"url": f"https://api.github.com/repos/{pr.repo.full_name}/pulls/{pr.number}",
                                     "id": pr.id, "number": pr.number,
                                     "head": {"ref": pr.head_ref, "sha": head, "repo": payload["repository"]},
                                     "base": {"ref": pr.base_ref, "sha": pr.base_sha, "repo": payload["repository"]}}]
            payload["sender"]["login"] = WRITER
            out.update(event="check_run", payload=payload, head=head)
        else:  # the same delivery (id and bytes) as an earlier one
            earlier = [o for o in deliveries if o["kind"] != "redelivery"]
            if not earlier:
                continue
            original = rng.randrange(len(deliveries))
            while deliveries[original]["kind"] == "redelivery":
                original = rng.randrange(len(deliveries))
            out.update(original=original, pr=deliveries[original]["pr"])
        deliveries.append(out)
    for entry in prs:  # the world starts with every PR at its first head; pushes land during the storm
        entry["pr"].head_sha = entry["heads"][0]
        entry["pr"].head_repo.branches[entry["pr"].head_ref] = entry["heads"][0]
    return {"prs": [{"repo": e["pr"].repo.full_name, "number": e["pr"].number, "installation": e["installation"],
                     "heads": e["heads"]} for e in prs],
            "deliveries": deliveries}


def _point_at(data: dict, full_name: str, installation_id: int) -> None:
    owner, name = full_name.split("/")
    data["repository"].update(full_name=full_name, name=name)
    data["repository"]["owner"]["login"] = owner
    data.setdefault("installation", {})["id"] = installation_id


# ---- the emulator process -------------------------------------------------------------------------------


FINGERPRINT = re.compile(r"torchreview:fingerprint=([0-9a-f]+)")


def snapshot(state, world: dict, landed: dict) -> dict:
    """What GitHub holds after the storm, as plain data for the checks."""
    with state.lock:
        prs = []
        for n, entry in enumerate(world["prs"]):
            pr = state.pull(entry["repo"], entry["number"])
            heads = entry["heads"]
            runs = [r for sha in heads for r in state.check_runs_for(sha, name=CHECK_NAME)]
            bot = state.app.bot
            prs.append({
                "head": pr.head_sha,
                "heads": heads,
                "landed": landed.get(n, {}),  # head -> wall time its push landed
                "runs": [{"id": r.id, "head": r.head_sha, "status": r.status, "conclusion": r.conclusion,
                          "external_id": r.external_id} for r in runs],
                "reviews": [{"id": r.id, "commit": r.commit_id} for r in state.reviews_for(pr) if r.user is bot],
                "fingerprints": [m.group(1) for c in state.review_comments_for(pr)
                                 if c.user is bot and c.in_reply_to_id is None
                                 for m in [FINGERPRINT.search(c.body)] if m],
                "comments": [{"id": c.id, "user": c.user.login, "body": c.body,
                              "reactions": [(x.user.login, x.content) for x in c.reactions]}
                             for c in state.issue_comments_for(pr)],
            })
        requests_ = [(r.at, r.method, r.path, r.status, r.installation_id, _creates_content(r),
                      (r.body or {}).get("status") if isinstance(r.body, dict) else None, r.user_agent)
                     for r in state.requests]
        return {"prs": prs, "requests": requests_, "violations": list(state.contract_violations),
                "faults": {f.status: f.hits for f in state.faults.pending}}  # injected: 502s, 403 rate limits


def _creates_content(recorded) -> bool:
    """GitHub's content-creating requests: writes; of GraphQL, only mutations."""
    if recorded.method not in ("POST", "PATCH", "PUT", "DELETE"):
        return False
    if recorded.path == "/graphql":
        return str((recorded.body or {}).get("query", "")).lstrip().startswith("mutation")
    return not recorded.path.startswith("/app/")  # installation tokens are the App's, not content


def emulator_child(address: str, authkey: bytes) -> None:
    """The emulator process: builds the world, serves it, and answers the harness (push, faults, snapshot)."""
    from multiprocessing.connection import Client

    from github_emulator import EmulatorState, serve

    conn = Client(address, authkey=authkey)
    fields_, public_key = conn.recv()
    storm = Storm(**fields_)
    state = EmulatorState(app_public_key_pem=public_key, app_id=APP_ID)
    world = build_world(state, storm)
    state.faults.seed(storm.seed)
    running = serve(state)
    conn.send((running.url, world))
    landed: dict[int, dict[str, float]] = defaultdict(dict)
    while True:
        command, *args = conn.recv()
        if command == "push":  # the push lands: the PR's head moves, as `git push` does
            n, push = args
            entry = world["prs"][n]
            with state.lock:
                pr = state.pull(entry["repo"], entry["number"])
                pr.head_sha = entry["heads"][push]
                pr.head_repo.branches[pr.head_ref] = pr.head_sha
                pr.updated_at = datetime.now(timezone.utc).replace(microsecond=0)
                landed[n][pr.head_sha] = time.time()
                conn.send(pr.updated_at.strftime("%Y-%m-%dT%H:%M:%SZ"))
        elif command == "faults":
            error_rate, rate_limit_rate, retry_after = args
            state.faults.clear()
            if error_rate:
                state.faults.fail(status=502, times=None, rate=error_rate)
            if rate_limit_rate:
                state.faults.secondary_rate_limit(times=None, rate=rate_limit_rate, retry_after=retry_after)
            conn.send(None)
        elif command == "requests":
            conn.send(len(state.requests))
        elif command == "snapshot":
            conn.send(snapshot(state, world, landed))
        elif command == "stop":
            running.shutdown()
            conn.send(None)
            return


class EmulatorProcess:
    """The emulator in a process of its own (its CPU work must not share the driver's interpreter lock)."""

    def __init__(self, storm: Storm, public_key: bytes, workdir: Path) -> None:
        from multiprocessing.connection import Listener

        authkey = secrets.token_bytes(16)
        self._listener = Listener(("127.0.0.1", 0), authkey=authkey)
        host, port = self._listener.address
        self.log = open(workdir / "emulator.log", "w")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--emulator-child",
                                      f"{host}:{port}", authkey.hex()], cwd=ROOT, stdout=self.log,
                                     stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        self._conn = self._listener.accept()
        self._lock = threading.Lock()
        self._conn.send((asdict(storm), public_key))  # plain data: the harness may be loaded under another name
        self.url, self.world = self._conn.recv()

    def call(self, command: str, *args):
        with self._lock:
            self._conn.send((command, *args))
            return self._conn.recv()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("stop")
            except (EOFError, OSError):
                pass
            self.proc.wait(timeout=30)
        self._listener.close()
        self.log.close()


# ---- the App's processes -------------------------------------------------------------------------------


def redis_command(port: int, workdir: Path) -> list[str]:
    return [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", "127.0.0.1",
            "--dir", str(workdir), "--save", "", *REDIS_PERSISTENCE]


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        from github_emulator.local import free_port

        self.port, self.workdir = free_port(), workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: Optional[subprocess.Popen] = None
        self.start()

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(redis_command(self.port, self.workdir), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        _wait(lambda: _pings(client), 20, "redis-server", interval=0.02)

    def restart(self) -> float:
        """A deploy's restart (SIGTERM: Redis flushes its append-only file, then exits); the seconds it was away."""
        started = time.perf_counter()
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.start()
        return time.perf_counter() - started

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def _pings(client) -> bool:
    import redis

    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def _wait(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    from github_emulator.local import wait_until

    return wait_until(predicate, timeout, what, interval=interval)


class Web:
    """``torchreview serve`` (gunicorn, gthread workers) on a free port."""

    def __init__(self, env: dict, workers: int, workdir: Path) -> None:
        from bot.cli import web_command
        from github_emulator.local import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{DEFAULT_WEBHOOK_PATH}"
        self.log = open(workdir / "web.log", "w")
        self.proc = subprocess.Popen(web_command("127.0.0.1", self.port, workers), env=env, cwd=ROOT,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.workers = workers
        _wait(lambda: len(self.children()) >= workers and _healthy(f"http://127.0.0.1:{self.port}/healthz"),
              60, "gunicorn")

    def children(self) -> list[int]:
        try:
            return [int(p) for p in Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()]
        except OSError:
            return []

    def kill_one_worker(self) -> int:
        """SIGKILL one gunicorn worker (the master starts another); its pid."""
        victim = self.children()[0]
        os.kill(victim, signal.SIGKILL)
        return victim

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def _healthy(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


class Worker(ProcessGroup):
    """One ``torchreview worker`` (Celery main process and its pool), in a session of its own."""

    def __init__(self, env: dict, concurrency: int, log_path: Path) -> None:
        from bot.cli import worker_command

        super().__init__(worker_command(concurrency, "reviews"), log_path, env=env, cwd=ROOT, grace=30)


# ---- driving ---------------------------------------------------------------------------------------------


@dataclass
class Attempt:
    index: int  # in the plan
    sent: float  # wall clock
    latency: float  # seconds, at the client
    status: int  # 0: no answer (connection reset)


@dataclass
class Outcome:
    storm: Storm
    attempts: list[Attempt]
    accepted: dict[int, float]  # plan index -> wall time of its first 2xx
    first_sent: dict[int, float]
    events: list[tuple[float, str]]  # (wall time, fault injected)
    snapshot: dict
    leftovers: dict
    drain_seconds: float
    logs: str
    world: dict
    burst_started: float


class Driver:
    """Sends the plan open loop; an unacknowledged delivery is sent again (same id, same bytes) later."""

    def __init__(self, url: str, emulator: EmulatorProcess, redeliver_after: float = 2.0,
                 give_up_after: float = 180.0) -> None:
        # Redelivered until ``give_up_after`` seconds after its first send, not a number of times: how long
        # the web is down (a restart under load) is what a redelivering sender has to outlast.
        self.url, self.emulator, self.redeliver_after = url, emulator, redeliver_after
        self.give_up_after = give_up_after
        self.world = emulator.world
        self.plan = self.world["deliveries"]
        self.signed: dict[int, tuple[bytes, dict]] = {}
        self.ready = {i: threading.Event() for i in range(len(self.plan))}
        self.attempts: list[Attempt] = []
        self.accepted: dict[int, float] = {}
        self.first_sent: dict[int, float] = {}
        self.pending = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=48)
        self._timers: list[threading.Timer] = []

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def _sign(self, index: int) -> tuple[bytes, dict]:
        from github_emulator.webhooks import signed_delivery

        d = self.plan[index]
        if "original" in d:
            self.ready[d["original"]].wait()
            return self.signed[d["original"]]
        payload = d["payload"]
        if d["kind"] == "synchronize":  # the push lands first, then GitHub tells us
            updated_at = self.emulator.call("push", d["pr"], d["push"])
            payload = {**payload, "pull_request": {**payload["pull_request"], "updated_at": updated_at}}
        body, headers = signed_delivery(d["event"], payload, SECRET, d["delivery"])
        self.signed[index] = (body, headers)
        self.ready[index].set()
        return body, headers

    def send(self, index: int, attempt: int = 0) -> None:
        try:
            body, headers = self.signed.get(index) or self._sign(index)
            sent = time.time()
            started = time.perf_counter()
            try:
                status = self._session().post(self.url, data=body, headers=headers, timeout=30).status_code
            except requests.RequestException:
                status = 0
                self._local.session = None  # a reset connection: start a new one
            latency = time.perf_counter() - started
            with self._lock:
                self.attempts.append(Attempt(index, sent, latency, status))
                self.first_sent.setdefault(index, sent)
                if 200 <= status < 300:
                    self.accepted.setdefault(index, sent + latency)
                elif time.time() - self.first_sent[index] < self.give_up_after:
                    self.pending += 1
                    timer = threading.Timer(self.redeliver_after, self._resend, (index, attempt + 1))
                    timer.daemon = True
                    self._timers.append(timer)
                    timer.start()
        finally:
            with self._lock:
                self.pending -= 1
                self._idle.notify_all()

    def _resend(self, index: int, attempt: int) -> None:
        self._pool.submit(self.send, index, attempt)

    def run(self, started: float) -> None:
        """Send every delivery at its time (``started`` + its offset), then wait for every answer."""
        for index, d in enumerate(self.plan):
            delay = started + d["at"] - time.time()
            if delay > 0:
                time.sleep(delay)  # the schedule itself: an open-loop client sends on time, not on answers
            with self._lock:
                self.pending += 1
            self._pool.submit(self.send, index)
        with self._idle:
            self._idle.wait_for(lambda: self.pending == 0)
        self._pool.shutdown(wait=True)


class Chaos:
    """The faults on a timeline: worker kills every ``kill_every`` s, one Redis restart, one gunicorn kill."""

    def __init__(self, storm: Storm, redis_server: RedisServer, web: Web, workers: list, spawn_worker) -> None:
        self.storm, self.redis, self.web, self.workers, self.spawn_worker = storm, redis_server, web, workers, spawn_worker
        self.events: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def timeline(self) -> list[tuple[float, str]]:
        burst = self.storm.burst_seconds
        plan = []
        if self.storm.kill_every > 0:
            at = min(self.storm.kill_every, burst / 2)
            while at < burst:
                plan.append((at, "kill-worker"))
                at += self.storm.kill_every
        for k in range(self.storm.redis_restarts):
            plan.append((burst * (0.4 + 0.3 * k), "restart-redis"))
        for k in range(self.storm.web_kills):
            plan.append((burst * (0.6 + 0.2 * k), "kill-web-worker"))
        return sorted(plan)

    def start(self, started: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()

    def _run(self, started: float) -> None:
        kills = 0
        for at, action in self.timeline():
            if self._stop.wait(max(0.0, started + at - time.time())):
                return
            if action == "kill-worker":
                victim = self.workers[kills % len(self.workers)]
                victim.kill()
                self.workers[self.workers.index(victim)] = self.spawn_worker()
                kills += 1
                self.events.append((time.time(), "worker SIGKILLed and replaced"))
            elif action == "restart-redis":
                away = self.redis.restart()
                self.events.append((time.time(), f"redis restarted ({away * 1000:.0f} ms away)"))
            else:
                pid = self.web.kill_one_worker()
                self.events.append((time.time(), f"gunicorn worker {pid} SIGKILLed"))

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def stop(self) -> None:
        self._stop.set()
        self.join()


QUEUES = ("reviews", "gpu")


def queue_state(client) -> dict:
    """What is still queued, held unacknowledged (running or waiting for a retry's countdown) or locked."""
    index = client.zrange("unacked_index", 0, -1, withscores=True)
    return {
        "oldest_unacked_s": round(time.time() - min((score for _, score in index), default=time.time()), 1),
        "restore_mutex_ttl": client.ttl("unacked_mutex"),
        "queued": sum(client.llen(q) for q in QUEUES),
        "unacked": client.hlen("unacked"),
        "locks": sorted(k.decode() for k in client.scan_iter("torchreview:lock:*")),
    }


def drained(client, settle: int = 3) -> Callable[[], bool]:
    """True once nothing is queued or held for ``settle`` polls in a row."""
    quiet = [0]

    def check() -> bool:
        import redis

        try:
            state = queue_state(client)
        except redis.ConnectionError:
            quiet[0] = 0
            return False
        quiet[0] = quiet[0] + 1 if state["queued"] == 0 and state["unacked"] == 0 else 0
        return quiet[0] >= settle

    return check


def run_storm(storm: Storm, workdir: Optional[Path] = None, progress: Callable[[str], None] = lambda _: None) -> Outcome:
    """Start everything, run the storm, drain, stop everything; what happened."""
    import redis

    from github_emulator import generate_app_key

    owned = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="torchreview-load-")) if owned else workdir
    workdir.mkdir(parents=True, exist_ok=True)
    private, public = generate_app_key()
    stack: list = []
    try:
        redis_server = RedisServer(workdir)
        stack.append(redis_server)
        emulator = EmulatorProcess(storm, public, workdir)
        stack.append(emulator)
        env = {**os.environ, "REDIS_URL": redis_server.url, "GITHUB_APP_ID": str(APP_ID), "GITHUB_PRIVATE_KEY": private,
               "GITHUB_WEBHOOK_SECRET": SECRET, "GITHUB_API_URL": emulator.url, "TORCHREVIEW_DATA_DIR": str(workdir),
               "TORCHREVIEW_GITHUB_WRITE_INTERVAL": str(storm.write_interval),
               "TORCHREVIEW_VISIBILITY_TIMEOUT": str(storm.visibility_timeout),
               "TORCHREVIEW_WORKER_METRICS_PORT": "0", "PYTHONPATH": str(ROOT), "LOG_LEVEL": "INFO"}
        web = Web(env, storm.web_workers, workdir)
        stack.append(web)
        serial = iter(range(10_000))

        def spawn_worker() -> Worker:
            worker = Worker(env, storm.concurrency, workdir / f"worker-{next(serial):03d}.log")
            stack.append(worker)
            return worker

        workers = [spawn_worker() for _ in range(storm.workers)]
        client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
        progress(f"world: {len(emulator.world['prs'])} PRs, {len(emulator.world['deliveries'])} deliveries planned")
        emulator.call("faults", storm.error_rate, storm.rate_limit_rate, storm.retry_after)
        driver = Driver(web.url, emulator)
        chaos = Chaos(storm, redis_server, web, workers, spawn_worker)
        started = time.time() + 0.5
        chaos.start(started)
        driver.run(started)
        chaos.join()
        progress(f"burst sent in {time.time() - started:.1f}s; draining")
        drain_started = time.time()
        try:
            _wait(drained(client), storm.drain_timeout, "the queues to drain", interval=0.5)
        except TimeoutError:  # the checks say what is left; this says which jobs
            progress(f"not drained after {storm.drain_timeout:.0f}s: {queue_state(client)}")
            for raw in client.hvals("unacked"):
                message = json.loads(raw)[0]
                progress(f"   held: {message['headers'].get('id')} eta {message['headers'].get('eta')} "
                         f"retries {message['headers'].get('retries')} redelivered {message['headers'].get('redelivered')}")
        drain_seconds = time.time() - drain_started
        progress(f"drained in {drain_seconds:.1f}s")
        leftovers = queue_state(client)
        shot = emulator.call("snapshot")
        for worker in workers:
            worker.stop()
        logs = "".join(p.read_text(errors="replace") for p in sorted(workdir.glob("worker-*.log")))
        return Outcome(storm, driver.attempts, driver.accepted, driver.first_sent, chaos.events, shot, leftovers,
                       drain_seconds, logs, emulator.world, started)
    finally:
        for part in reversed(stack):
            try:
                part.stop()
            except Exception:  # noqa: BLE001 - tear down the rest regardless
                pass
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)


# ---- the checks -----------------------------------------------------------------------------------------


def check(outcome: Outcome) -> list[str]:
    """Every broken promise, one line each (empty: the App held)."""
    problems: list[str] = []
    plan = outcome.world["deliveries"]
    shot = outcome.snapshot
    explicit = {d["delivery"] for d in plan if d["kind"] == "rerequest" or (d["kind"] == "command" and d["writer"])}
    never_accepted = [i for i in range(len(plan)) if i not in outcome.accepted]
    if never_accepted:
        statuses = [a.status for a in outcome.attempts if a.index == never_accepted[0]]
        problems.append(f"{len(never_accepted)} deliveries were never acknowledged (e.g. plan #{never_accepted[0]}, "
                        f"answered {statuses or 'nothing'}; 0: no answer)")

    completions: dict[int, tuple[float, str]] = {}  # check run id -> (time, client) of its last completing request
    head_reads: dict[tuple[str, str], list[float]] = defaultdict(list)  # (client, PR path) -> when it read the PR
    for at, method, path, status, _inst, _creates, body_status, agent in shot["requests"]:
        if method == "PATCH" and "/check-runs/" in path and status == 200 and body_status == "completed":
            completions[int(path.rsplit("/", 1)[1])] = (at, agent)
        elif method == "GET" and status == 200 and PULL_PATH.fullmatch(path):
            head_reads[(agent, path)].append(at)

    for n, pr in enumerate(shot["prs"]):
        name = f"{outcome.world['prs'][n]['repo']}#{outcome.world['prs'][n]['number']}"
        latest = pr["head"]
        runs_by_head = defaultdict(list)
        for run in pr["runs"]:
            runs_by_head[run["head"]].append(run)
        latest_runs = runs_by_head.get(latest, [])
        if not latest_runs:
            problems.append(f"{name}: no torchreview check run on its latest head {latest[:7]}")
        elif any(r["status"] != "completed" for r in latest_runs):
            problems.append(f"{name}: a check run on the latest head {latest[:7]} is not completed")
        elif max(latest_runs, key=lambda r: r["id"])["conclusion"] not in ("success", "failure"):
            problems.append(f"{name}: the latest head's newest run concluded "
                            f"{max(latest_runs, key=lambda r: r['id'])['conclusion']}")
        for head, runs in runs_by_head.items():
            triggers = Counter(r["external_id"] for r in runs)
            twice = [t for t, c in triggers.items() if c > 1]
            if twice:
                problems.append(f"{name}: {len(runs)} runs on {head[:7]}, {len(twice)} trigger(s) with more than one")
            automatic = [r for r in runs if r["external_id"] not in explicit]
            if len(automatic) > 1:
                problems.append(f"{name}: {len(automatic)} automatic check runs on {head[:7]} (one expected)")
            if head == latest:
                continue
            superseded_at = _superseded_at(pr, head)
            for run in runs:
                if run["status"] != "completed":
                    problems.append(f"{name}: run {run['id']} on superseded head {head[:7]} left {run['status']}")
                elif run["conclusion"] != "neutral" and run["id"] in completions:
                    late = _judged_a_stale_head(completions[run["id"]], head_reads, pull_path(outcome.world, n),
                                                superseded_at)
                    if late:
                        problems.append(f"{name}: run {run['id']} on superseded head {head[:7]} completed "
                                        f"{run['conclusion']} after the push that superseded it ({late})")
        reviews = Counter(r["commit"] for r in pr["reviews"])
        for commit, count in reviews.items():
            if count > 1:
                problems.append(f"{name}: {count} reviews on {commit[:7]}")
        if reviews.get(latest, 0) != 1:
            problems.append(f"{name}: {reviews.get(latest, 0)} reviews on the latest head {latest[:7]} (it adds a "
                            "finding, so one is needed)")
        duplicated = [f for f, c in Counter(pr["fingerprints"]).items() if c > 1]
        if duplicated:
            problems.append(f"{name}: {len(duplicated)} inline comment(s) posted twice (fingerprint {duplicated[0][:8]})")

    runs_by_trigger = defaultdict(list)
    for pr in shot["prs"]:
        for run in pr["runs"]:
            runs_by_trigger[run["external_id"]].append(run)
    for d in plan:
        if d["kind"] != "command":
            continue
        pr = shot["prs"][d["pr"]]
        comment = next((c for c in pr["comments"] if c["id"] == d["comment_id"]), None)
        bot = [content for user, content in (comment or {}).get("reactions", []) if user.endswith("[bot]")]
        replies = [c for c in pr["comments"] if f"reply-key command-{d['comment_id']} " in c["body"]]
        where = f"/review comment {d['comment_id']} ({'writer' if d['writer'] else 'outsider'})"
        if d["writer"]:
            if bot.count("eyes") != 1:
                problems.append(f"{where}: {bot.count('eyes')} acknowledgements")
            if d["command"] == "/review help":
                answers = len(replies)
            else:  # a review of the PR's head then; a head pushed meanwhile closes its run neutral
                runs = runs_by_trigger.get(d["delivery"], [])
                answers = max(1, sum(1 for r in runs if r["conclusion"] != "neutral")) if runs else 0
            if answers != 1:
                problems.append(f"{where}: answered {answers} times")
        elif "eyes" in bot or replies or runs_by_trigger.get(d["delivery"]):
            problems.append(f"{where}: an outsider's command was acted on")

    by_installation = defaultdict(list)
    for at, _m, _p, _s, installation, creates, *_ in shot["requests"]:
        if creates and installation is not None:
            by_installation[installation].append(at)
    for installation, times in sorted(by_installation.items()):
        peak = max_in_window(times, 60.0)
        if peak > WRITES_PER_MINUTE:
            problems.append(f"installation {installation}: {peak} content-creating requests within 60 s "
                            f"(GitHub's secondary limit is {WRITES_PER_MINUTE})")

    left = outcome.leftovers
    if left["queued"] or left["unacked"]:
        problems.append(f"left behind: {left['queued']} queued, {left['unacked']} unacknowledged jobs")
    if left["locks"]:
        problems.append(f"left locked: {', '.join(left['locks'][:5])}")
    if shot["violations"]:
        v = shot["violations"][0]
        problems.append(f"{len(shot['violations'])} requests outside GitHub's OpenAPI description, e.g. "
                        f"{v['method']} {v['path']}: {v['errors']}")
    return problems


PULL_PATH = re.compile(r"/repos/[^/]+/[^/]+/pulls/\d+")


def pull_path(world: dict, n: int) -> str:
    return f"/repos/{world['prs'][n]['repo']}/pulls/{world['prs'][n]['number']}"


def _superseded_at(pr: dict, head: str) -> float:
    """When the first push after ``head`` landed (infinity when none did)."""
    heads = pr["heads"]
    if head not in heads:
        return float("inf")
    later = heads[heads.index(head) + 1:]
    times = [pr["landed"][h] for h in later if h in pr["landed"]]
    return min(times) if times else float("inf")


def _judged_a_stale_head(completion: tuple[float, str], head_reads: dict, path: str, superseded_at: float) -> str:
    """Why a non-neutral completion of a run on a superseded head breaks the promise ("" when it does not).

    The App reads the PR's head, then completes the run; a push landing between that read and the write
    cannot be seen (GitHub offers no compare-and-set on check runs). So the completion is judged against
    the last read of the PR by the same worker process (its User-Agent names it; one job at a time each),
    not against wall-clock slack that a loaded machine outruns. A read counts as having seen the push when
    it arrived after the push landed (a read arriving just before it and served just after is excused)."""
    at, agent = completion
    if at <= superseded_at:
        return ""
    reads = [t for t in head_reads.get((agent, path), ()) if t < at]
    if not reads:
        return "without reading the PR's head first"
    if reads[-1] >= superseded_at:
        return f"its worker had read the newer head {reads[-1] - superseded_at:.2f}s after the push"
    return ""


def max_in_window(times: list[float], window: float) -> int:
    """The most of ``times`` inside any half-open interval of ``window`` seconds."""
    ordered = sorted(times)
    best = 0
    for i, t in enumerate(ordered):
        best = max(best, bisect.bisect_left(ordered, t + window) - i)
    return best


# ---- the figures ----------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


RETRY_LINE = re.compile(r"retry: Retry in \S+?s(?:: (\w+)\('?([A-Za-z ]{0,16}))?")


def _retry_reason(exc: str, message: str) -> str:
    if not exc:
        return "waited for the PR's lock or the write budget"
    if message.startswith("GitHub rate"):
        return "GitHub rate limit"
    return "GitHub 5xx" if message.startswith("GitHub answ") else message.strip() or exc


def _operation(method: str, path: str) -> str:
    """``GET /repos/{}/pulls/{}/files``: a request's path with its names and numbers taken out."""
    path = re.sub(r"^/repos/[^/]+/[^/]+", "/repos/{}", path)
    path = re.sub(r"/(?:[0-9]+|[0-9a-f]{40})(?=/|$)", "/{}", path)
    path = re.sub(r"^(/repos/\{\}/contents)/.*", r"\1/{}", path)
    path = re.sub(r"^/_codeload/.*", "/_codeload/{} (archive)", path)
    return f"{method} {path}"


def figures(outcome: Outcome) -> dict:
    plan = outcome.world["deliveries"]
    shot = outcome.snapshot
    ok = [a for a in outcome.attempts if 200 <= a.status < 300]
    span = max(outcome.accepted.values()) - min(outcome.first_sent.values()) if outcome.accepted else float("nan")
    statuses = Counter(a.status for a in outcome.attempts)
    first_completion: dict[str, float] = {}
    run_head = {r["id"]: r["head"] for pr in shot["prs"] for r in pr["runs"]}
    for at, method, path, status, _i, _c, body_status, _agent in shot["requests"]:
        if method == "PATCH" and "/check-runs/" in path and status == 200 and body_status == "completed":
            head = run_head.get(int(path.rsplit("/", 1)[1]))
            if head is not None:
                first_completion.setdefault(head, at)
    to_completion = []
    for index, d in enumerate(plan):
        if d["kind"] in ("opened", "synchronize") and index in outcome.first_sent and d["head"] in first_completion:
            to_completion.append(max(0.0, first_completion[d["head"]] - outcome.first_sent[index]))
    app_requests = [r for r in shot["requests"] if r[4] is not None or r[2].startswith("/app")]
    reviews = sum(len(pr["reviews"]) for pr in shot["prs"])
    completed_runs = sum(1 for pr in shot["prs"] for r in pr["runs"] if r["status"] == "completed")
    retries = Counter(_retry_reason(exc, message) for exc, message in RETRY_LINE.findall(outcome.logs))
    operations = Counter(_operation(method, path) for _a, method, path, *_ in app_requests)
    return {
        "deliveries": len(plan),
        "attempts": len(outcome.attempts),
        "statuses": dict(sorted(statuses.items())),
        "accepted_per_s": len(outcome.accepted) / span if span and span == span else float("nan"),
        "ack_p50_ms": pct([a.latency for a in ok], 0.5) * 1000,
        "ack_p99_ms": pct([a.latency for a in ok], 0.99) * 1000,
        "ack_max_ms": max((a.latency for a in ok), default=float("nan")) * 1000,
        "done_p50_s": pct(to_completion, 0.5),
        "done_p95_s": pct(to_completion, 0.95),
        "done_p99_s": pct(to_completion, 0.99),
        "heads_completed": len(to_completion),
        "github_requests": len(app_requests),
        "content_creating": sum(1 for r in app_requests if r[5]),
        "reviews": reviews,
        "completed_runs": completed_runs,
        "calls_per_run": len(app_requests) / completed_runs if completed_runs else float("nan"),
        "github_502": shot["faults"].get(502, 0),
        "github_rate_limited": shot["faults"].get(403, 0),
        "retries": dict(retries),
        "operations": dict(operations.most_common(12)),
        "redelivered": outcome.logs.count("redelivered after a lost worker"),
        "drain_s": outcome.drain_seconds,
        "faults": [what for _, what in outcome.events],
    }


def report(figs: dict, problems: list[str], out=sys.stdout) -> None:
    print(f"deliveries: {figs['deliveries']} planned, {figs['attempts']} sent (with redeliveries of refused ones); "
          f"answers {figs['statuses']}", file=out)
    print(f"faults: {'; '.join(figs['faults']) or 'none'}; GitHub answered {figs['github_502']} x 502 and "
          f"{figs['github_rate_limited']} x 403 (secondary rate limit)", file=out)
    print(f"accepted: {figs['accepted_per_s']:.1f} deliveries/s; webhook ack p50 {figs['ack_p50_ms']:.1f} ms, "
          f"p99 {figs['ack_p99_ms']:.1f} ms, max {figs['ack_max_ms']:.0f} ms", file=out)
    print(f"delivery -> check run completed ({figs['heads_completed']} heads): p50 {figs['done_p50_s']:.1f} s, "
          f"p95 {figs['done_p95_s']:.1f} s, p99 {figs['done_p99_s']:.1f} s; drained {figs['drain_s']:.1f} s after "
          "the burst", file=out)
    print(f"GitHub: {figs['github_requests']} requests ({figs['content_creating']} content-creating) for "
          f"{figs['completed_runs']} completed check runs and {figs['reviews']} reviews: "
          f"{figs['calls_per_run']:.1f} calls per check run", file=out)
    print(f"job retries: {sum(figs['retries'].values())} {figs['retries']}; jobs redelivered after a kill: "
          f"{figs['redelivered']}", file=out)
    print("most frequent GitHub calls: " + ", ".join(f"{op} {n}" for op, n in figs["operations"].items()), file=out)
    if problems:
        print(f"BROKEN ({len(problems)}):", file=out)
        for line in problems[:40]:
            print(f"  {line}", file=out)
    else:
        print("every check held", file=out)


# ---- the webhook alone, open loop ----------------------------------------------------------------------


def ack_run(rate: float, seconds: float, web_workers: int = 2) -> dict:
    """Deliveries at ``rate``/s, open loop, to the webhook (Redis, gunicorn; no worker drains the queue):
    each answer's time from when it was due, so a client that falls behind counts against the server.
    The client shares the server's cores, so it is made cheap: pre-built requests, written on keep-alive
    connections by one asyncio loop (a thread per request would take the CPU the server is measured on)."""
    import asyncio

    import redis as redis_client

    from github_emulator.webhooks import signed_delivery, real_payload

    workdir = Path(tempfile.mkdtemp(prefix="torchreview-ack-"))
    stack: list = []
    try:
        server = RedisServer(workdir)
        stack.append(server)
        env = {**os.environ, "REDIS_URL": server.url, "GITHUB_APP_ID": str(APP_ID), "GITHUB_WEBHOOK_SECRET": SECRET,
               "TORCHREVIEW_DATA_DIR": str(workdir), "PYTHONPATH": str(ROOT), "LOG_LEVEL": "WARNING"}
        web = Web(env, web_workers, workdir)
        stack.append(web)
        data = real_payload("pull_request.synchronize")
        count = int(rate * seconds)
        warm = min(200, count)
        requests_bytes = [_http_post(web.port, DEFAULT_WEBHOOK_PATH,
                                     *signed_delivery("pull_request", {**data, "number": n}, SECRET))
                          for n in range(count + warm)]
        results = asyncio.run(_open_loop(web.port, requests_bytes[:warm], rate=50.0))  # connections, imports, Redis
        redis_client.Redis.from_url(server.url).flushdb()
        server_pids = [*web.children(), server.proc.pid]
        cpu_before = sum(_cpu_seconds(pid) for pid in server_pids)
        results = asyncio.run(_open_loop(web.port, requests_bytes[warm:], rate=rate))
        cpu_per_delivery = (sum(_cpu_seconds(pid) for pid in server_pids) - cpu_before) / max(1, len(results))
        from_due = [r[0] for r in results]
        service = [r[1] for r in results]
        return {"rate": rate, "count": len(results), "statuses": dict(Counter(r[2] for r in results)),
                "p50_ms": pct(from_due, 0.5) * 1000, "p99_ms": pct(from_due, 0.99) * 1000,
                "max_ms": max(from_due) * 1000, "service_p99_ms": pct(service, 0.99) * 1000,
                "server_cpu_ms": cpu_per_delivery * 1000}
    finally:
        for part in reversed(stack):
            part.stop()
        shutil.rmtree(workdir, ignore_errors=True)


ANSWER_TIMEOUT_S = 30.0  # GitHub gives up on a delivery after 10 s; past this the bench calls it failed


def _cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _http_post(port: int, path: str, body: bytes, headers: dict) -> bytes:
    head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Content-Length: {len(body)}",
            *(f"{name}: {value}" for name, value in headers.items() if name.lower() != "content-length")]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _open_loop(port: int, requests_bytes: list[bytes], rate: float) -> list[tuple[float, float, int]]:
    """Send each request when it is due (``rate``/s), on an idle keep-alive connection or a new one;
    (seconds from due to answer, seconds from send to answer, status) each, 0 for a failed exchange."""
    import asyncio

    idle: list = []
    results: list[tuple[float, float, int]] = []
    failures: Counter = Counter()

    class StaleConnection(Exception):
        """A kept-alive connection the server had closed before reading the request."""

    async def exchange(request: bytes, fresh: bool = False) -> int:
        reused = bool(idle) and not fresh
        reader, writer = idle.pop() if reused else await asyncio.open_connection("127.0.0.1", port)
        keep = False
        try:
            writer.write(request)
            status_line = await reader.readline()
            if not status_line:
                raise StaleConnection() if reused else ConnectionError("closed by the server")
            length, keep_alive = 0, True
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
                elif name.strip().lower() == b"connection" and value.strip().lower() == b"close":
                    keep_alive = False
            await reader.readexactly(length)
            keep = keep_alive  # only a connection whose whole answer was read goes back to the pool
            return int(status_line.split()[1])
        finally:
            if keep:
                idle.append((reader, writer))
            else:
                writer.close()

    async def deliver(request: bytes, due: float) -> None:
        started = time.perf_counter()
        try:
            try:
                status = await asyncio.wait_for(exchange(request), ANSWER_TIMEOUT_S)
            except StaleConnection:  # never read by the server: sending it again cannot make a duplicate
                status = await asyncio.wait_for(exchange(request, fresh=True), ANSWER_TIMEOUT_S)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError, IndexError,
                StaleConnection) as exc:
            failures[type(exc).__name__] += 1
            status = 0
        done = time.perf_counter()
        results.append((done - due, done - started, status))

    tasks = []
    origin = time.perf_counter() + 0.2
    for n, request in enumerate(requests_bytes):
        due = origin + n / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # the schedule: open loop
        tasks.append(asyncio.create_task(deliver(request, due)))
    await asyncio.gather(*tasks)
    for _reader, writer in idle:
        writer.close()
    if failures:
        print(f"  failed exchanges: {dict(failures)}", flush=True)
    return results


# ---- command line -----------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    defaults = Storm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deliveries", type=int, default=defaults.deliveries)
    parser.add_argument("--pull-requests", type=int, default=defaults.pull_requests)
    parser.add_argument("--installations", type=int, default=defaults.installations)
    parser.add_argument("--workers", default=str(defaults.workers),
                        help="worker processes; a comma-separated list runs the storm once per count (e.g. 1,2,4)")
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency, help="jobs at once per worker")
    parser.add_argument("--web-workers", type=int, default=defaults.web_workers)
    parser.add_argument("--burst-seconds", type=float, default=defaults.burst_seconds)
    parser.add_argument("--error-rate", type=float, default=defaults.error_rate, help="share of GitHub calls answered 502")
    parser.add_argument("--rate-limit-rate", type=float, default=defaults.rate_limit_rate,
                        help="share of GitHub calls answered with a secondary rate limit")
    parser.add_argument("--retry-after", type=int, default=defaults.retry_after)
    parser.add_argument("--kill-every", type=float, default=defaults.kill_every,
                        help="SIGKILL a worker this often during the burst, seconds (0: never)")
    parser.add_argument("--redis-restarts", type=int, default=defaults.redis_restarts)
    parser.add_argument("--web-kills", type=int, default=defaults.web_kills)
    parser.add_argument("--visibility-timeout", type=int, default=defaults.visibility_timeout)
    parser.add_argument("--write-interval", type=float, default=defaults.write_interval,
                        help="seconds between a client's GitHub writes (production default 1.0)")
    parser.add_argument("--drain-timeout", type=float, default=defaults.drain_timeout)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--ack-rates", help="instead of the storm: the webhook alone, open loop, at these rates "
                                            "(deliveries/s, comma-separated)")
    parser.add_argument("--ack-seconds", type=float, default=20.0)
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--keep", metavar="DIR", type=Path, help="keep the logs (Redis, web, workers, emulator) here")
    parser.add_argument("--emulator-child", nargs=2, metavar=("ADDRESS", "AUTHKEY"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.emulator_child:
        host, port = args.emulator_child[0].rsplit(":", 1)
        emulator_child((host, int(port)), bytes.fromhex(args.emulator_child[1]))
        return 0
    if args.ack_rates:
        rows = [ack_run(float(rate), args.ack_seconds, args.web_workers) for rate in args.ack_rates.split(",")]
        for row in rows:
            print(f"{row['rate']:.0f}/s open loop, {row['count']} deliveries {row['statuses']}: p50 {row['p50_ms']:.1f} ms, "
                  f"p99 {row['p99_ms']:.1f} ms, max {row['max_ms']:.0f} ms (server-side part p99 "
                  f"{row['service_p99_ms']:.1f} ms); gunicorn + Redis CPU {row['server_cpu_ms']:.2f} ms a delivery")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2))
        return 0
    rows = []
    failed = False
    for workers in [int(w) for w in args.workers.split(",")]:
        storm = Storm(deliveries=args.deliveries, pull_requests=args.pull_requests, installations=args.installations,
                      workers=workers, concurrency=args.concurrency, web_workers=args.web_workers,
                      burst_seconds=args.burst_seconds, error_rate=args.error_rate,
                      rate_limit_rate=args.rate_limit_rate, retry_after=args.retry_after, kill_every=args.kill_every,
                      redis_restarts=args.redis_restarts, web_kills=args.web_kills,
                      visibility_timeout=args.visibility_timeout, write_interval=args.write_interval,
                      drain_timeout=args.drain_timeout, seed=args.seed)
        print(f"== {workers} worker(s) x concurrency {storm.concurrency}, {storm.deliveries} deliveries over "
              f"{storm.burst_seconds:.0f} s, {storm.pull_requests} PRs, {storm.installations} installations", flush=True)
        outcome = run_storm(storm, args.keep / f"workers-{workers}" if args.keep else None,
                            progress=lambda line: print(f"   {line}", flush=True))
        problems = check(outcome)
        figs = figures(outcome)
        report(figs, problems)
        failed |= bool(problems)
        rows.append({"workers": workers, **figs, "problems": problems})
    if len(rows) > 1:
        print("\n| workers | accepted/s | ack p50 / p99 ms | completed p50 / p95 / p99 s | drain s | calls/run | "
              "retries | redelivered | checks |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in rows:
            print(f"| {r['workers']} | {r['accepted_per_s']:.1f} | {r['ack_p50_ms']:.1f} / {r['ack_p99_ms']:.1f} | "
                  f"{r['done_p50_s']:.1f} / {r['done_p95_s']:.1f} / {r['done_p99_s']:.1f} | {r['drain_s']:.0f} | "
                  f"{r['calls_per_run']:.1f} | {sum(r['retries'].values())} | {r['redelivered']} | "
                  f"{len(r['problems']) or 'all'} {'broken' if r['problems'] else 'held'} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
