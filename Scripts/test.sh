#!/usr/bin/env bash
# Quick start, command 2: run every test. CI (.ci/run) calls exactly this.
# With arguments (say `--filter X`) it runs just those Swift tests (the throwaway PostgreSQL cluster below
# is started for them too).
#
# Order: the suite on the SQLite default (without the attack suite and the multi-node tests); the server
# suites that matter for correctness once more on PostgreSQL (LATTICE_TEST_BACKEND=postgres: each harness
# on a fresh database of the throwaway cluster); the multi-node tests and the haproxy test (always on
# PostgreSQL), each alone; the attack suite alone; schemathesis against a real server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash Scripts/bootstrap.sh --tests
# The tests' OpenID Connect provider needs joserfc (PyPI) in .build/oidc-venv.
bash Scripts/oidc-provider.sh --install-only
swift build --build-tests

# A throwaway PostgreSQL cluster (initdb as the postgres system user, a unix socket in a temporary directory,
# a free port, fsync on), stopped and removed on exit: also after a failure or Ctrl-C. A cluster named by
# LATTICE_TEST_POSTGRES_URL already is used instead (the tests make and drop databases of their own on it).
if [ -z "${LATTICE_TEST_POSTGRES_URL:-}" ]; then
    pg_dir=$(mktemp -d /tmp/lattice-pg.XXXXXX)
    stop_postgres() {
        bash Scripts/postgres-test-cluster.sh stop "$pg_dir" >/dev/null 2>&1 || true
        rm -rf "$pg_dir"
    }
    trap stop_postgres EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    LATTICE_TEST_POSTGRES_URL=$(bash Scripts/postgres-test-cluster.sh start "$pg_dir")
    export LATTICE_TEST_POSTGRES_URL
    echo "test.sh: PostgreSQL test cluster at $LATTICE_TEST_POSTGRES_URL" >&2
fi

if [ "$#" -gt 0 ]; then
    swift test --skip-build "$@"
    exit 0
fi

started=$SECONDS
phase() { echo "test.sh: $1 took $((SECONDS - started)) s" >&2; started=$SECONDS; }

# The attack suite measures probe latency, and the multi-node and haproxy tests load several servers and
# time wake-ups, so each runs alone, after the rest.
LATTICE_ATTACK_SUITE=skip swift test --skip-build --skip '(LatticeProcessTests\.MultiNodeTests|LatticeProxyTests\.HAProxyTests)/'
phase "the suite on SQLite"

# The same tests, not copies, on PostgreSQL: records, change feeds, limits, idempotency (the replay cache),
# sharing and the authorization matrix, the accept flow, crash recovery, end-to-end sync (real processes and
# the sync engine's in-process world).
# AuthorizationMatrixTests holds the sharing matrices (participant limits, links and the accept flow,
# revocation, moves, smuggling) as extensions.
# Which suites: those tagged `.postgres` (`@Suite(.tags(.postgres))`), not a list of names kept here, so
# renaming a suite cannot drop its PostgreSQL run. `swift test` has no tag filter, so
# Scripts/postgres-suites.sh finds the tagged suites in the source and prints the name filter; it fails (and
# this script with it) when a tag is not on a top-level suite or a tagged suite matches no built test.
postgres_suites=$(bash Scripts/postgres-suites.sh)
LATTICE_TEST_BACKEND=postgres LATTICE_ATTACK_SUITE=skip swift test --skip-build --filter "$postgres_suites"
phase "the correctness suites on PostgreSQL"

# Three `lattice serve` nodes on one PostgreSQL database; then haproxy in front of three.
swift test --skip-build --filter 'LatticeProcessTests\.MultiNodeTests/'
phase "the multi-node tests"
swift test --skip-build --filter 'LatticeProxyTests\.HAProxyTests/'
phase "the haproxy test"

swift test --skip-build --filter 'LatticeProcessTests\.AttackSuiteTests/'
phase "the attack suite"
# Headless Chromium against a real server: share pages, the web client, sessions (issue 15).
bash Scripts/browser-tests.sh
phase "the browser tests"
# A third-party fuzzer against a real server and Docs/openapi.json (a fixed seed, bounded examples).
bash Scripts/schemathesis.sh
phase "schemathesis"
