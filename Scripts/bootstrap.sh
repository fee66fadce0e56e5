#!/usr/bin/env bash
# Installs the Debian packages Lattice builds against, if any is missing. Safe to run repeatedly.
# Needs root (or sudo) only when something has to be installed.
set -euo pipefail

# With --tests also nginx: the reverse-proxy example (Docs/examples/nginx-lattice.conf) is tested against
# it. Its stock service is kept from starting while it is installed: the tests run their own nginx on
# 127.0.0.1, and installing the test tools must not leave a web server listening on port 80. The same
# goes for postgresql-15: the tests initdb a throwaway cluster of their own (Scripts/postgres-test-cluster.sh),
# and no system-wide cluster is started.
packages=(libsqlite3-dev libssl-dev libmicrohttpd-dev libpq-dev zlib1g-dev pkg-config)
if [ "${1:-}" = "--tests" ]; then packages+=(nginx postgresql-15 haproxy); fi
missing=()
for package in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$package")
    fi
done

if [ "${#missing[@]}" -gt 0 ]; then
    echo "bootstrap: installing ${missing[*]}" >&2
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        # Debian's invoke-rc.d asks this script whether to start services; 101 means "do not".
        policy=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
        $sudo chmod 755 "$policy"
        trap '$sudo rm -f "$policy"' EXIT
    fi
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v swift >/dev/null 2>&1; then
    echo "bootstrap: the Swift 6.3 toolchain is not on PATH (expected e.g. /opt/swift/usr/bin)" >&2
    exit 1
fi
