#!/usr/bin/env bash
# Set up (once) and watch torchreview review pull requests: no GitHub account, no Redis needed.
# On a first run the static review (no torch needed) runs as soon as the base package is installed;
# torch (a ~200 MB wheel, for the smoke runner) is installed after it, then the smoke part runs. Once
# torch is there, both parts run in one go. The smoke part runs pull-request code, so only in bubblewrap's
# sandbox (Linux): without it, the static part still runs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_apt.sh
source scripts/_venv.sh demo
if ! source scripts/_contract.sh; then
  # No GitHub data, so no emulator: what runs without it is the same engine as a CLI.
  echo "== the App's demo needs GitHub's contract data (above: what to install). Meanwhile, the engine as a CLI:" >&2
  .venv/bin/torchreview check examples/ || true
  exit 1
fi
part=all
if ! python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)'; then
  # First run: the static review needs no torch, so it runs before the big download.
  torchreview demo --part static
  part=smoke
fi
if ! apt_install_for bwrap bubblewrap "the sandbox for pull-request code" -; then
  if [ "${TORCHREVIEW_SANDBOX:-}" = weak ]; then
    echo "going on without bubblewrap: TORCHREVIEW_SANDBOX=weak runs the demo's code with the weaker fallbacks" >&2
  else
    echo "== the smoke part runs pull-request code only inside bubblewrap's sandbox: skipped here." \
         "TORCHREVIEW_SANDBOX=weak bash scripts/demo.sh runs it with the weaker fallbacks (trusted code only)." >&2
    case "$part" in all) part=static ;; smoke) part=none ;; esac
  fi
fi
if [ "$part" != static ] && [ "$part" != none ]; then
  if [ "$part" = smoke ]; then
    echo
    echo "== next, the GPU runner smoke-trains the changed models: installing torch 2.13.0 into .venv" \
         "(the CPU build, ~200 MB; TORCHREVIEW_TORCH=cuda for the CUDA one)"
  fi
  source scripts/_venv.sh demo,runner
fi
[ "$part" = none ] || torchreview demo --part "$part"

echo
# --preview: the rules the demo's repository opts into (its .github/torchreview.yml), so both show the same bugs
echo "== the same engine as a CLI: torchreview check --preview examples/"
status=0
torchreview check --preview examples/ || status=$?
# 1 means "findings at or above fail_on", which is the point of the examples
if [ "$status" -gt 1 ]; then exit "$status"; fi
echo
echo "More: .venv/bin/torchreview rules   (every rule)   .venv/bin/torchreview rule TR101   (one rule's docs)"
