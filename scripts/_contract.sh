# Sourced by the other scripts, inside the venv: GitHub's contract data (OpenAPI description, real webhook
# deliveries) for the emulator, fetched once with npm from pinned, hash-checked packages into .cache/.
# npm is needed only to fetch it: once the data is current, `python -m github_emulator.contract` is a no-op.
if ! python -c 'import sys; from github_emulator.contract import contract_dir, is_current
sys.exit(not is_current(contract_dir()))' 2>/dev/null; then
  apt_install_for npm npm "npm pack fetches GitHub's API description and webhook examples, once" node || return 1
fi
python -m github_emulator.contract
