"""The deploy files keep execution apart from credentials, and the shipped seccomp profile fits the sandbox."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from bot.settings import MAX_WEBHOOK_BYTES
from gpu_runner import syscall_filter

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROFILE = DEPLOY / "seccomp" / "torchreview-executor.json"
# What bubblewrap itself calls to build the sandbox inside the container.
BWRAP_NEEDS = {"clone", "clone3", "unshare", "setns", "mount", "umount2", "pivot_root", "prctl", "capset",
               "setresuid", "setresgid", "setgroups", "execve", "seccomp"}


def profile_rules() -> list[dict]:
    profile = json.loads(PROFILE.read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert {rule["action"] for rule in profile["syscalls"]} == {"SCMP_ACT_ERRNO"}
    return profile["syscalls"]


def denied_by_profile() -> set[str]:
    """The calls the profile denies whatever their arguments."""
    return {name for rule in profile_rules() if not rule.get("args") for name in rule["names"]}


def socket_families_denied_by_profile() -> tuple[set[int], int]:
    """(families denied one by one, the family from which every one is denied) for socket and socketpair."""
    single, from_on = set(), None
    for rule in profile_rules():
        if rule.get("args"):
            assert set(rule["names"]) == {"socket", "socketpair"} and rule["errnoRet"] == 97, rule  # EAFNOSUPPORT
            (arg,) = rule["args"]
            assert arg["index"] == 0, rule
            if arg["op"] == "SCMP_CMP_EQ":
                single.add(arg["value"])
            else:
                assert arg["op"] == "SCMP_CMP_GE", rule
                from_on = arg["value"]
    return single, from_on


def test_profile_lets_bubblewrap_work_and_denies_the_kernels_riskiest_calls():
    denied = denied_by_profile()
    assert not denied & BWRAP_NEEDS
    # The child's own filter denies these too; the container profile must not be the weaker of the two
    # for anything bubblewrap does not need (memory calls excepted: torch itself may use them in the executor).
    must = set(syscall_filter.DENIED_SYSCALLS) - BWRAP_NEEDS - {
        "chroot", "mount_setattr", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
        "memfd_create", "memfd_secret", "shmget"}
    assert must <= denied, sorted(must - denied)


def test_profile_denies_every_socket_family_the_sandbox_denies():
    """AF_VSOCK reaches the hypervisor: the container's profile denies it (and the rest) for the executor itself
    too, keeping what it and bubblewrap use (AF_UNIX, AF_INET/6, netlink to bring up the sandbox's loopback)."""
    single, from_on = socket_families_denied_by_profile()
    allowed = set(syscall_filter.ALLOWED_SOCKET_FAMILIES)
    assert single == set(range(syscall_filter.AF_MAX)) - allowed and from_on == syscall_filter.AF_MAX


def test_profile_really_allows_the_sandbox_and_blocks_ptrace(tmp_path):
    # Load the profile's deny-list with libseccomp and check bubblewrap still builds its sandbox under it.
    sc = syscall_filter.library()
    if sc is None or shutil.which("bwrap") is None:
        pytest.skip("needs libseccomp's bindings and bubblewrap")
    rules = sc.SyscallFilter(sc.ALLOW)
    operators = {"SCMP_CMP_EQ": sc.EQ, "SCMP_CMP_GE": sc.GE}
    for rule in profile_rules():
        arguments = [sc.Arg(a["index"], operators[a["op"]], a["value"]) for a in rule.get("args", [])]
        for name in rule["names"]:
            try:
                rules.add_rule(sc.ERRNO(rule["errnoRet"]), name, *arguments)
            except (ValueError, RuntimeError, OSError):
                continue
    bpf = tmp_path / "profile.bpf"
    with open(bpf, "wb") as f:
        rules.export_bpf(f)
    with open(bpf, "rb") as f:
        # As the image's uid 10001 (when we can switch to it): unprivileged, like the executor container.
        as_runner = ["setpriv", "--reuid=10001", "--regid=10001", "--clear-groups", "--"] \
            if os.geteuid() == 0 and shutil.which("setpriv") else []
        done = subprocess.run([*as_runner, "python3", "-I", "-c", syscall_filter.LOADER, str(f.fileno()),
                               "bwrap", "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "--proc", "/proc",
                               "--dev", "/dev", "--",
                               "python3", "-c", "import ctypes; libc = ctypes.CDLL(None); "
                               "print(libc.ptrace(16, 1, 0, 0), libc.socket(40, 1, 0), libc.socket(1, 1, 0) >= 0)"],
                              pass_fds=(f.fileno(),), capture_output=True, text=True, timeout=60,
                              # the system's python3, which uid 10001 can run (a pyenv shim under /root it cannot)
                              env={**os.environ, "PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["-1", "-1", "True"]  # ptrace and AF_VSOCK denied, AF_UNIX not, the sandbox up


def load(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]


def test_kubernetes_executor_has_no_credentials_no_egress_and_the_profile():
    documents = {d["kind"]: d for d in load("executor.yaml")}
    pod = documents["Deployment"]["spec"]["template"]["spec"]
    text = json.dumps(pod)
    assert "configMapRef" not in text and "envFrom" not in text
    # its one secret: the token the smoke workers present (no App key, no webhook secret)
    (container,) = pod["containers"]
    secret_refs = [e for e in container["env"] if "valueFrom" in e]
    assert secret_refs == [{"name": "TORCHREVIEW_EXECUTOR_TOKEN",
                            "valueFrom": {"secretKeyRef": {"name": "torchreview-executor", "key": "token"}}}]
    assert "torchreview-github" not in text and not [v for v in pod["volumes"] if "secret" in v]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "Localhost",
                                                        "localhostProfile": PROFILE.name}
    (container,) = pod["containers"]
    assert container["command"][:3] == ["python", "-m", "gpu_runner.executor"]
    assert not any(e["name"] == "TORCHREVIEW_SANDBOX" for e in container.get("env", []))  # never weak
    policy = documents["NetworkPolicy"]["spec"]
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"} and policy["egress"] == []
    assert policy["podSelector"] == documents["Deployment"]["spec"]["selector"]
    assert "executor.yaml" in (DEPLOY / "kubernetes" / "kustomization.yaml").read_text()


def test_kubernetes_smoke_worker_sends_code_to_the_executor_and_runs_none():
    (deployment,) = load("gpu-worker.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TORCHREVIEW_EXECUTOR_URL"] == "http://torchreview-executor:8700"
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert deployment["spec"]["template"]["spec"]["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"


def test_compose_executor_gets_no_secrets_and_no_route_out():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    executor = compose["services"]["executor"]
    assert "env_file" not in executor and "volumes" not in executor
    assert executor["networks"] == ["sandbox"] and compose["networks"]["sandbox"]["internal"] is True
    assert f"seccomp=./seccomp/{PROFILE.name}" in executor["security_opt"]
    assert "TORCHREVIEW_SANDBOX" not in executor.get("environment", {})
    worker = compose["services"]["gpu-worker"]
    assert worker["environment"]["TORCHREVIEW_EXECUTOR_URL"] == "http://executor:8700"
    assert "sandbox" in worker["networks"]


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def test_compose_web_is_reachable_only_through_the_hosts_proxy():
    """Slow clients hold gunicorn's threads: only a buffering proxy on the host may reach the web (issue 23, 9)."""
    web = compose()["services"]["web"]
    assert web["ports"] == ["127.0.0.1:3000:3000"]
    assert "proxy_request_buffering on" in (DEPLOY / "README.md").read_text()
    (ingress,) = load("ingress.yaml")
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-request-buffering"] == "on"
    assert annotations["nginx.ingress.kubernetes.io/proxy-body-size"] == f"{MAX_WEBHOOK_BYTES >> 20}m"


def test_compose_gives_the_webhook_secret_to_the_web_only():
    services = compose()["services"]
    assert services["web"]["env_file"] == ".env" and "GITHUB_WEBHOOK_SECRET" not in services["web"]["environment"]
    for name in ("worker", "gpu-worker"):  # `environment` wins over the .env every service reads
        assert services[name]["environment"]["GITHUB_WEBHOOK_SECRET"] == "", name
    assert "env_file" not in services["executor"]


def test_the_executor_and_only_the_smoke_workers_share_its_token():
    services = compose()["services"]
    path = "/run/secrets/executor-token"
    for name in ("executor", "gpu-worker"):
        assert "executor-token" in services[name]["secrets"], name
        assert services[name]["environment"]["TORCHREVIEW_EXECUTOR_TOKEN_FILE"] == path, name
    assert [n for n, s in services.items() if "executor-token" in s.get("secrets", [])] == ["gpu-worker", "executor"]
    assert compose()["secrets"]["executor-token"] == {"file": "./executor-token"}
    assert "executor-token" in (DEPLOY / ".gitignore").read_text().split()
    reference = {"secretKeyRef": {"name": "torchreview-executor", "key": "token"}}
    for name in ("executor.yaml", "gpu-worker.yaml"):
        deployment = next(d for d in load(name) if d["kind"] == "Deployment")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert {"name": "TORCHREVIEW_EXECUTOR_TOKEN", "valueFrom": reference} in container["env"], name
    secrets = {d["metadata"]["name"] for d in load("secret.yaml")}
    assert secrets == {"torchreview-github", "torchreview-executor"}


def test_the_executor_container_has_memory_and_process_limits():
    """Where the sandbox cannot use cgroups of its own, the container's limits bound what a run escapes the
    sandbox's rlimits with (GPU runs' shared memory, kernel memory): issue 23, item 7."""
    executor = compose()["services"]["executor"]
    assert executor["deploy"]["resources"]["limits"]["memory"] == "16g" and executor["pids_limit"] > 0
    deployment = next(d for d in load("executor.yaml") if d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["memory"] == "16Gi"
