"""The quick-start scripts' own logic beyond Debian with root: scripts/_apt.sh where apt-get, sudo or root
is missing (it says what to install and lets the caller go on), and scripts/_torch.sh's choice of torch
build (the CPU one unless TORCHREVIEW_TORCH=cuda, from the configured sources when they already serve a
CPU build). The system's package managers are stand-ins on PATH here: a test must not install packages
on the machine, and macOS is simulated through `uname`."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASH = shutil.which("bash")


def _bin(tmp_path: Path, **commands: str) -> Path:
    """A PATH directory holding only ``commands`` (name: shell script body) and the real ``uname``."""
    directory = tmp_path / "bin"
    directory.mkdir(exist_ok=True)
    if "uname" not in commands:
        (directory / "uname").symlink_to(shutil.which("uname"))
    for name, body in commands.items():
        (directory / name).write_text(f"#!{BASH}\n{body}\n")
        (directory / name).chmod(0o755)
    return directory


def apt_install_for(path: Path, *args: str) -> subprocess.CompletedProcess:
    script = 'source scripts/_apt.sh; apt_install_for "$@"'
    return subprocess.run([BASH, "-c", script, "apt", *args], cwd=ROOT, env={"PATH": str(path)},
                          capture_output=True, text=True, timeout=60)


NOT_ROOT = "echo 1000"
ARGS = ("redis-server", "redis-server", "the tests start a private one", "redis", "redis")


def test_a_command_already_there_is_left_alone(tmp_path):
    done = apt_install_for(_bin(tmp_path, **{"redis-server": "exit 0", "id": NOT_ROOT}), *ARGS)
    assert (done.returncode, done.stderr) == (0, "")


def test_rootless_linux_without_apt_or_sudo_is_told_what_to_install(tmp_path):
    done = apt_install_for(_bin(tmp_path, id=NOT_ROOT), *ARGS)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "torchreview: 'redis-server' is missing (the tests start a private one).",
        "  Install it with the system's package manager: redis-server (Debian/Ubuntu), redis (Fedora/RHEL).",
        "  Without root or sudo: ask an administrator to, or put a 'redis-server' of your own on PATH.",
    ]


def test_one_package_name_for_every_system_is_said_once(tmp_path):
    done = apt_install_for(_bin(tmp_path, id=NOT_ROOT), "bwrap", "bubblewrap", "the sandbox", "-")
    assert done.returncode == 1
    assert "  Install the package bubblewrap with the system's package manager." in done.stderr.splitlines()


def test_debian_without_root_or_sudo_names_the_apt_package_and_installs_nothing(tmp_path):
    calls = tmp_path / "apt-calls"
    done = apt_install_for(_bin(tmp_path, id=NOT_ROOT, **{"apt-get": f"echo \"$@\" >> {calls}; exit 0"}), *ARGS)
    assert done.returncode == 1 and not calls.exists()
    assert "  Install it as root: apt-get install redis-server" in done.stderr.splitlines()
    assert "Without root or sudo" in done.stderr


def test_fedora_names_the_dnf_package(tmp_path):
    done = apt_install_for(_bin(tmp_path, id="echo 0", dnf="exit 1"), *ARGS)
    assert done.returncode == 1
    assert "  Install it as root: dnf install redis" in done.stderr.splitlines()
    assert "Without root" not in done.stderr  # root could: it is told how


def test_macos_is_told_the_homebrew_formula_or_that_there_is_none(tmp_path):
    path = _bin(tmp_path, id=NOT_ROOT, uname="echo Darwin")
    done = apt_install_for(path, *ARGS)
    assert done.returncode == 1
    assert "  Install it with Homebrew (https://brew.sh): brew install redis" in done.stderr.splitlines()
    bwrap = apt_install_for(path, "bwrap", "bubblewrap", "the sandbox for pull-request code", "-")
    assert bwrap.returncode == 1 and "There is none for macOS (it is Linux-only)." in bwrap.stderr


def test_apt_that_fails_as_root_says_so_and_what_to_run(tmp_path):
    calls = tmp_path / "apt-calls"
    done = apt_install_for(_bin(tmp_path, id="echo 0", **{"apt-get": f"echo \"$@\" >> {calls}; exit 100"}), *ARGS)
    assert done.returncode == 1
    assert calls.read_text().splitlines() == ["update -qq"]
    assert done.stderr.splitlines()[:2] == ["installing redis-server (the tests start a private one)",
                                            "apt-get could not install redis-server"]


def test_sudo_installs_with_apt_where_the_user_is_not_root(tmp_path):
    calls, installed = tmp_path / "calls", tmp_path / "installed"
    installed.mkdir()
    # apt-get "installs" the command into the PATH directory, as the real one would into /usr/bin
    path = _bin(tmp_path, id=NOT_ROOT, sudo=f'echo "sudo $*" >> {calls}; exec "$@"',
                **{"apt-get": f'echo "apt-get $*" >> {calls}; '
                              f'[ "$1" = install ] && printf "#!{BASH}\\n" > {tmp_path}/bin/redis-server '
                              f'&& chmod +x {tmp_path}/bin/redis-server; exit 0'})
    done = apt_install_for(path, *ARGS)
    assert done.returncode == 0, done.stderr
    assert calls.read_text().splitlines() == ["sudo apt-get update -qq", "apt-get update -qq",
                                              "sudo apt-get install -y -qq redis-server",
                                              "apt-get install -y -qq redis-server"]


# ---- scripts/_torch.sh -----------------------------------------------------------------------------

def torch_pip_args(env: dict, path_first: Path | None = None) -> subprocess.CompletedProcess:
    # inside a venv, as _venv.sh sources it: `python` is the venv's
    path = os.pathsep.join(filter(None, [str(path_first) if path_first else "", str(Path(sys.executable).parent),
                                         os.environ["PATH"]]))
    return subprocess.run([BASH, "-c", "source scripts/_torch.sh; torch_pip_args"], cwd=ROOT,
                          env={**env, "PATH": path}, capture_output=True, text=True, timeout=300)


def _pip_env(**extra) -> dict:
    return {**{k: v for k, v in os.environ.items() if k != "TORCHREVIEW_TORCH"}, **extra}


def test_an_unknown_torch_build_is_refused():
    done = torch_pip_args(_pip_env(TORCHREVIEW_TORCH="rocm"))
    assert done.returncode == 2 and "TORCHREVIEW_TORCH is 'rocm': cpu (the default) or cuda" in done.stderr


def test_cuda_asked_for_is_the_default_index_build():
    done = torch_pip_args(_pip_env(TORCHREVIEW_TORCH="cuda"))
    assert (done.returncode, done.stdout.split()) == (0, ["torch==2.13.0"])


def test_macos_gets_the_default_index_build_which_is_cpu_there(tmp_path):
    done = torch_pip_args(_pip_env(), path_first=_bin(tmp_path, uname="echo Darwin"))
    assert (done.returncode, done.stdout.split()) == (0, ["torch==2.13.0"])


@pytest.mark.packaging
def test_the_cpu_build_comes_from_where_it_is_served():
    """On this machine pip's configuration serves a CPU wheel (+cpu) itself: no other index, so the
    scripts work offline from it. With pip's configuration cleared, the default index (pypi.org) serves a
    CUDA build on Linux, so the CPU index is added."""
    configured = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-deps",
                                 "--ignore-installed", "--report", "-", "torch==2.13.0"],
                                capture_output=True, text=True, timeout=300)
    serves_cpu = "+cpu" in configured.stdout
    done = torch_pip_args(_pip_env())
    assert done.returncode == 0, done.stderr
    if serves_cpu:
        assert done.stdout.split() == ["torch==2.13.0"]
    else:
        assert done.stdout.split() == ["--index-url", "https://download.pytorch.org/whl/cpu", "torch==2.13.0"]
    plain = _pip_env(PIP_CONFIG_FILE=os.devnull)
    plain = {k: v for k, v in plain.items() if not k.startswith("PIP_") or k == "PIP_CONFIG_FILE"}
    done = torch_pip_args(plain)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["--index-url", "https://download.pytorch.org/whl/cpu", "torch==2.13.0"]
