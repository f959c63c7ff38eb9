#!/usr/bin/env bash
# The browser the UI tests drive: Debian's Chromium at /usr/bin/chromium (Playwright launches it by path, so
# no browser is downloaded by Playwright). Installs it when missing; does nothing otherwise.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "devstack/browser.sh: /usr/bin/chromium is missing and apt-get is not available; install Chromium" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
# Another apt run (a second checkout installing at the same time) may hold the dpkg lock: wait for it.
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium
/usr/bin/chromium --version
