# Sourced by scripts/_venv.sh, inside the venv: torch for the smoke runner, pinned, installed before the
# extras that need it (a looser requirement resolved from scratch pulls GBs of CUDA wheels).
#   TORCHREVIEW_TORCH=cpu   (default) the CPU build (~200 MB)
#   TORCHREVIEW_TORCH=cuda  the default build of the package index: CUDA on Linux x86_64 (several GB)
TORCH_VERSION=2.13.0
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

# What pip's configured sources (pip.conf's index, find-links, a local wheel cache) would install for
# torch, asked without installing it: a +cpu local version is already the CPU build.
torch_configured_is_cpu() {
  python -m pip install --dry-run --quiet --no-deps --ignore-installed --report - "torch==$TORCH_VERSION" \
      2>/dev/null \
    | python -c 'import json, sys
report = json.load(sys.stdin)
sys.exit(0 if any("+cpu" in item["metadata"]["version"] for item in report["install"]) else 1)'
}

# The arguments of `pip install` for the torch asked for, one a line.
torch_pip_args() {
  case "${TORCHREVIEW_TORCH:-cpu}" in
    cuda) ;;
    cpu)
      # macOS and Windows wheels of the default index are CPU builds already; on Linux they are CUDA
      # builds, unless the configured sources serve a CPU one (a mirror, a local wheel cache)
      if [ "$(uname -s)" = Linux ] && ! torch_configured_is_cpu; then
        printf '%s\n' --index-url "$TORCH_CPU_INDEX"
      fi ;;
    *) echo "TORCHREVIEW_TORCH is '${TORCHREVIEW_TORCH}': cpu (the default) or cuda" >&2; return 2 ;;
  esac
  printf '%s\n' "torch==$TORCH_VERSION"
}

install_torch() {
  local installed
  installed=$(python -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
  if [ "${installed%%+*}" = "$TORCH_VERSION" ]; then
    return 0  # to change builds: python -m pip uninstall torch, then TORCHREVIEW_TORCH=... again
  fi
  local args
  args=$(torch_pip_args) || return
  echo "installing torch $TORCH_VERSION (${TORCHREVIEW_TORCH:-cpu}): pip install $(echo $args)" >&2
  # shellcheck disable=SC2086  # one argument a line, none with spaces
  python -m pip install --quiet $args
}
