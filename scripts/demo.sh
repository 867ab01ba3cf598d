#!/usr/bin/env bash
# Set up (once) and watch torchreview review a pull request: no GitHub account, no Redis needed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_apt.sh
# The smoke runner isolates PR code with bubblewrap; without it, it degrades with a warning.
apt_install_for bwrap bubblewrap "the sandbox for pull-request code" || echo "no bubblewrap: the sandbox degrades" >&2
source scripts/_venv.sh demo,runner
source scripts/_contract.sh
torchreview demo
echo
echo "== the same engine as a CLI: torchreview check examples/"
status=0
torchreview check examples/ || status=$?
# 1 means "findings at or above fail_on", which is the point of the examples
if [ "$status" -gt 1 ]; then exit "$status"; fi
echo
echo "More: .venv/bin/torchreview rules   (every rule)   .venv/bin/torchreview rule TR101   (one rule's docs)"
