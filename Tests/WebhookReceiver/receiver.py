#!/usr/bin/env python3
"""The tests' webhook receiver: a real HTTP server on 127.0.0.1 that records Lattice webhook deliveries and
checks their signatures (the same check Docs/API.md shows a receiver making).

    receiver.py --url-file PATH [--port N]

It writes its URL to PATH once it listens. POST /hook takes deliveries; how it answers is set with
POST /control {"mode": "ok" | "fail" | "hang" | "huge", "secret": "whsec_..."}: ok answers 200, fail 500,
hang holds the request for 60 s before answering 200, huge answers 200 with a 10 MB body. GET /deliveries
lists what came, in arrival order: {"id", "subscription", "sequence", "verified", "body"} each.
"""
import argparse
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

state = {"mode": "ok", "secret": "", "deliveries": []}
lock = threading.Lock()


def verify(header, body, secret, tolerance=300):
    """A delivery is genuine when its Lattice-Signature (t=<seconds>,v1=<hex>) is the HMAC-SHA256, keyed with
    the subscription's secret, of "<t>." followed by the raw body, and t is close to now."""
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - timestamp) > tolerance:
        return False
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts.get("v1", ""))


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body=b"{}"):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/deliveries":
            with lock:
                body = json.dumps(state["deliveries"]).encode()
            return self.answer(200, body)
        self.answer(404)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if self.path == "/control":
            change = json.loads(body or b"{}")
            with lock:
                state.update({key: change[key] for key in ("mode", "secret") if key in change})
            return self.answer(200)
        if self.path != "/hook":
            return self.answer(404)
        with lock:
            mode, secret = state["mode"], state["secret"]
        if mode == "hang":
            time.sleep(60)
        record = {
            "id": self.headers.get("Lattice-Delivery"),
            "subscription": self.headers.get("Lattice-Subscription"),
            "sequence": int(self.headers.get("Lattice-Sequence", "0")),
            "verified": verify(self.headers.get("Lattice-Signature", ""), body, secret),
            "body": body.decode(),
            "mode": mode,
        }
        with lock:
            state["deliveries"].append(record)
        if mode == "fail":
            return self.answer(500)
        if mode == "huge":
            return self.answer(200, b"x" * (10 * 1024 * 1024))
        self.answer(200)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url-file", required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    ThreadingHTTPServer.allow_reuse_address = True
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    with open(args.url_file, "w") as handle:
        handle.write(f"http://127.0.0.1:{server.server_address[1]}")
    server.serve_forever()


if __name__ == "__main__":
    main()
