#!/usr/bin/env bash
# Runs workload lww-orset-v1 through Lattice and through the peers (Loro, Yrs via pycrdt) in one run on
# this machine, and prints a Markdown table of the summary lines.
#
#   Benchmarks/side-by-side.sh RECORDS [REPS] [OUT_DIR]
#
# Needs the peer script (PEER_SCRIPT, default ../shared/bench/peer_merge_bench.py) and a Python with
# loro and pycrdt (PEER_PYTHON, default /tmp/peers/bin/python; create it with
#   python3 -m venv /tmp/peers && /tmp/peers/bin/pip install loro pycrdt).
# PEERS=none skips the peers (Lattice only).
set -euo pipefail
cd "$(dirname "$0")/.."
records=${1:?usage: Benchmarks/side-by-side.sh RECORDS [REPS] [OUT_DIR]}
reps=${2:-3}
out=${3:-/tmp/lattice-side-by-side}
peer_script=${PEER_SCRIPT:-../shared/bench/peer_merge_bench.py}
peer_python=${PEER_PYTHON:-/tmp/peers/bin/python}
peers=${PEERS:-loro,pycrdt}
mkdir -p "$out"

swift build -c release --product lattice-bench >/dev/null
.build/release/lattice-bench merge --records "$records" --reps "$reps" > "$out/lattice-$records.jsonl"
if [ "$peers" != "none" ]; then
    "$peer_python" "$peer_script" --records "$records" --reps "$reps" --peers "$peers" \
        > "$out/peers-$records.jsonl"
fi

python3 - "$out" "$records" <<'PY'
import glob, json, sys
out, records = sys.argv[1], sys.argv[2]
rows = []
for path in sorted(glob.glob(f"{out}/*-{records}.jsonl")):
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        if d.get("kind") == "summary":
            rows.append(d)
best = {}
for d in rows:
    if d["peer"] != "lattice":
        best[d["scenario"]] = max(best.get(d["scenario"], 0), d["median_field_merges_per_s"] or 0)
print(f"| records | scenario | peer | median field merges/s | min-max merge_s | median peak RSS MiB | verify | vs best peer |")
print("|---:|---|---|---:|---|---:|---|---:|")
for d in sorted(rows, key=lambda d: (d["scenario"], d["peer"])):
    ratio = ""
    if d["peer"] == "lattice" and best.get(d["scenario"]):
        ratio = f"{d['median_field_merges_per_s'] / best[d['scenario']]:.1f}x"
    print(f"| {records} | {d['scenario']} | {d['peer']} | {d['median_field_merges_per_s'] / 1e6:.3f} M | "
          f"{d['min_merge_s']:.4f}-{d['max_merge_s']:.4f} s | {d.get('median_peak_rss_mib', 0):.1f} | "
          f"{','.join(map(str, d.get('verify', [])))} | {ratio} |")
PY
