#!/usr/bin/env python3
"""Prints the Benchmarks.md rows of one run folder (run-table.sh output): push ÷ the same run's SQLite push."""
import json, sys
folder = sys.argv[1]
sqlite = {}
for name, storage, nodes in [('sqlite-1node', 'SQLite', 1), ('postgres-1node', 'PostgreSQL', 1),
                             ('postgres-2nodes', 'PostgreSQL', 2), ('postgres-3nodes', 'PostgreSQL', 3)]:
    lines = [json.loads(line) for line in open(f'{folder}/{name}.jsonl')]
    ceiling = {d['batch']: d['records_per_s'] for d in lines if d.get('scenario') == 'ceiling'}
    for d in lines:
        if d.get('kind') != 'measurement' or d.get('scenario') == 'ceiling':
            continue
        batch = d['batch']
        if storage == 'SQLite':
            sqlite[batch] = d['records_per_s']
        print(f"| | {storage} | {nodes} | {batch} | {round(d['records_per_s']):,} | {round(d['requests_per_s']):,} "
              f"| {d['p50_ms']:.1f} / {d['p99_ms']:.1f} | {round(ceiling[batch]):,} | {d['records_per_s'] / sqlite[batch]:.2f} |"
              f" rejected={d.get('records_rejected')} unacknowledged={d.get('records_unacknowledged')} http_errors={d.get('http_errors')}")
