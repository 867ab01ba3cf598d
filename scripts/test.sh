#!/usr/bin/env bash
# Set up (once) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests start their own redis-server on a free port; install it if this machine lacks it.
if ! command -v redis-server >/dev/null 2>&1; then
  echo "installing redis-server (the tests start a private one)" >&2
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq redis-server >/dev/null; fi
fi
source scripts/_venv.sh dev
python -m pytest -q "$@"
