#!/usr/bin/env bash
# Quick start, command 2: run every test. CI (.ci/run) calls exactly this.
# With arguments (say `--filter X`) it runs just those Swift tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash Scripts/bootstrap.sh --tests
swift build --build-tests
if [ "$#" -gt 0 ]; then
    swift test --skip-build "$@"
    exit 0
fi
# The attack suite measures probe latency, so it runs alone, after the rest.
LATTICE_ATTACK_SUITE=skip swift test --skip-build
swift test --skip-build --filter AttackSuiteTests
# A third-party fuzzer against a real server and Docs/openapi.json (a fixed seed, bounded examples).
bash Scripts/schemathesis.sh
