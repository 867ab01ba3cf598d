"""Shared fixtures: a real redis-server on a free port, real webhook payloads, signing."""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import shutil
import sys
import sysconfig
import threading
import uuid
from pathlib import Path

import pytest
import requests

from github_emulator.local import ProcessGroup, free_port, wait_until

ROOT = Path(__file__).resolve().parents[1]
WEBHOOK_SECRET = "test-webhook-secret"
# How long a server the tests start may take to answer: seconds on an idle machine, far more on a loaded 2-core
# one running the suite on every core. A wait that runs out fails the test, so it is generous.
START_TIMEOUT_S = 180.0

# Where a module imported during a test may come from and stay imported: the interpreter's libraries and this
# project's own packages. Anything else is a pull request's code (a tmp_path tree, tests/fixtures) imported by name.
_INSTALLED = tuple({str(Path(p).resolve()) for p in (*sysconfig.get_paths().values(), sys.prefix, sys.base_prefix,
                                                   sys.exec_prefix)})
_OUR_PACKAGES = ("analyzers", "bot", "github_emulator", "gpu_runner", "tests")


def _locations(module) -> list[str]:
    """The files and folders a module was imported from, as the import system recorded them (libraries make
    modules of their own kinds: torch.classes answers any attribute, __path__ included)."""
    spec = getattr(module, "__spec__", None)
    found = [getattr(module, "__file__", None), getattr(spec, "origin", None)]
    folders = getattr(spec, "submodule_search_locations", None)
    if folders is not None:
        found += list(folders)
    return [str(Path(place).resolve()) for place in found if isinstance(place, str) and os.path.isabs(place)]


def _imported_from_a_test_tree(name: str, module) -> bool:
    locations = _locations(module)
    if not locations:
        return False  # built in, or made by a library (torch._C's submodules)
    if name.split(".")[0] in _OUR_PACKAGES and all(Path(p).is_relative_to(ROOT) for p in locations):
        return False
    return not all(p.startswith(_INSTALLED) for p in locations)


@contextlib.contextmanager
def imports_forgotten_after():
    """Forgets, at the end of the block, the modules imported in it from a pull request's tree (any folder but
    the interpreter's libraries and our packages) and the sys.path entries added in it."""
    path, modules = list(sys.path), set(sys.modules)
    try:
        yield
    finally:
        for name in set(sys.modules) - modules:
            module = sys.modules.get(name)
            if module is not None and _imported_from_a_test_tree(name, module):
                del sys.modules[name]
        sys.path[:] = path


@pytest.fixture(autouse=True)
def isolated_imports():
    """The runner's builder imports a test tree's ``models``, ``train``, ``net``... by name, in this process: the
    next test's ``from models import Net`` must find its own, not a namespace package or another test's file left
    in sys.modules by whichever tests this process happened to run before."""
    with imports_forgotten_after():
        yield


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A private redis-server for the session (never the machine's shared one)."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed; scripts/test.sh installs it (apt-get install redis-server)")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    import redis

    with ProcessGroup([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                       "--dir", str(workdir)], workdir / "redis.log") as server:
        client = redis.Redis(port=port, socket_timeout=10)

        def answers():
            if server.proc.poll() is not None:
                raise AssertionError(f"redis-server exited {server.proc.returncode}: "
                                     f"{(workdir / 'redis.log').read_text()[-2000:]}")
            try:
                return client.ping()
            except redis.RedisError:
                return False  # not listening yet, or still loading

        wait_for(answers, START_TIMEOUT_S, "redis-server")
        yield f"redis://127.0.0.1:{port}/0"


@pytest.fixture
def redis_client(redis_url):
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    return client


def payload(name: str) -> dict:
    """A real GitHub webhook payload from the contract cache (``derived/`` ones are documented edits)."""
    from github_emulator.webhooks import real_payload

    return real_payload(name)


def signed_headers(body: bytes, event: str, delivery: str | None = None, secret: str = WEBHOOK_SECRET) -> dict:
    """Headers for exactly these bytes (tests also send bodies that are not valid JSON)."""
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest(),
    }
    return headers


# ---- the App end to end: emulator + webhook (real HTTP) + a Celery worker process + Redis -------


@pytest.fixture(scope="module")
def app_key():
    from github_emulator import generate_app_key

    return generate_app_key()


@pytest.fixture(scope="module")
def emulator(app_key):
    from github_emulator import EmulatorState, serve

    _private, public = app_key
    state = EmulatorState(app_public_key_pem=public, app_id=4242)
    running = serve(state)
    yield running
    running.shutdown()


def worker_env(emulator, app_key, redis_url, data_dir) -> dict:
    private, _public = app_key
    return {
        **os.environ,
        "REDIS_URL": redis_url,
        "GITHUB_APP_ID": "4242",
        "GITHUB_PRIVATE_KEY": private,
        "GITHUB_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "GITHUB_API_URL": emulator.url,
        "TORCHREVIEW_DATA_DIR": str(data_dir),
        "TORCHREVIEW_GITHUB_WRITE_INTERVAL": "0",
        "TORCHREVIEW_VISIBILITY_TIMEOUT": "20",
        "TORCHREVIEW_WORKER_METRICS_PORT": "0",  # many workers per machine here; tests that scrape pick a port
        "PYTHONPATH": str(ROOT),
    }


class Worker(ProcessGroup):
    """``torchreview worker`` on ``queues``; ``kill()`` takes the main process and its pool at once."""

    def __init__(self, env: dict, queues: str = "reviews", concurrency: int = 2) -> None:
        from bot.cli import worker_command

        super().__init__(worker_command(concurrency, queues),
                         Path(env["TORCHREVIEW_DATA_DIR"]) / f"worker-{queues}-{uuid.uuid4().hex[:6]}.log",
                         env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def stack(emulator, app_key, redis_url, tmp_path_factory):
    """The webhook (in-process, real HTTP) and one worker process, sharing a private Redis."""
    from werkzeug.serving import make_server

    from bot.settings import Settings
    from bot.webhook import create_app

    data_dir = tmp_path_factory.mktemp("torchreview")
    env = worker_env(emulator, app_key, redis_url, data_dir)
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    settings = Settings(app_id=4242, private_key=app_key[0], webhook_secret=WEBHOOK_SECRET, redis_url=redis_url,
                        data_dir=data_dir, api_url=emulator.url)
    server = make_server("127.0.0.1", 0, create_app(settings), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stack = {"url": f"http://127.0.0.1:{server.server_port}{settings.webhook_path}", "env": env,
             "state": emulator.state}
    try:
        stack["worker"] = Worker(env)
        yield stack
    finally:
        if "worker" in stack:
            stack["worker"].stop()  # the one a test may have put in place of the first
        server.shutdown()


_repo_counter = iter(range(1, 10_000))


def install_on_octo_org(state) -> None:
    """The App's installation on octo-org, id 1 (the webhook payloads' default), whichever installations the
    tests that ran before on this module's emulator added."""
    if 1 not in state.installations:
        state.add_installation("octo-org", installation_id=1)


def new_repo(state, files: dict, extra_base: dict | None = None):
    name = f"octo-org/models-{next(_repo_counter)}"
    install_on_octo_org(state)
    repo = state.add_repo(name, files={"README.md": "# models\n", **(extra_base or {})})
    state.add_collaborator(repo, "octo-maintainer", "maintain")  # the tests' maintainer, on every repository
    return repo, name


def deliver(stack, event: str, data: dict, delivery: str | None = None) -> requests.Response:
    body = json.dumps(data).encode()
    response = requests.post(stack["url"], data=body, headers=signed_headers(body, event, delivery), timeout=10)
    return response


def pr_payload(action: str, repo_name: str, pr) -> dict:
    from github_emulator.webhooks import pull_request_payload

    assert pr.repo.full_name == repo_name
    return pull_request_payload(action, pr)


def answer(server: ProcessGroup, url: str) -> requests.Response | None:
    """``url``'s response from ``server`` (truthy when its status is below 400); None while the server does not
    answer yet (refused, or too slow on a loaded machine: ask again); an AssertionError with its log's tail when it
    has exited, so that a wait on it fails at once, saying why."""
    if server.proc.poll() is not None:
        raise AssertionError(f"{server.proc.args[:4]} exited {server.proc.returncode}: "
                             f"{server.log_path.read_text()[-3000:]}")
    try:
        return requests.get(url, timeout=10)
    except requests.RequestException:
        return None


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    try:
        return wait_until(predicate, timeout, what)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None


def completed_run(state, sha: str, timeout: float = 60.0):
    def done():
        runs = [r for r in state.check_runs_for(sha, name="torchreview") if r.status == "completed"]
        return runs[0] if runs else None

    return wait_for(done, timeout, f"a completed torchreview check run on {sha[:7]}")


