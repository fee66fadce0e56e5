#!/usr/bin/env bash
# Quick start, command 1: a scripted, visible demo on the embedded SQLite default.
#   1. start a server in the background   2. alice creates a list and shares it   3. bob accepts the URL
#   4. both edit offline   5. both sync   6. both print the same merged list   7. the server stops
set -euo pipefail
cd "$(dirname "$0")/.."
bash Scripts/bootstrap.sh
swift build -c release --product lattice 2>&1 | tail -n 1
lattice=$(swift build -c release --show-bin-path)/lattice

work=$(mktemp -d)
server_pid=""
cleanup() {
    if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then kill -TERM "$server_pid"; wait "$server_pid" || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

bold=""; plain=""
if [[ -t 1 ]]; then bold=$(tput bold 2>/dev/null || true); plain=$(tput sgr0 2>/dev/null || true); fi
step() { printf '\n%s== %s%s\n' "$bold" "$*" "$plain"; }
# Shows a command as the person would type it (`lattice` for the binary; whose device in a comment), then runs it.
shown() {
    local out="" arg
    for arg in "$@"; do
        if [[ "$arg" =~ [[:space:]] ]]; then out+=" \"$arg\""; else out+=" $arg"; fi
    done
    printf '%s' "${out# }"
}
alice() { printf '%s$ lattice %s%s   # alice\n' "$bold" "$(shown "$@")" "$plain"; "$lattice" "$@" --home "$work/alice"; }
bob() { printf '%s$ lattice %s%s   # bob\n' "$bold" "$(shown "$@")" "$plain"; "$lattice" "$@" --home "$work/bob"; }

step "1. start a server (SQLite under a temporary data directory), in the background"
printf '%s$ lattice serve --data %s --port 0 --access-log %s/access.log &%s\n' "$bold" "$work/server" "$work" "$plain"
"$lattice" serve --data "$work/server" --port 0 --access-log "$work/access.log" > "$work/server.out" 2> "$work/server.err" &
server_pid=$!
for _ in $(seq 1 100); do [[ -s "$work/server.out" ]] && break; sleep 0.1; done
read -r _ _ server < "$work/server.out"
echo "listening on $server"

step "2. alice signs up, creates a list and shares it with a read-write URL"
alice signup alice --server "$server" > /dev/null && echo "signed up alice"
alice list create Groceries
alice list add Groceries "Milk" --tag dairy
alice list add Groceries "Eggs"
alice share create Groceries --public-permission read-write
url=$("$lattice" share url Groceries --json --home "$work/alice" | python3 -c 'import json, sys; print(json.load(sys.stdin)["url"])')
printf '%s$ lattice share url Groceries%s   # alice\n%s\n' "$bold" "$plain" "$url"

step "3. bob signs up and accepts the URL"
bob signup bob --server "$server" > /dev/null && echo "signed up bob"
bob accept "$url" --yes

step "4. both edit offline (--no-sync): the same item's text on both sides, a tag removed by one and added by the other"
alice list edit Groceries Milk --text "Oat milk" --remove-tag dairy --no-sync
alice list add Groceries "Coffee" --no-sync
bob list edit Groceries Milk --text "Whole milk" --add-tag dairy --add-tag cold --no-sync
bob list check Groceries Eggs --no-sync

step "5. both sync"
alice sync
bob sync
alice sync

step "6. both print the same merged list"
alice list show Groceries
bob list show Groceries
items() { "$lattice" list show Groceries --json --home "$work/$1" | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["items"], sort_keys=True))'; }
if [[ "$(items alice)" == "$(items bob)" ]]; then
    echo "the same items on both devices (ids, text, done, tags, positions: list show --json compared)"
else
    echo "the devices differ"; exit 1
fi
alice explain Groceries "Whole milk" text
alice explain Groceries "Whole milk" tags

step "7. stop the server (SIGTERM: in-flight requests finish, the database closes cleanly)"
kill -TERM "$server_pid"
wait "$server_pid"
server_pid=""
cat "$work/server.err"
