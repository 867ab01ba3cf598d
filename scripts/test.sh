#!/usr/bin/env bash
# Set up (once) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_apt.sh
# The tests start their own redis-server on a free port.
apt_install_for redis-server redis-server "the tests start a private one" redis redis || exit 1
# gpu_runner.sandbox isolates PR code with bubblewrap; without it the tests only see the weaker fallbacks.
apt_install_for bwrap bubblewrap "the sandbox for pull-request code" - \
  || echo "going on without bubblewrap: the sandbox tests see only the weaker fallbacks" >&2
source scripts/_venv.sh dev
source scripts/_contract.sh
# Fails, naming them, when processes the tests started are still running after pytest has exited. The slowest
# tests are listed at the end: where the suite's time goes, in every CI log.
python -m tests.leftover_processes -- python -m pytest -q -n auto --durations=20 "$@"
