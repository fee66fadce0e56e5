#!/usr/bin/env bash
# Browser tests (issue 15): headless Debian Chromium driven by Selenium against a real `lattice serve`.
# Installs chromium and chromium-driver (apt) and selenium (pip, into .build/browser-venv) when missing,
# builds the lattice binary if needed, then runs Tests/BrowserTests/browser_tests.py. Screenshots go to
# Docs/images/ (SCREENSHOTS=DIR to change). Exit status: 0 when every browser test passed.
# Usage: Scripts/browser-tests.sh [-k TEXT]...   (-k: only the tests whose name contains TEXT, and the
# other suites, Tests/BrowserTests/*_tests.py, whose file name contains it)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    echo "browser-tests: installing chromium and chromium-driver"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y chromium chromium-driver >/dev/null || { apt-get update >/dev/null && apt-get install -y chromium chromium-driver >/dev/null; }
fi

venv=.build/browser-venv
if ! "$venv/bin/python" -c 'import selenium' 2>/dev/null; then
    echo "browser-tests: installing selenium into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet selenium
fi

bin=${LATTICE_BIN:-$(swift build --show-bin-path)/lattice}
if [[ ! -x "$bin" ]]; then
    swift build --product lattice
fi

export LATTICE_BIN="$bin" LATTICE_WEB="$PWD/Web" SCREENSHOTS="${SCREENSHOTS:-$PWD/Docs/images}"
status=0
timeout 1200 "$venv/bin/python" Tests/BrowserTests/browser_tests.py "$@" || status=1
# The other suites (every Tests/BrowserTests/*_tests.py), each with its own server; with -k only when a
# -k TEXT is part of the file's name.
for suite in Tests/BrowserTests/*_tests.py; do
    [ "$suite" = Tests/BrowserTests/browser_tests.py ] && continue
    if [ "$#" -gt 0 ]; then
        chosen=false
        for argument in "$@"; do [[ "$argument" != -k && "$suite" == *"$argument"* ]] && chosen=true; done
        $chosen || continue
    fi
    echo "browser-tests: $suite"
    timeout 900 "$venv/bin/python" "$suite" || status=1
done
exit $status
