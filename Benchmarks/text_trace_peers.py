#!/usr/bin/env python3
"""Replays editing traces through the peers of `lattice-bench text`: Loro and Yrs (pycrdt).

Usage: text_trace_peers.py --peer loro|pycrdt TRACE.json[.gz]

Prints one JSON line with the same measurements `lattice-bench text` makes for Lattice:
- sequential traces: every patch applied as a local edit, one transaction per trace transaction;
- concurrent traces: one replica per agent; each transaction's own operations are exported as an update
  (the peers' incremental sync); before a transaction the writing replica imports the updates its
  parents hold and it lacks; at the end every replica imports the rest;
then the final state is encoded (full state: Loro's snapshot, Yrs's update v1), loaded into a fresh
document, and merged into a document holding the state halfway through the trace.

The trace format and its credit: shared/bench/traces/README.md (CC BY 4.0, Joseph Gentle and the named
contributors). Positions count Unicode scalars; pycrdt counts UTF-8 bytes, so a trace with non-ASCII
text is converted (and says so).
"""
import argparse
import gc
import gzip
import json
import os
import sys
import time
from importlib.metadata import version


def peak_rss_kib():
    """This process's peak resident set (VmHWM). Not getrusage's ru_maxrss: on Linux that keeps the peak of
    the process this one was forked from (before its exec), so a large parent would show here."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return -1


def rss_kib():
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


class Loro:
    name = "loro"

    def __init__(self):
        import loro
        self.loro = loro
        self.version = version("loro")

    def new(self, agent=None):
        doc = self.loro.LoroDoc()
        if agent is not None:
            doc.peer_id = agent + 1
        return doc, doc.get_text("text")

    def edit(self, doc, text, patches):
        for pos, deleted, inserted in patches:
            if deleted:
                text.delete(pos, deleted)
            if inserted:
                text.insert(pos, inserted)

    def text(self, doc, text):
        return text.to_string()

    def encode(self, doc):
        return doc.export(self.loro.ExportMode.Snapshot())

    def merge(self, doc, data):
        doc.import_(data)

    def merge_updates(self, doc, updates):
        doc.import_batch(updates)

    def version_of(self, doc):
        return doc.oplog_vv

    def updates_since(self, doc, vv):
        return doc.export(self.loro.ExportMode.Updates(vv))


class Yrs:
    name = "pycrdt"

    def __init__(self):
        import pycrdt
        self.pycrdt = pycrdt
        self.version = version("pycrdt")
        self.bytes_positions = False

    def new(self, agent=None):
        doc = self.pycrdt.Doc(client_id=agent + 1) if agent is not None else self.pycrdt.Doc()
        return doc, doc.get("text", type=self.pycrdt.Text)

    def edit(self, doc, text, patches):
        with doc.transaction():
            for pos, deleted, inserted in patches:
                if self.bytes_positions:
                    current = str(text)
                    start = len(current[:pos].encode())
                    if deleted:
                        del text[start:start + len(current[pos:pos + deleted].encode())]
                    if inserted:
                        text.insert(start, inserted)
                    continue
                if deleted:
                    del text[pos:pos + deleted]
                if inserted:
                    text.insert(pos, inserted)

    def text(self, doc, text):
        return str(text)

    def encode(self, doc):
        return doc.get_update()

    def merge(self, doc, data):
        doc.apply_update(data)

    def merge_updates(self, doc, updates):
        for update in updates:
            doc.apply_update(update)

    def version_of(self, doc):
        return doc.get_state()

    def updates_since(self, doc, state):
        return doc.get_update(state)


def replay_sequential(peer, trace, halfway):
    doc, text = peer.new()
    half = None
    half_seconds = 0.0
    started = time.perf_counter()
    for index, txn in enumerate(trace["txns"]):
        peer.edit(doc, text, txn["patches"])
        if index + 1 == halfway:
            mark = time.perf_counter()
            half = peer.encode(doc)
            half_seconds = time.perf_counter() - mark
    seconds = time.perf_counter() - started - half_seconds
    return doc, text, seconds, half


def replay_concurrent(peer, trace, halfway):
    """Each transaction's own operations become an update (the peer's incremental export); before a
    transaction the writing replica imports, agent by agent, the updates of the transactions its parents
    hold that it lacks (tracked with version vectors of per-agent transaction counts)."""
    txns = trace["txns"]
    agents = trace["numAgents"]
    replicas = [peer.new(agent) for agent in range(agents)]
    by_agent = [[] for _ in range(agents)]  # each agent's transaction updates, in order
    versions = []  # per transaction: how many transactions of each agent its state holds
    holds = [[0] * agents for _ in range(agents)]
    half = None
    half_seconds = 0.0
    started = time.perf_counter()
    for index, txn in enumerate(txns):
        agent = txn["agent"]
        doc, text = replicas[agent]
        target = [0] * agents
        for parent in txn["parents"]:
            target = [max(x, y) for x, y in zip(target, versions[parent])]
        missing = []
        for other in range(agents):
            if target[other] > holds[agent][other]:
                missing.extend(by_agent[other][holds[agent][other]:target[other]])
                holds[agent][other] = target[other]
        if missing:
            peer.merge_updates(doc, missing)
        mark = peer.version_of(doc)
        peer.edit(doc, text, txn["patches"])
        by_agent[agent].append(peer.updates_since(doc, mark))
        holds[agent][agent] += 1
        versions.append(list(holds[agent]))
        if index + 1 == halfway:
            mark = time.perf_counter()
            half = peer.encode(doc)
            half_seconds = time.perf_counter() - mark
    for agent, (doc, _) in enumerate(replicas):
        missing = []
        for other in range(agents):
            missing.extend(by_agent[other][holds[agent][other]:])
        if missing:
            peer.merge_updates(doc, missing)
    seconds = time.perf_counter() - started - half_seconds
    doc, text = replicas[0]
    return doc, text, seconds, half


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", required=True, choices=["loro", "pycrdt"])
    parser.add_argument("trace")
    args = parser.parse_args()
    peer = Loro() if args.peer == "loro" else Yrs()
    trace = load(args.trace)
    concurrent = "numAgents" in trace
    patches = sum(len(t["patches"]) for t in trace["txns"])
    if isinstance(peer, Yrs):
        peer.bytes_positions = any(not p[2].isascii() for t in trace["txns"] for p in t["patches"] if p[2]) \
            or not trace.get("startContent", "").isascii()
    halfway = len(trace["txns"]) // 2
    gc.collect()
    before = rss_kib()
    if concurrent:
        doc, text, seconds, half = replay_concurrent(peer, trace, halfway)
    else:
        doc, text, seconds, half = replay_sequential(peer, trace, halfway)
    gc.collect()
    document_kib = rss_kib() - before
    final = peer.text(doc, text)
    encoded = peer.encode(doc)

    loads = []
    for _ in range(5):
        started = time.perf_counter()
        fresh, fresh_text = peer.new()
        peer.merge(fresh, encoded)
        loaded = peer.text(fresh, fresh_text)
        loads.append(time.perf_counter() - started)
    merges = []
    for _ in range(5):
        target, target_text = peer.new()
        peer.merge(target, half)
        started = time.perf_counter()
        peer.merge(target, encoded)
        merged = peer.text(target, target_text)
        merges.append(time.perf_counter() - started)
    result = {
        "kind": "text-trace",
        "implementation": peer.name,
        "version": peer.version,
        "trace": os.path.basename(args.trace).split(".")[0],
        "concurrent": concurrent,
        "transactions": len(trace["txns"]),
        "patches": patches,
        "replay_s": round(seconds, 6),
        "patches_per_s": round(patches / seconds, 1),
        "final_ok": final == trace["endContent"],
        "load_s": round(min(loads), 6),
        "load_ok": loaded == trace["endContent"],
        "merge_s": round(min(merges), 6),
        "merge_ok": merged == trace["endContent"],
        "encoded_bytes": len(encoded),
        "document_rss_kib": document_kib,
        "peak_rss_kib": peak_rss_kib(),
    }
    if isinstance(peer, Yrs) and peer.bytes_positions:
        result["note"] = "positions converted from Unicode scalars to UTF-8 bytes"
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
