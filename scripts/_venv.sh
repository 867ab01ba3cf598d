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
    *dev*|*runner*) source scripts/_torch.sh && install_torch ;;
  esac
  python -m pip install --quiet -e ".${extras:+[$extras]}"
  touch "$stamp"
fi
