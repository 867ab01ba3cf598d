"""What each install costs: the base package, the App (``[app]``) and the smoke runner (``[runner]``), each
into a fresh virtualenv from the package index this machine's pip is configured with.

    python bench/install.py                       # base, app, runner; with pip's cache, then without it
    python bench/install.py --only base app --no-cold

The wheel is built once (``pip wheel --no-deps``) and installed from its file, as from a git URL or a
release. The runner's torch is pinned (``torch==2.13.0``) as scripts/_torch.sh pins it, so pip takes the
build the configured sources serve (a CPU one here). For each: seconds of ``pip install``, the packages
it added, and the megabytes the virtualenv grew by (an empty venv with pip is not counted). "warm" uses
pip's cache as it is (filled by the cold run or earlier installs); "cold" passes ``--no-cache-dir``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
EXTRAS = {"base": "", "app": "[app]", "runner": "[runner]"}


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True)


def build_wheel(directory: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir",
                           str(directory), str(ROOT)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"pip wheel failed:\n{done.stderr[-3000:]}")
    return next(directory.glob("torchreview-*.whl"))


def measure(wheel: Path, which: str, cold: bool, scratch: Path) -> dict:
    environment = scratch / f"{which}-{'cold' if cold else 'warm'}"
    venv.EnvBuilder(with_pip=True).create(environment)
    python = environment / "bin" / "python"
    before_size = _size(environment)
    before = {p["name"] for p in json.loads(_pip(python, "list", "--format", "json").stdout)}
    requirements = [f"{wheel}{EXTRAS[which]}"] + ([TORCH] if which == "runner" else [])
    started = time.perf_counter()
    done = _pip(python, "install", "--quiet", *(["--no-cache-dir"] if cold else []), *requirements)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"pip install {' '.join(requirements)} failed:\n{done.stderr[-3000:]}")
    after = {p["name"]: p["version"] for p in json.loads(_pip(python, "list", "--format", "json").stdout)}
    added = sorted(set(after) - before)
    row = {"install": which, "cache": "cold" if cold else "warm", "seconds": round(seconds, 1),
           "packages": len(added), "megabytes": round((_size(environment) - before_size) / 1e6, 1),
           "torch": after.get("torch", "")}
    shutil.rmtree(environment)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(EXTRAS), default=list(EXTRAS))
    parser.add_argument("--no-cold", action="store_true", help="only the warm runs (pip's cache as it is)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="torchreview-install-") as scratch:
        wheel = build_wheel(Path(scratch) / "wheel")
        for which in args.only:
            for cold in ([] if args.no_cold else [True]) + [False]:
                rows.append(measure(wheel, which, cold, Path(scratch)))
                if not args.json:
                    row = rows[-1]
                    print(f"{row['install']:7} {row['cache']:5} {row['seconds']:6.1f} s  {row['packages']:3} packages"
                          f"  {row['megabytes']:7.1f} MB  {row['torch']}", flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
