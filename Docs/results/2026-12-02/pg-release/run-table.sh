#!/usr/bin/env bash
# The issue-14 table again, release build of branch pgperf: SQLite one node; PostgreSQL 1, 2, 3 nodes;
# batches 2 and 200. RUN=runA|runB names the output folder; URL is the test cluster's
# (Scripts/postgres-test-cluster.sh start DIR prints it).
set -u
cd "$(dirname "$0")/../../../.."
out=Docs/results/2026-12-02/pg-release/${RUN:-runA}
mkdir -p "$out"
URL=${URL:?}
git rev-parse --short HEAD > "$out/commit.txt"
common=(--clients 4 --batches 2,200 --records 4000 --pull-records 0 --wire binary --seconds 20 --ceiling-rows 20000 --timeout 900)
run() {
    local name=$1; shift
    echo "== $name $(date -u +%H:%M:%S) load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/load.txt"
    .build/release/lattice-bench sync "${common[@]}" "$@" --jsonl "$out/$name.jsonl" > /dev/null 2> "$out/$name.stderr"
    echo "   exit $? $(date -u +%H:%M:%S) load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/load.txt"
}
run sqlite-1node
run postgres-1node --database "$URL" --nodes 1
run postgres-2nodes --database "$URL" --nodes 2
run postgres-3nodes --database "$URL" --nodes 3
