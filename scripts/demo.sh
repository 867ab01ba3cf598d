#!/usr/bin/env bash
# Set up (once) and watch torchreview review pull requests: no GitHub account, no Redis needed.
# On a first run the static review (no torch needed) runs as soon as the base package is installed;
# torch (a ~200 MB wheel, for the smoke runner) is installed after it, then the smoke part runs. Once
# torch is there, both parts run in one go.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_apt.sh
source scripts/_venv.sh demo
source scripts/_contract.sh
part=all
if ! python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)'; then
  # First run: the static review needs no torch, so it runs before the big download.
  torchreview demo --part static
  echo
  echo "== next, the GPU runner smoke-trains the changed models: installing torch 2.13.0 (CPU wheel, ~200 MB) into .venv"
  part=smoke
fi
# The smoke runner isolates PR code with bubblewrap; without it, it degrades with a warning.
apt_install_for bwrap bubblewrap "the sandbox for pull-request code" || echo "no bubblewrap: the sandbox degrades" >&2
source scripts/_venv.sh demo,runner
torchreview demo --part "$part"

echo
echo "== the same engine as a CLI: torchreview check examples/"
status=0
torchreview check examples/ || status=$?
# 1 means "findings at or above fail_on", which is the point of the examples
if [ "$status" -gt 1 ]; then exit "$status"; fi
echo
echo "More: .venv/bin/torchreview rules   (every rule)   .venv/bin/torchreview rule TR101   (one rule's docs)"
