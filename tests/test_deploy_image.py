"""deploy/Dockerfile's pip steps, replayed without docker (marker: packaging).

The images install offline (``--no-index --find-links /wheels``) from the wheels the ``build`` stage
makes, so a dependency missing from that set only shows when the image is built. This test reads the
Dockerfile's own pip commands and runs them on this machine: the build stage's ``pip wheel`` into a
temporary directory, the runner's torch step as a ``pip download`` (this machine's pip configuration
serves a local CPU build), then each stage's offline install as a ``--dry-run --ignore-installed``
resolve from those directories alone, with pip's configuration files and variables cleared so nothing
else can satisfy a requirement. About 15 s with a warm pip cache; it needs the package index.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pathspec
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"

pytestmark = pytest.mark.packaging


def dockerfile_steps(text: str) -> tuple[dict[str, str], dict[str, list[list[str]]]]:
    """ARG defaults, and each stage's pip commands (``&&``-separated parts of its RUN lines) as argv."""
    logical, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        current += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            logical.append(current.strip())
            current = ""
    args: dict[str, str] = {}
    stages: dict[str, list[list[str]]] = {}
    stage = None
    for instruction in logical:
        keyword, _, rest = instruction.partition(" ")
        keyword = keyword.upper()
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args.setdefault(name.strip(), value.strip())
        elif keyword == "FROM":
            stage = rest.split()[-1]
            stages[stage] = []
        elif keyword == "RUN" and stage is not None:
            command = re.sub(r"^(--\S+\s+)+", "", rest)  # BuildKit flags such as --mount=...
            for part in command.split("&&"):
                argv = shlex.split(re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), part))
                if argv[:3] == ["python", "-m", "pip"]:
                    argv = argv[3:]
                elif argv[:1] == ["pip"]:
                    argv = argv[1:]
                else:
                    continue
                stages[stage].append(argv)
    return args, stages


def build_context(destination: Path) -> Path:
    """The repository as docker's build context sees it (Dockerfile.dockerignore applied)."""
    ignore = pathspec.PathSpec.from_lines(
        "gitignore", (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().splitlines())
    for directory, dirs, files in os.walk(ROOT):
        relative = Path(directory).relative_to(ROOT)
        dirs[:] = [d for d in dirs if not ignore.match_file((relative / d).as_posix() + "/")]
        for name in files:
            if not ignore.match_file((relative / name).as_posix()):
                target = destination / relative / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(directory) / name, target)
    return destination


def pip(argv: list[str], cwd: Path, isolated: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if isolated:  # no config file, no PIP_* variable: only the directories on the command line count
        env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
    return subprocess.run([sys.executable, "-m", "pip", *argv], cwd=cwd, env=env, capture_output=True, text=True)


def offline_resolve(argv: list[str], wheels: Path, extra_dirs: list[Path], report: Path, cwd: Path) -> set[str]:
    """Run a stage's ``pip install --no-index --find-links /wheels ...`` as a resolve from our directories."""
    assert argv[0] == "install" and "--no-index" in argv, argv
    argv = [str(wheels) if a == "/wheels" else a for a in argv]
    command = ["install", "--dry-run", "--ignore-installed", "--report", str(report), *argv[1:]]
    for directory in extra_dirs:
        command += ["--find-links", str(directory)]
    done = pip(command, cwd, isolated=True)
    assert done.returncode == 0, f"pip {shlex.join(command)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return {re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower() for item in json.loads(report.read_text())["install"]}


def test_the_dockerfile_is_parsed_into_the_steps_this_test_replays():
    args, stages = dockerfile_steps(DOCKERFILE.read_text())
    assert args["TORCH_VERSION"] == "2.13.0"
    assert [argv[0] for argv in stages["build"]] == ["wheel", "wheel"]
    assert "--no-deps" in stages["build"][1]  # Lightning's packages, without the torch they require
    assert stages["runner"][0][0] == "install" and f"torch=={args['TORCH_VERSION']}" in stages["runner"][0]
    assert "--no-index" in stages["runner"][1] and "torchreview[runner]" in stages["runner"][1]
    assert "--no-index" in stages["app"][0] and "torchreview[app]" in stages["app"][0]


def test_the_image_stages_install_offline_from_the_wheel_set(tmp_path):
    args, stages = dockerfile_steps(DOCKERFILE.read_text())
    context = build_context(tmp_path / "context")
    wheels, torch_dir = tmp_path / "wheels", tmp_path / "torch"

    for argv in stages["build"]:  # pip wheel --wheel-dir /wheels ...
        argv = [str(wheels) if a == "/wheels" else a for a in argv]
        done = pip(argv, context)
        assert done.returncode == 0, f"pip {shlex.join(argv)}\n{done.stderr[-3000:]}"
    built = {p.name.split("-")[0].lower() for p in wheels.glob("*.whl")}
    assert "torchreview" in built and "numpy" in built
    assert "torch" not in built, "the build stage must not pull a (CUDA) torch into the shared wheel set"

    # The runner's first step installs torch (and only its own dependencies) from TORCH_INDEX_URL.
    torch_step = stages["runner"][0]
    torch_requirement = next(a for a in torch_step if a.startswith("torch=="))
    done = pip(["download", "--dest", str(torch_dir), torch_requirement], context)
    assert done.returncode == 0, done.stderr[-3000:]

    runner = offline_resolve(stages["runner"][1], wheels, [torch_dir], tmp_path / "runner.json", context)
    assert {"torchreview", "torch", "numpy", "celery", "prometheus-client", "lightning", "pytorch-lightning"} <= runner
    # what the code the runner runs imports at module level (einops in models, pandas and scipy in training scripts)
    assert {"einops", "pandas", "scipy"} <= runner
    app = offline_resolve(stages["app"][0], wheels, [], tmp_path / "app.json", context)
    # the App's server stack comes with its extra, and IPython for notebooks in its syntax; the webhook and
    # static workers never need torch
    assert {"torchreview", "flask", "celery", "gunicorn", "pygithub", "redis", "ipython"} <= app
    assert "torch" not in app
