#!/usr/bin/env bash
# Set up (once) and run torchreview on the bundled examples: no GitHub account, no Redis needed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh demo
echo "== torchreview check examples/"
status=0
torchreview check examples/ || status=$?
# 1 means "findings at or above fail_on", which is the point of the examples
if [ "$status" -gt 1 ]; then exit "$status"; fi
echo
echo "Try: .venv/bin/torchreview rule TR101   (docs of one rule)   .venv/bin/torchreview rules   (all rules)"
