#!/usr/bin/env bash
# Set up (once) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# Install a Debian package when the command it provides is missing: apt_install_for COMMAND PACKAGE WHY
apt_install_for() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "installing $2 ($3)" >&2
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq "$2" >/dev/null
    else sudo apt-get update -qq && sudo apt-get install -y -qq "$2" >/dev/null; fi
  fi
}
# The tests start their own redis-server on a free port.
apt_install_for redis-server redis-server "the tests start a private one"
# gpu_runner.sandbox isolates PR code with bubblewrap; without it the tests only see the weaker fallbacks.
apt_install_for bwrap bubblewrap "the sandbox for pull-request code"
source scripts/_venv.sh dev
python -m pytest -q "$@"
