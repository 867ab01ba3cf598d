"""Deploy files that run: each compose service's and each Kubernetes container's environment, resolved the
way docker compose and the kubelet build it, passes the App's own settings loader (bot.settings) for the
role the service runs; the loader and `torchreview serve` report every bad variable at once; /healthz and
/metrics answer only on the internal port the manifests keep unpublished.

docker is not needed: PyYAML applies `<<:` merge keys as compose's YAML loader does (shallowly, one
mapping replacing another whole), then compose's own rule is applied: ``env_file`` first, ``environment``
over it. Secrets and mounted files are written where the container would see them (a path map).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from bot.settings import Settings, SettingsError
from github_emulator.local import ProcessGroup, free_port
from tests.conftest import ROOT, START_TIMEOUT_S, WEBHOOK_SECRET, answer, wait_for

DEPLOY = ROOT / "deploy"
# What an operator puts in place of the templates' "change-me" (which the loader refuses, see below).
FILLED_SECRET = "3f9c0a7e5b2d4c18a6e7f0b9d2c4a1e8"
APP_ENV = ("GITHUB_", "REDIS_URL", "TORCHREVIEW_")


def read_env_file(path: Path) -> dict[str, str]:
    """A compose ``.env`` file: KEY=VALUE lines, ``#`` comments, optional quotes around the value."""
    env = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and key.strip().isidentifier(), f"{path}:{number}: not KEY=VALUE: {line!r}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def compose_environment(service: dict, env_file_dir: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    files = service.get("env_file") or []
    for entry in [files] if isinstance(files, (str, dict)) else files:
        env.update(read_env_file(env_file_dir / (entry["path"] if isinstance(entry, dict) else entry)))
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    for key, value in environment.items():
        assert "${" not in str(value), f"{key}: interpolation is not resolved here: {value!r}"
        env[key] = "" if value is None else str(value)
    return env


def role_of(argv: list[str], env: dict) -> str | None:
    """The role `torchreview ARGV` loads its settings for (bot.cli), None for a command that is not ours."""
    if argv[:1] == ["serve"]:
        return "web" if env.get("REDIS_URL") else "all"
    if argv[:1] == ["worker"]:
        return "worker"
    return None


def in_container(env: dict, files: dict[str, Path]) -> dict:
    """Paths inside the container (/run/secrets/...) to where this test wrote those files."""
    return {key: str(files.get(value, value)) for key, value in env.items()}


@pytest.fixture
def operator_dir(tmp_path, app_key):
    """deploy/ as an operator prepares it: .env from .env.example with a real secret, the App's key file."""
    example = (DEPLOY / ".env.example").read_text()
    assert "GITHUB_WEBHOOK_SECRET=change-me" in example
    (tmp_path / ".env").write_text(example.replace("GITHUB_WEBHOOK_SECRET=change-me",
                                                   f"GITHUB_WEBHOOK_SECRET={FILLED_SECRET}"))
    (tmp_path / "github-app.pem").write_text(app_key[0])
    return tmp_path


def test_every_compose_service_starts_with_its_resolved_environment(operator_dir):
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    secret_files = {name: operator_dir / Path(spec["file"]).name for name, spec in compose["secrets"].items()}
    checked = {}
    for name, service in compose["services"].items():
        env = compose_environment(service, operator_dir)
        image = service.get("image", "")
        command = service.get("command") or (["serve"] if image.startswith("torchreview:") else [])
        role = role_of(command, env) if image.startswith("torchreview:") else None
        if role is None:  # redis, the executor: none of the App's settings or secrets reach them
            assert not [key for key in env if key.startswith(APP_ENV) and "EXECUTOR" not in key], name
            # the executor's one secret is the token the smoke workers present to it
            assert service.get("secrets", []) == (["executor-token"] if name == "executor" else []), name
            assert not service.get("env_file"), name
            continue
        mounted = {f"/run/secrets/{secret}": secret_files[secret] for secret in service.get("secrets", [])}
        settings = Settings.from_env(in_container(env, mounted), role=role)
        checked[name] = (role, settings)
    assert {name: role for name, (role, _settings) in checked.items()} == {
        "web": "web", "worker": "worker", "gpu-worker": "worker"}
    for name in ("worker", "gpu-worker"):  # the key came from the mounted secret file
        assert checked[name][1].private_key and "PRIVATE KEY" in checked[name][1].private_key
    assert checked["web"][1].private_key is None and checked["web"][1].webhook_secret == FILLED_SECRET


def test_the_gpu_worker_keeps_the_workers_environment():
    """The merge is shallow: gpu-worker's own `environment:` once replaced the worker's, key path included."""
    services = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    assert services["worker"]["environment"].items() <= services["gpu-worker"]["environment"].items()
    assert services["gpu-worker"]["environment"]["TORCHREVIEW_EXECUTOR_URL"] == "http://executor:8700"


def test_the_templates_placeholder_secret_is_refused(tmp_path):
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    (tmp_path / ".env").write_text((DEPLOY / ".env.example").read_text())
    env = compose_environment(compose["services"]["web"], tmp_path)
    with pytest.raises(SettingsError) as refused:
        Settings.from_env(env, role="web")
    assert [p.split(" ")[0] for p in refused.value.problems] == ["GITHUB_WEBHOOK_SECRET"]


def test_health_and_metrics_are_on_unpublished_ports_in_compose():
    services = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    web = services["web"]
    internal = web["environment"]["TORCHREVIEW_INTERNAL_PORT"]
    published = [str(mapping).split(":")[-1] for mapping in web.get("ports", [])]
    assert internal not in published and internal in web["expose"]
    assert f"127.0.0.1:{internal}/healthz" in " ".join(web["healthcheck"]["test"])
    for name in ("worker", "gpu-worker"):
        port = services[name]["environment"]["TORCHREVIEW_WORKER_METRICS_PORT"]
        assert "ports" not in services[name] and port in services[name]["expose"]


def _kubernetes() -> list[dict]:
    kustomization = yaml.safe_load((DEPLOY / "kubernetes" / "kustomization.yaml").read_text())
    return [doc for resource in kustomization["resources"]
            for doc in yaml.safe_load_all((DEPLOY / "kubernetes" / resource).read_text()) if doc]


def test_every_kubernetes_container_starts_with_its_resolved_environment(tmp_path, app_key):
    documents = _kubernetes()
    config_maps = {d["metadata"]["name"]: d["data"] for d in documents if d["kind"] == "ConfigMap"}
    secrets = {d["metadata"]["name"]: dict(d["stringData"]) for d in documents if d["kind"] == "Secret"}
    # as the operator fills in secret.yaml
    secrets["torchreview-github"].update(GITHUB_WEBHOOK_SECRET=FILLED_SECRET, **{"private-key.pem": app_key[0]})
    roles = {}
    for deployment in (d for d in documents if d["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            env: dict[str, str] = {}
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    env.update(config_maps[source["configMapRef"]["name"]])
                if "secretRef" in source:
                    env.update(secrets[source["secretRef"]["name"]])
            for entry in container.get("env", []):
                if "value" in entry:
                    env[entry["name"]] = str(entry["value"])
                else:
                    ref = entry["valueFrom"].get("secretKeyRef") or entry["valueFrom"]["configMapKeyRef"]
                    store = secrets if "secretKeyRef" in entry["valueFrom"] else config_maps
                    env[entry["name"]] = store[ref["name"]][ref["key"]]
            files = {}
            for mount in container.get("volumeMounts", []):
                secret = volumes[mount["name"]].get("secret")
                for item in (secret or {}).get("items", []):
                    written = tmp_path / f"{container['name']}-{item['path']}"
                    written.write_text(secrets[secret["secretName"]][item["key"]])
                    files[f"{mount['mountPath']}/{item['path']}"] = written
            name = deployment["metadata"]["name"]
            role = role_of(container.get("args", []), env) if container["image"] == "torchreview" else None
            if role is None:
                assert not [key for key in env if key.startswith(("GITHUB_", "REDIS_URL"))], name
                continue
            settings = Settings.from_env(in_container(env, files), role=role)
            roles[name] = role
            if role == "web":
                ports = {p["name"]: p["containerPort"] for p in container["ports"]}
                assert settings.internal_port == ports["metrics"] != ports["http"]
                for probe in ("readinessProbe", "livenessProbe"):
                    assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
            else:
                assert settings.private_key and "PRIVATE KEY" in settings.private_key
    assert roles == {"torchreview-web": "web", "torchreview-worker": "worker", "torchreview-gpu-worker": "worker"}


# ---- every problem at once ---------------------------------------------------------------------------

BROKEN = {"GITHUB_APP_ID": "my-app", "GITHUB_WEBHOOK_SECRET": "change-me", "GITHUB_PRIVATE_KEY_PATH": "/no/such/key.pem",
          "PORT": "http", "LOG_LEVEL": "loud", "REDIS_URL": "localhost:6379", "TORCHREVIEW_VISIBILITY_TIMEOUT": "15m",
          "TORCHREVIEW_WORKER_METRICS_PORT": "70000", "TORCHREVIEW_EXECUTOR_URL": "executor:8700",
          "GITHUB_API_URL": "api.github.com", "TORCHREVIEW_INTERNAL_PORT": "0", "PATH": os.environ["PATH"]}
BROKEN_NAMES = ["GITHUB_PRIVATE_KEY_PATH", "GITHUB_WEBHOOK_SECRET", "GITHUB_APP_ID", "GITHUB_API_URL", "PORT",
                "TORCHREVIEW_INTERNAL_PORT", "REDIS_URL", "LOG_LEVEL", "TORCHREVIEW_VISIBILITY_TIMEOUT",
                "TORCHREVIEW_WORKER_METRICS_PORT", "TORCHREVIEW_EXECUTOR_URL"]


def test_the_loader_names_every_bad_variable_at_once():
    with pytest.raises(SettingsError) as refused:
        Settings.from_env(BROKEN, role="all")
    problems = refused.value.problems
    assert [problem.split(":")[0].split(" ")[0] for problem in problems] == BROKEN_NAMES
    assert str(refused.value).startswith(f"{len(BROKEN_NAMES)} settings are missing or invalid:")
    with pytest.raises(SettingsError) as missing:
        Settings.from_env({}, role="all")
    assert [p.split(" ")[0] for p in missing.value.problems] == [
        "GITHUB_APP_ID", "GITHUB_PRIVATE_KEY", "GITHUB_WEBHOOK_SECRET"]


def test_serve_reports_every_bad_variable_in_one_error(tmp_path):
    # no REDIS_URL: serve runs the web and the workers, so every setting of both is checked
    env = {key: value for key, value in BROKEN.items() if key != "REDIS_URL"}
    expected = [name for name in BROKEN_NAMES if name != "REDIS_URL"]
    done = subprocess.run([sys.executable, "-m", "bot.cli", "serve"], env={**env, "PYTHONPATH": str(ROOT)},
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == f"torchreview: error: {len(expected)} settings are missing or invalid:"
    assert [line.split("- ", 1)[1].split(":")[0].split(" ")[0] for line in lines[1:]] == expected
    assert not (tmp_path / ".torchreview-data").exists()  # nothing started


# ---- the internal port, under the real gunicorn ------------------------------------------------------


def test_health_and_metrics_answer_on_the_internal_port_only(redis_url, tmp_path):
    port, internal = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "PROMETHEUS_"))}
    env.update({"REDIS_URL": redis_url, "GITHUB_APP_ID": "4242", "GITHUB_WEBHOOK_SECRET": WEBHOOK_SECRET,
                "TORCHREVIEW_INTERNAL_PORT": str(internal), "TORCHREVIEW_DATA_DIR": str(tmp_path / "data"),
                "PYTHONPATH": str(ROOT), "LOG_LEVEL": "WARNING"})
    public, private = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{internal}"
    with ProcessGroup([sys.executable, "-m", "bot.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                       "--web-workers", "1"], tmp_path / "serve.log", env=env, cwd=ROOT) as serve:
        wait_for(lambda: answer(serve, private + "/healthz"), START_TIMEOUT_S, "serve's internal port")
        assert requests.get(private + "/metrics", timeout=5).status_code == 200
        for path in ("/healthz", "/metrics"):
            assert requests.get(public + path, timeout=5).status_code == 404
        # the webhook is on the public port only (401: it got there, and the signature is missing)
        assert requests.post(public + "/api/github/webhooks", data=b"{}", timeout=5).status_code == 401
        assert requests.post(private + "/api/github/webhooks", data=b"{}", timeout=5).status_code == 404
