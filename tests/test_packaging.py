"""The release as a user gets it (marker: packaging): scripts/release.sh builds the sdist and the wheel
from pyproject.toml's version, and the BUILT wheel (not an editable checkout) installs alone into a fresh
virtualenv, where the CLI, the Action's script and the language server work without the App's server
stack, IPython or torch, and the App's commands name the extra they need. Needs the package index for
`build` and the base dependencies (~30 s)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RELEASE = ROOT / "scripts" / "release.sh"
VERSION = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
# What the base install must not pull: the App's server stack, IPython, torch.
NOT_IN_BASE = {"flask", "celery", "kombu", "gunicorn", "sqlalchemy", "pygithub", "redis", "prometheus-client",
               "cryptography", "requests", "ipython", "torch", "numpy"}

pytestmark = pytest.mark.packaging


def _env(**extra) -> dict:
    # no PYTHONPATH / VIRTUAL_ENV: only what pip installed into the venv may be imported
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "NO_COLOR": "1", "COLUMNS": "200", **extra}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The release built by scripts/release.sh, and a fresh venv with only its wheel installed."""
    base = tmp_path_factory.mktemp("release")
    built = subprocess.run(["bash", str(RELEASE), "--outdir", str(base / "dist"), "--no-docker"], cwd=ROOT,
                           env=_env(), capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = base / "dist" / f"torchreview-{VERSION}-py3-none-any.whl"
    assert wheel.is_file() and (base / "dist" / f"torchreview-{VERSION}.tar.gz").is_file(), built.stdout
    assert "images: skipped (--no-docker)" in built.stdout
    environment = base / "venv"
    venv.EnvBuilder(with_pip=True).create(environment)
    python = environment / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    work = base / "work"  # run from a folder with no bot/ or analyzers/ of ours
    work.mkdir()
    return environment, work


def run(installed, *args, stdin=None):
    environment, work = installed
    return subprocess.run([str(environment / "bin" / args[0]), *args[1:]], cwd=work, env=_env(),
                          capture_output=True, text=True, timeout=300, input=stdin)


def test_the_built_wheel_installs_the_base_without_the_server_stack(installed):
    listed = run(installed, "python", "-m", "pip", "list", "--format", "json")
    names = {re.sub(r"[-_.]+", "-", p["name"]).lower() for p in json.loads(listed.stdout)}
    assert "torchreview" in names
    assert not names & NOT_IN_BASE, f"the base install pulled {sorted(names & NOT_IN_BASE)}"
    # installed from the wheel, not linked to this checkout
    where = run(installed, "python", "-c", "import bot, analyzers; print(bot.__file__, analyzers.__file__)")
    assert str(ROOT) not in where.stdout and "site-packages" in where.stdout, where.stdout + where.stderr


def test_the_cli_runs_from_the_built_wheel(installed):
    _, work = installed
    assert run(installed, "torchreview", "--version").stdout.strip() == f"torchreview {VERSION}"
    rules = run(installed, "torchreview", "rules", "--format", "json")
    assert rules.returncode == 0 and {"TR101", "TR601"} <= {r["id"] for r in json.loads(rules.stdout)}
    # a stable rule's finding (TR810) and a preview rule's (TR601): the levels (levels.json) ship in the wheel
    (work / "train.py").write_text("import torch\nstate = torch.load('model.pt')\nvalues = torch.symeig(a)\n")
    checked = run(installed, "torchreview", "check", "train.py", "--format", "json", "--no-cache")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert [f["rule"] for f in json.loads(checked.stdout)["findings"]] == ["TR810"]
    assert (installed[0] / "bin" / "torchreview-action").exists()  # the Action's step
    # the language server is in the base install
    lsp = run(installed, "python", "-c", "import bot.lsp, pygls; print('lsp ok')")
    assert lsp.stdout.strip() == "lsp ok", lsp.stderr


def test_a_notebook_in_ipython_syntax_names_the_notebooks_extra(installed):
    _, work = installed
    cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": source}
             for source in ("import torch\n", "%matplotlib inline\n", "state = torch.load('m.pt')\n")]
    (work / "explore.ipynb").write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                                    "nbformat_minor": 5}))
    checked = run(installed, "torchreview", "check", "explore.ipynb", "--no-cache", "--select", "TR601")  # preview
    assert checked.returncode == 1
    output = checked.stdout + checked.stderr
    assert "TR601" in output and "cell 2" in output and "pip install 'torchreview[notebooks]'" in output, output


@pytest.mark.parametrize("command, extra", [(["serve"], "app"), (["worker"], "app"),
                                            (["feedback", "export"], "app"), (["smoke", "model.py"], "runner"),
                                            (["demo"], "demo")])
def test_a_command_of_an_extra_names_the_extra(installed, command, extra):
    done = run(installed, "torchreview", *command)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"pip install 'torchreview[{extra}]'" in done.stderr and "Traceback" not in done.stderr, done.stderr


def _release_tree(tmp_path: Path, tag: str) -> Path:
    """The files release.sh reads before it builds anything, with the kustomization's tag set to ``tag``."""
    (tmp_path / "scripts").mkdir(parents=True)
    shutil.copy(RELEASE, tmp_path / "scripts" / "release.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    kustomization = tmp_path / "deploy" / "kubernetes" / "kustomization.yaml"
    kustomization.parent.mkdir(parents=True)
    text = (ROOT / "deploy" / "kubernetes" / "kustomization.yaml").read_text()
    kustomization.write_text(re.sub(r'newTag: "[^"]*"', f'newTag: "{tag}"', text))
    return tmp_path


def test_the_kustomization_tags_the_images_with_pyprojects_version():
    tags = set(re.findall(r'newTag: "([^"]*)"', (ROOT / "deploy" / "kubernetes" / "kustomization.yaml").read_text()))
    assert tags == {VERSION}


def test_release_stops_before_building_when_the_image_tag_is_another_version(tmp_path):
    tree = _release_tree(tmp_path, "9.9.9")
    done = subprocess.run(["bash", "scripts/release.sh", "--no-docker"], cwd=tree, env=_env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert f"tags the images '9.9.9', pyproject.toml says {VERSION}" in done.stderr
    assert not (tree / "dist").exists()


def test_release_requiring_docker_without_a_daemon_fails_before_building(tmp_path):
    tree = _release_tree(tmp_path / "tree", VERSION)
    stand_in = tmp_path / "bin"
    stand_in.mkdir()
    # a docker client whose daemon does not answer, as on this machine
    (stand_in / "docker").write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    (stand_in / "docker").chmod(0o755)
    env = _env(PATH=f"{stand_in}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(["bash", "scripts/release.sh", "--require-docker"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "its daemon does not answer" in done.stderr and "nothing was built" in done.stderr
    assert not (tree / "dist").exists()


def test_release_refuses_a_version_that_is_not_a_release(tmp_path):
    tree = _release_tree(tmp_path, VERSION)
    pyproject = tree / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(f'version = "{VERSION}"', 'version = "next"'))
    done = subprocess.run(["bash", "scripts/release.sh"], cwd=tree, env=_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "is 'next', not a release version" in done.stderr


def test_pip_installs_from_a_git_url_pinned_to_a_commit(tmp_path):
    """The README's `pip install 'torchreview @ git+https://...@COMMIT'`, with a local repository for the
    host (file://localhost/...: a URL requirement needs a host): pip clones it, checks out the commit and
    builds the base install from it."""
    from tests.test_precommit import snapshot_of_checkout

    repository = tmp_path / "repository"
    repository.mkdir()
    commit = snapshot_of_checkout(repository)
    environment = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(environment)
    python = environment / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                           f"torchreview @ git+file://localhost{repository}@{commit}"], env=_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    version = subprocess.run([str(environment / "bin" / "torchreview"), "--version"], env=_env(), cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == f"torchreview {VERSION}", version.stderr
    direct_url = subprocess.run([str(python), "-c", "from importlib.metadata import distribution; "
                                 "print(distribution('torchreview').read_text('direct_url.json'))"],
                                env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert json.loads(direct_url.stdout)["vcs_info"]["commit_id"] == commit
