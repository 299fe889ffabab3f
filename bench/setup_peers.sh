#!/usr/bin/env bash
# The peers of bench/run.py and bench/latency.py: syslog-ng 3.38 (syslog-ng-core + syslog-ng-mod-http)
# and rsyslog 8.2302 (rsyslog + rsyslog-elasticsearch), from Debian, unpacked (never installed) into
# bench/peers/root. The two packages conflict (both Provide system-log-daemon), and neither may run as
# the host's logger here: the harness starts each as its own foreground process with its own config.
# Libraries they need that the host lacks are unpacked there too; the harness sets LD_LIBRARY_PATH.
# Idempotent: a second run does nothing. Needs apt-get (no root: `apt-get download` only fetches).
set -euo pipefail
cd "$(dirname "$0")"
PEERS="$PWD/peers"
ROOT="$PEERS/root"
STAMP="$ROOT/.complete"
PKGS=(syslog-ng-core syslog-ng-mod-http syslog-ng-scl rsyslog rsyslog-elasticsearch
      libivykis0 libnet1 libpcre3 libwrap0 libestr0 libfastjson4 liblognorm5)
if [ -e "$STAMP" ] && [ -x "$ROOT/usr/sbin/syslog-ng" ] && [ -x "$ROOT/usr/sbin/rsyslogd" ]; then
  exit 0
fi
mkdir -p "$PEERS/debs" "$ROOT"
cd "$PEERS/debs"
if ! apt-get download -qq "${PKGS[@]}" >/dev/null 2>&1; then
  apt-get update -qq >/dev/null 2>&1 || true
  apt-get download -qq "${PKGS[@]}" >/dev/null
fi
for deb in ./*.deb; do
  dpkg -x "$deb" "$ROOT"
done
# syslog-ng's own dependencies on libraries the host has (glib, json-c, curl) come from the host
LIBS="$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/lib/x86_64-linux-gnu:$ROOT/usr/lib/syslog-ng"
LD_LIBRARY_PATH="$LIBS" "$ROOT/usr/sbin/syslog-ng" --version >/dev/null
LD_LIBRARY_PATH="$LIBS" "$ROOT/usr/sbin/rsyslogd" -v >/dev/null
touch "$STAMP"
