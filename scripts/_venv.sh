# Sourced by the other scripts: create .venv if needed and install the project (plus extras in $1).
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
extras=${1:-}
stamp=".venv/.installed-${extras:-base}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  python -m pip install --quiet --upgrade pip
  case "$extras" in
    # torch first, pinned: a looser requirement resolved from scratch pulls GBs of CUDA wheels
    *dev*|*runner*) python -m pip install --quiet "torch==2.13.0" ;;
  esac
  python -m pip install --quiet -e ".${extras:+[$extras]}"
  touch "$stamp"
fi
