# Sourced by the other scripts. Install a Debian package when the command it provides is missing:
# apt_install_for COMMAND PACKAGE WHY
apt_install_for() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "installing $2 ($3)" >&2
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq "$2" >/dev/null
    else sudo apt-get update -qq && sudo apt-get install -y -qq "$2" >/dev/null; fi
  fi
}
