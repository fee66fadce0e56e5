#!/usr/bin/env bash
# Before/after on PostgreSQL, one node, in one session: the release build of the base (720bf51, built from
# `git archive 720bf51` in BASE) and of this branch, alternated, with the table's arguments.
set -u
cd "$(dirname "$0")/../../../.."
out=Docs/results/2026-12-02/pg-release/ab
mkdir -p "$out"
URL=${URL:?}; BASE=${BASE:?}
common=(--clients 4 --batches 2,200 --records 4000 --pull-records 0 --wire binary --seconds 20 --ceiling-rows 20000 --timeout 900)
run() {
    local name=$1 bin=$2
    echo "== $name $(date -u +%H:%M:%S) load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/load.txt"
    "$bin" sync "${common[@]}" --database "$URL" --nodes 1 --jsonl "$out/$name.jsonl" > /dev/null 2> "$out/$name.stderr"
    echo "   exit $? $(date -u +%H:%M:%S) load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/load.txt"
}
for round in 1 2; do
    run "pgperf-$round" .build/release/lattice-bench
    run "base-$round" "$BASE/.build/release/lattice-bench"
done
