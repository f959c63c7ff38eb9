#!/usr/bin/env bash
# promtool, which checks deploy/prometheus/ in the tests: Debian's `prometheus` package at /usr/bin/promtool.
# Installs it when missing; does nothing otherwise. The package's server is not started (nothing runs it here).
set -euo pipefail
if [ -x /usr/bin/promtool ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "devstack/promtool.sh: /usr/bin/promtool is missing and apt-get is not available; install Prometheus" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
# Another apt run (a second checkout installing at the same time) may hold the dpkg lock: wait for it.
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends prometheus
/usr/bin/promtool --version
