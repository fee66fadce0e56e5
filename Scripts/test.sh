#!/usr/bin/env bash
# Quick start, command 2: run every test. CI (.ci/run) calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash Scripts/bootstrap.sh
swift build --build-tests
swift test --skip-build "$@"
