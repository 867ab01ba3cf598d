#!/usr/bin/env bash
# Build a release from the one version number in pyproject.toml: the sdist and the wheel, then the
# Docker images torchreview:VERSION (the App: webhook and static workers, no torch) and
# torchreview-runner:VERSION (the GPU runner). `torchreview --version` reads the same number back from
# the installed package's metadata, so nothing else holds it; the Kubernetes kustomization names the
# image tag, and this script stops when it names another one.
#
#   bash scripts/release.sh [--outdir DIR] [--no-docker | --require-docker]
#
# Without a usable docker (none installed, or no daemon) the images are skipped, saying so, unless
# --require-docker. The packages build in a throwaway virtualenv with `build` from the package index.
set -euo pipefail
cd "$(dirname "$0")/.."

outdir=dist
docker_mode=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --outdir) outdir=${2:?--outdir needs a directory}; shift 2 ;;
    --outdir=*) outdir=${1#--outdir=}; shift ;;
    --no-docker) docker_mode=never; shift ;;
    --require-docker) docker_mode=required; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "release.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

version=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' pyproject.toml | head -n 1)
if ! [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$ ]]; then
  echo "release.sh: pyproject.toml's [project] version is '${version}', not a release version such as 1.2.3" >&2
  exit 1
fi
kustomization=deploy/kubernetes/kustomization.yaml
if [ -f "$kustomization" ]; then
  tags=$(sed -n 's/^ *newTag: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$kustomization" | sort -u)
  if [ "$tags" != "$version" ]; then
    echo "release.sh: $kustomization tags the images '$(echo $tags)', pyproject.toml says $version:" \
         "set its newTag to \"$version\"" >&2
    exit 1
  fi
fi
# Whether the images can be built, asked before the packages are: --require-docker fails fast.
docker_unusable=""
if [ "$docker_mode" != never ]; then
  if ! command -v docker >/dev/null 2>&1; then
    docker_unusable="docker is not installed"
  elif ! docker info >/dev/null 2>&1; then
    docker_unusable="docker is installed but its daemon does not answer (docker info)"
  fi
  if [ -n "$docker_unusable" ] && [ "$docker_mode" = required ]; then
    echo "release.sh: $docker_unusable; nothing was built (--require-docker)" >&2
    exit 1
  fi
fi
echo "== torchreview $version"

PYTHON=${PYTHON:-python3}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$PYTHON" -m venv "$scratch/build-env"
"$scratch/build-env/bin/python" -m pip install --quiet "build>=1.0"
mkdir -p "$outdir"
# The sdist first, then the wheel built from it: a file the sdist lacks fails the build here.
"$scratch/build-env/bin/python" -m build --outdir "$outdir" . >"$scratch/build.log" 2>&1 \
  || { cat "$scratch/build.log" >&2; echo "release.sh: the build failed" >&2; exit 1; }
sdist="$outdir/torchreview-$version.tar.gz"
wheel="$outdir/torchreview-$version-py3-none-any.whl"
for artifact in "$sdist" "$wheel"; do
  [ -f "$artifact" ] || { echo "release.sh: $artifact was not built (see $outdir/)" >&2; exit 1; }
done
# The wheel's own metadata carries the version `torchreview --version` will print.
"$PYTHON" - "$wheel" "$version" <<'PY'
import sys, zipfile
wheel, expected = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as archive:
    metadata = archive.read(f"torchreview-{expected}.dist-info/METADATA").decode()
    licensed = any(name.endswith("/LICENSE") for name in archive.namelist())
found = next(line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Version:"))
if found != expected or not licensed:
    sys.exit(f"release.sh: {wheel} says version {found} (expected {expected}), LICENSE included: {licensed}")
PY
echo "built $sdist"
echo "built $wheel"

if [ "$docker_mode" = never ]; then
  echo "images: skipped (--no-docker)"
elif [ -n "$docker_unusable" ]; then
  echo "images: NOT built: $docker_unusable. On a machine with docker: bash scripts/release.sh --require-docker" >&2
else
  docker build -f deploy/Dockerfile -t "torchreview:$version" .
  docker build -f deploy/Dockerfile --target runner -t "torchreview-runner:$version" .
  echo "built images torchreview:$version and torchreview-runner:$version"
fi
