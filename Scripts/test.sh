#!/usr/bin/env bash
# Quick start, command 2: run every test. CI (.ci/run) calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash Scripts/bootstrap.sh
swift build --build-tests
swift test --skip-build "$@"
# A third-party fuzzer against a real server and Docs/openapi.json (a fixed seed, bounded examples).
# Only for the whole suite: a filtered `Scripts/test.sh --filter X` runs just those tests.
if [ "$#" -eq 0 ]; then
    bash Scripts/schemathesis.sh
fi
