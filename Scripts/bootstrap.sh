#!/usr/bin/env bash
# Installs the Debian packages Lattice builds against, if any is missing. Safe to run repeatedly.
# Needs root (or sudo) only when something has to be installed.
set -euo pipefail

# nginx: the reverse-proxy example (Docs/examples/nginx-lattice.conf) is tested against it.
packages=(libsqlite3-dev libssl-dev libmicrohttpd-dev pkg-config nginx)
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
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v swift >/dev/null 2>&1; then
    echo "bootstrap: the Swift 6.3 toolchain is not on PATH (expected e.g. /opt/swift/usr/bin)" >&2
    exit 1
fi
