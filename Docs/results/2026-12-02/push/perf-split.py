#!/usr/bin/env python3
"""Splits `perf script` samples of lattice-bench push (or a server) into the parts of a push.
Only samples whose stack passes through the service's request handling count. Each sample goes to the
first category (innermost frame first) whose pattern its stack contains."""
import sys, re, collections
root = sys.argv[1] if len(sys.argv) > 1 else 'LatticeService'
cats = [
    ('commit (COMMIT, WAL write, fdatasync)', ['PagerCommitPhase', 'BtreeCommitPhase', 'fdatasync', 'sqlite3WalFrames', 'walCheckpoint']),
    ('record lookup (SELECT by key)', ['SQLiteTransactionV6record9zoneRowID4name', 'prefetchRecords']),
    ('insert (INSERT per record)', ['insertRecord']),
    ('saveRecords other (counters)', ['saveRecords']),
    ('answer JSON (build + serialize)', ['serializedBytes', 'JSONO5write', 'renderPush', 'PushAnswer']),
    ('replay copy (shortAnswer/remember)', ['shortAnswer', 'remember', 'clientOperation', 'compactPush']),
    ('plan + join per record', ['plan_4kind', 'PlannedWrite', 'join_4into']),
    ('writeBatch other (shares, log fan-out)', ['writeBatch']),
    ('pushDelta other', ['pushDelta']),
    ('prepare (validate delta, before lock)', ['preparePush', 'EncodedDelta', 'pushEnvelope']),
    ('write() other (node clock, touched)', ['raiseNodeClock', 'announceChanges', 'Service\w*5write8deadline']),
    ('transaction begin/other', ['Connection\w*11transaction']),
    ('routing, auth, rest', ['']),
]
counts = collections.Counter(); total = 0
sample = []
def flush():
    global total
    if not sample: return
    if not any(root in f for f in sample): return
    total += 1
    for name, pats in cats:
        hit = False
        for f in sample:
            if any(re.search(p, f) for p in pats): hit = True; break
        if hit: counts[name] += 1; return
for line in sys.stdin:
    if not line.strip():
        flush(); sample = []; continue
    if line.startswith((' ', '\t')):
        parts = line.strip().split(None, 1)
        if len(parts) == 2: sample.append(parts[1])
    else:
        flush(); sample = []
flush()
print(f'samples in the service: {total}')
for name, _ in cats:
    if counts[name]: print(f'{100*counts[name]/total:5.1f} %  {name}')
