#!/usr/bin/env bash
# Fuzzes a real `lattice serve` against Docs/openapi.json with schemathesis, a third-party fuzzer from PyPI.
#
# Installs schemathesis (pinned) into a venv under .build if it is missing, starts the debug `lattice`
# binary from the build on a throwaway data directory (127.0.0.1, a free port), signs up for a bearer token,
# and runs a fixed seed with a bounded number of examples per operation and these checks:
# not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance.
# Exits non-zero on any failure. Scripts/test.sh calls it after `swift test`.
#
# Settings (examples per operation, timeouts, the long-poll override) are in Scripts/schemathesis.toml.
# Environment: SCHEMATHESIS_SEED (default 20261201), LATTICE_BIN (default: the debug build's lattice).
set -euo pipefail
cd "$(dirname "$0")/.."

version=4.32.5
venv=.build/venv-schemathesis
seed=${SCHEMATHESIS_SEED:-20261201}

if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "version $version\$"; then
    echo "schemathesis: installing schemathesis==$version into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$version"
fi

binary=${LATTICE_BIN:-$(swift build --show-bin-path)/lattice}
[ -x "$binary" ] || { echo "schemathesis: no lattice binary at $binary (run swift build first)" >&2; exit 1; }

work=$(mktemp -d /tmp/lattice-schemathesis.XXXXXX)
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then kill -TERM "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

mkfifo "$work/out"
# --auth-failures-per-minute 0: the fuzzer sends bad tokens on purpose, and throttling its address would
# answer most later requests 429 and leave the operations behind them unfuzzed (the throttle has its own
# tests: AbuseLimitTests and the attack suite).
"$binary" serve --data "$work/data" --host 127.0.0.1 --port 0 --auth-failures-per-minute 0 >"$work/out" 2>"$work/server.log" &
server_pid=$!
exec 3<"$work/out"
# The first line is "listening on http://127.0.0.1:PORT" (bounded wait).
if ! read -r -t 30 line <&3; then
    echo "schemathesis: lattice serve did not start:" >&2; cat "$work/server.log" >&2; exit 1
fi
url=${line#listening on }
case "$url" in http://127.0.0.1:*) ;; *) echo "schemathesis: unexpected first line: $line" >&2; exit 1 ;; esac

# sign_up NAME: a new account's bearer token.
sign_up() {
    "$venv/bin/python" - "$url" "$1" <<'PY'
import json, sys, urllib.request
request = urllib.request.Request(sys.argv[1] + "/auth/signup", data=json.dumps({"name": sys.argv[2]}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
with urllib.request.urlopen(request, timeout=10) as response:
    print(json.load(response)["token"])
PY
}
# token_works TOKEN: exit 0 when the server still takes the token (users/current answers 200).
token_works() {
    "$venv/bin/python" - "$url" "$1" <<'PY'
import sys, urllib.error, urllib.request
request = urllib.request.Request(sys.argv[1] + "/database/1/lattice/development/private/users/current", data=b"{}",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + sys.argv[2]},
                                 method="POST")
try:
    with urllib.request.urlopen(request, timeout=10) as response:
        sys.exit(0 if response.status == 200 else 1)
except urllib.error.HTTPError as error:
    print(f"schemathesis: users/current answered {error.code} to the fuzzer's token", file=sys.stderr)
    sys.exit(1)
PY
}

echo "schemathesis $version: seed $seed, Scripts/schemathesis.toml, against $url" >&2
# Run from the throwaway directory: schemathesis and Hypothesis leave their state (.hypothesis) there.
root=$(pwd)
status=0
# fuzz NAME TOKEN SELECTION...: one schemathesis run with TOKEN over the operations SELECTION picks.
# --rate-limit: below the server's 200 requests/s per account, so the operations are fuzzed rather than
# answered 429 (which is also conformant, and still checked whenever it happens).
fuzz() {
    local name=$1 token=$2
    shift 2
    (cd "$work" && SCHEMATHESIS_HOOKS="$root/Scripts/schemathesis_hooks.py" "$root/$venv/bin/schemathesis" \
        --config-file "$root/Scripts/schemathesis.toml" run "$root/Docs/openapi.json" \
        --url "$url" \
        --header "Authorization: Bearer $token" \
        --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
        --seed "$seed" \
        --rate-limit 150/s \
        --workers 1 \
        --no-color "$@") 2>&1 | tee "$work/$name.log" || status=$?
}
# tokens/revoke generates {"current": true} and {"all": true}, which revoke the fuzzer's own token: every
# operation after that would get only 401 and go unfuzzed. So the run over every other operation comes
# first, its token is checked to still work, and tokens/revoke is fuzzed last with an account of its own.
main_token=$(sign_up fuzzer)
fuzz main "$main_token" --exclude-operation-id tokensRevoke
if ! token_works "$main_token"; then
    echo "schemathesis: the main run's token stopped working: its later operations were not fuzzed" >&2
    status=1
fi
fuzz revoke "$(sign_up fuzzer-revoke)" --include-operation-id tokensRevoke

# One closing line: the test cases that passed and those that failed or errored, over both runs.
passed=0
failed=0
for log in "$work/main.log" "$work/revoke.log"; do
    cases=$(grep -A1 '^Test cases:' "$log" | tail -n 1 || true)
    for count in $(grep -oE '[0-9]+ passed' <<<"$cases" | grep -oE '[0-9]+' || true); do
        passed=$((passed + count))
    done
    for count in $(grep -oE '[0-9]+ (failed|errored)' <<<"$cases" | grep -oE '[0-9]+' || true); do
        failed=$((failed + count))
    done
done
if [ "$status" -ne 0 ]; then
    echo "schemathesis: failures (exit $status); the server logged:" >&2
    tail -n 50 "$work/server.log" >&2
    [ "$failed" -gt 0 ] || failed=1
fi
echo "schemathesis: $passed passed, $failed failed"
exit "$status"
