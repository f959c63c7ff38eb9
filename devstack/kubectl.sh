#!/usr/bin/env bash
# kubectl for the Kubernetes deployment's test (`kubectl kustomize` renders deploy/kubernetes/ offline). Installs
# Debian's kubernetes-client when no kubectl is on PATH; does nothing otherwise.
set -euo pipefail
if command -v kubectl >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "devstack/kubectl.sh: kubectl is missing and apt-get is not available; install kubectl" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
# Another apt run (a second checkout installing at the same time) may hold the dpkg lock: wait for it.
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq kubernetes-client
kubectl version --client
