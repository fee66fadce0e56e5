#!/usr/bin/env bash
# Runs the issue-14 table: SQLite one node; PostgreSQL 1, 2, 3 nodes; batches 2 and 200.
set -u
cd "$(dirname "$0")/../../.."
out=Docs/results/2026-12-02/${RUN:-run2}
URL=${URL:?}
common=(--clients 4 --batches 2,200 --records 4000 --pull-records 0 --wire binary --seconds 20 --ceiling-rows 20000 --timeout 900)
run() {
    local name=$1; shift
    echo "== $name $(date -u +%H:%M:%S) load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $out/load.txt
    .build/release/lattice-bench sync "${common[@]}" "$@" --jsonl $out/$name.jsonl > /dev/null 2> $out/$name.stderr
    echo "   exit $? $(date -u +%H:%M:%S) load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $out/load.txt
}
run sqlite-1node
run postgres-1node --database "$URL" --nodes 1
run postgres-2nodes --database "$URL" --nodes 2
run postgres-3nodes --database "$URL" --nodes 3
