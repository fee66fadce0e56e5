#!/usr/bin/env python3
"""Measures the web client's first load: bytes and time until the page is usable, under Chromium's
network emulation (DevTools' "Fast 3G" and "Slow 3G" presets), for one account with 5 lists of 72 items
(360 in all, each with a tag). Prints one JSON line per profile and run.

Usage: .build/browser-venv/bin/python Scripts/web-first-load.py [--runs N]
Environment: LATTICE_BIN (default .build/debug/lattice), LATTICE_WEB (default Web/).

Each run is a fresh browser profile (no HTTP cache, no storage, no service worker) that is already signed
in (a `lattice login --web` link opened before the emulation starts). "ready" is the moment the page sets
`document.body.dataset.ready` to "true" (the client's own signal that the lists are on screen); "idle" is
when no request has started or finished for 3 s (bounded at 120 s), so bytes fetched in the background
after the page is usable count there.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "Tests", "BrowserTests"))
import browser_tests as bt  # noqa: E402

# DevTools' presets (Chromium front_end/core/sdk/NetworkManager.ts): bytes per second and latency in ms.
PROFILES = {
    "fast3g": {"latency": 562.5, "downloadThroughput": 180_000, "uploadThroughput": 84_375},
    "slow3g": {"latency": 2000, "downloadThroughput": 50_000, "uploadThroughput": 50_000},
}
LISTS, ITEMS = 5, 72

READY_PROBE = """
new MutationObserver(() => {
  if (document.body && document.body.dataset.ready === 'true' && window.__readyAt === undefined)
    window.__readyAt = performance.now();
}).observe(document, {attributes: true, subtree: true, attributeFilter: ['data-ready']});
"""

TRANSFERRED = """
const entries = performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource'));
return entries.map(e => ({name: e.name, start: e.startTime, end: e.responseEnd, bytes: e.transferSize,
                          body: e.encodedBodySize}));
"""


def seed(cli, server):
    cli.run("signup", "ann", "--server", server.url)
    for index in range(LISTS):
        title = f"List {index + 1}"
        cli.run("list", "create", title, "--no-sync")
        for item in range(ITEMS):
            cli.run("list", "add", title, f"Item {item + 1} of {title}, something to buy or do",
                    "--tag", ["home", "shop", "work"][item % 3], "--no-sync")
    cli.run("sync")


def measure(server, cli, profile):
    driver = bt.browser()
    try:
        driver.get(cli.run("login", "--web"))
        bt.wait_for(driver, lambda d: d.execute_script("return document.body && document.body.dataset.ready") == "true",
                    "signed in", timeout=60)
        # Forget everything but the session cookie: the next load is a first load.
        driver.execute_script("""
            localStorage.clear(); sessionStorage.clear();
            if (navigator.serviceWorker) for (const r of await navigator.serviceWorker.getRegistrations()) await r.unregister();
            if (window.indexedDB && indexedDB.databases) for (const d of await indexedDB.databases()) indexedDB.deleteDatabase(d.name);
            if (window.caches) for (const k of await caches.keys()) await caches.delete(k);
        """)
        driver.get("about:blank")
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.clearBrowserCache", {})
        driver.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})
        driver.execute_cdp_cmd("Network.emulateNetworkConditions", dict(offline=False, **PROFILES[profile]))
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": READY_PROBE})
        driver.get(server.url + "/")
        bt.wait_for(driver, lambda d: d.execute_script("return window.__readyAt") is not None, "ready", timeout=120)
        ready_ms = driver.execute_script("return window.__readyAt")
        last, quiet_since, deadline = None, time.monotonic(), time.monotonic() + 120
        while time.monotonic() < deadline:
            entries = driver.execute_script(TRANSFERRED)
            shape = (len(entries), sum(e["bytes"] for e in entries))
            if shape != last:
                last, quiet_since = shape, time.monotonic()
            elif time.monotonic() - quiet_since >= 3:
                break
            time.sleep(0.25)
        entries = driver.execute_script(TRANSFERRED)
        # Long polls (changes/wait) stay open: they are counted when they finish, which is after idle.
        before_ready = [e for e in entries if e["end"] and e["end"] <= ready_ms]
        return {
            "bench": "web-first-load", "profile": profile, "lists": LISTS, "items": LISTS * ITEMS,
            "ready_ms": round(ready_ms), "bytes_until_ready": sum(e["bytes"] for e in before_ready),
            "requests_until_ready": len(before_ready),
            "bytes_until_idle": sum(e["bytes"] for e in entries), "requests_until_idle": len(entries),
            "json_body_bytes_until_idle": sum(e["body"] for e in entries if "/database/" in e["name"]),
        }
    finally:
        driver.quit()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--profiles", default="fast3g,slow3g")
    arguments = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="lattice-first-load-")
    server = bt.Server(directory)
    try:
        cli = bt.CLI(os.path.join(directory, "ann"))
        seed(cli, server)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        for _ in range(arguments.runs):
            for profile in arguments.profiles.split(","):
                line = measure(server, cli, profile)
                line["commit"] = commit
                print(json.dumps(line), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
