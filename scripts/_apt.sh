# Sourced by the other scripts. A system command they need, installed with apt-get where this is Debian or
# Ubuntu and we may (root, or sudo). Elsewhere (macOS, another Linux, no root) it says exactly what to
# install and returns 1, so that the caller decides whether it can go on without it.
#   apt_install_for COMMAND DEBIAN_PACKAGE WHY [HOMEBREW_FORMULA] [DNF_PACKAGE]
# HOMEBREW_FORMULA "-": none exists (a Linux-only tool); it and DNF_PACKAGE default to DEBIAN_PACKAGE.
apt_install_for() {
  local command=$1 package=$2 why=$3 formula=${4:-$2} dnf_package=${5:-$2}
  command -v "$command" >/dev/null 2>&1 && return 0
  local as_root=""  # how to run a command as root, when we may: nothing (we are root), or sudo
  if [ "$(id -u)" = 0 ]; then as_root=yes; elif command -v sudo >/dev/null 2>&1; then as_root=sudo; fi
  if command -v apt-get >/dev/null 2>&1 && [ -n "$as_root" ]; then
    echo "installing $package ($why)" >&2
    if _as_root "$as_root" apt-get update -qq && _as_root "$as_root" apt-get install -y -qq "$package" >/dev/null \
        && command -v "$command" >/dev/null 2>&1; then
      return 0
    fi
    echo "apt-get could not install $package" >&2
  fi
  {
    echo "torchreview: '$command' is missing ($why)."
    if [ "$(uname -s)" = Darwin ]; then
      if [ "$formula" = - ]; then echo "  There is none for macOS (it is Linux-only)."
      else echo "  Install it with Homebrew (https://brew.sh): brew install $formula"; fi
    elif command -v apt-get >/dev/null 2>&1; then
      echo "  Install it as root: apt-get install $package"
    elif command -v dnf >/dev/null 2>&1; then
      echo "  Install it as root: dnf install $dnf_package"
    elif [ "$package" = "$dnf_package" ]; then
      echo "  Install the package $package with the system's package manager."
    else
      echo "  Install it with the system's package manager: $package (Debian/Ubuntu), $dnf_package (Fedora/RHEL)."
    fi
    if [ "$(uname -s)" != Darwin ] && [ -z "$as_root" ]; then
      echo "  Without root or sudo: ask an administrator to, or put a '$command' of your own on PATH."
    fi
  } >&2
  return 1
}

# _as_root yes|sudo COMMAND...: COMMAND as root (no arrays: macOS's bash 3.2 with set -u has no empty ones)
_as_root() {
  if [ "$1" = sudo ]; then shift; sudo "$@"; else shift; "$@"; fi
}
