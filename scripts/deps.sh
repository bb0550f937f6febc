#!/usr/bin/env bash
# Install what kvrouter needs to build, test and run, from Debian's packages (apt-get), when
# missing. Idempotent; needs root (or sudo) on a machine where something is missing.
set -euo pipefail

packages=(
  gcc libc6-dev pkg-config meson ninja-build
  libnats-dev nats-server
  libprotobuf-c-dev protobuf-c-compiler
  libxxhash-dev uthash-dev libcriterion-dev libjansson-dev
  libmicrohttpd-dev     # src/net/httpd.c: /metrics, /healthz, /readyz
  libevent-dev          # src/net/loop.c: the router reads its requests connection on its own thread
  libcurl4-openssl-dev libzmq3-dev libmsgpack-dev  # the worker adapter and the engine stand-in
  python3-msgpack       # tests/fixtures/kvevents/make.py: the independent encoder of the fixtures
  prometheus            # promtool (tests/unit/test_prom.c: promtool check metrics)
  valgrind clang-format gnuplot-nox curl procps
  openssl               # tests/pki/make-pki.sh: the integration tests' CA and certificates
  clang libclang-rt-dev # scripts/test.sh's fuzz stage: clang and its libFuzzer/ASan runtimes
  nodejs                # scripts/test.sh's js stage (tests/js), with npm:
)
# Debian's npm, unless the nodejs installed brings its own (NodeSource's nodejs does, and
# conflicts with Debian's npm package)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
# Packages with a daemon (prometheus, nats-server) start it on install where an init system runs:
# the tests start their own on 127.0.0.1, so none is started here (policy-rc.d's "101: not
# allowed", which invoke-rc.d and deb-systemd-invoke obey), unless the machine has its own policy.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
  $sudo chmod 755 /usr/sbin/policy-rc.d
  trap '$sudo rm -f /usr/sbin/policy-rc.d' EXIT
fi
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# ... nor at the next boot: the packages enable their services (Debian's prometheus would listen
# on every interface, unauthenticated). Only those this run installed; a machine's own are left.
for svc in nats-server prometheus; do
  [[ " ${missing[*]} " == *" $svc "* ]] || continue
  if command -v systemctl >/dev/null 2>&1; then
    $sudo systemctl disable "$svc" >/dev/null 2>&1 ||
      $sudo rm -f "/etc/systemd/system/multi-user.target.wants/$svc.service"
  fi
  command -v update-rc.d >/dev/null 2>&1 && $sudo update-rc.d "$svc" disable >/dev/null 2>&1 || true
done
