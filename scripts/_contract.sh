# Sourced by the other scripts, inside the venv: GitHub's contract data (OpenAPI description, real webhook
# deliveries) for the emulator, fetched once with npm from pinned, hash-checked packages into .cache/.
apt_install_for npm npm "fetches GitHub's API description and webhook examples (npm pack)"
python -m github_emulator.contract
