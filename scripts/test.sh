#!/usr/bin/env bash
# Set up (once) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh dev
python -m pytest -q "$@"
