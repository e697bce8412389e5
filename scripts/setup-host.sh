#!/usr/bin/env bash
# Prepare a fresh Debian 12 machine for attnforge: Docker engine (started here), debootstrap, ccache, nox,
# Chromium and its driver (the index page's browser test).
# Idempotent: re-running only checks. Needs root (or sudo). Usage: bash scripts/setup-host.sh
set -euo pipefail

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

need_pkgs=()
[ -x /usr/bin/docker ] && command -v dockerd >/dev/null || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
command -v ccache >/dev/null || need_pkgs+=(ccache)
command -v ninja >/dev/null || need_pkgs+=(ninja-build)
command -v docker-registry >/dev/null || need_pkgs+=(docker-registry)
command -v htpasswd >/dev/null || need_pkgs+=(apache2-utils)
command -v shellcheck >/dev/null || need_pkgs+=(shellcheck)
# the glibc floor of aarch64 wheels (tests/unit/test_glibc_floor.py) and aarch64 cross builds
command -v aarch64-linux-gnu-g++ >/dev/null || need_pkgs+=(g++-aarch64-linux-gnu)
# the index page's browser test: headless Chromium driven through its WebDriver
command -v chromium >/dev/null || need_pkgs+=(chromium)
command -v chromedriver >/dev/null || need_pkgs+=(chromium-driver)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  echo "setup-host: installing ${need_pkgs[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if ! /usr/bin/docker info >/dev/null 2>&1; then
  echo "setup-host: starting dockerd (log: /var/log/attnforge-dockerd.log)"
  $SUDO bash -c 'setsid dockerd >/var/log/attnforge-dockerd.log 2>&1 < /dev/null &'
  for _ in $(seq 1 60); do
    /usr/bin/docker info >/dev/null 2>&1 && break
    sleep 1
  done
  /usr/bin/docker info >/dev/null 2>&1 || { echo "setup-host: dockerd did not start; see /var/log/attnforge-dockerd.log" >&2; exit 5; }
fi
echo "setup-host: docker engine $(/usr/bin/docker version --format '{{.Server.Version}}') is up"

PY="${ATTNFORGE_PYTHON:-python3}"
if ! command -v nox >/dev/null; then
  echo "setup-host: installing nox"
  "$PY" -m pip install -q nox
fi
echo "setup-host: ready ($(nox --version 2>&1 | head -1) on $("$PY" --version))"
