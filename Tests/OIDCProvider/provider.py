#!/usr/bin/env python3
"""A small OpenID Connect provider for Lattice's tests, on joserfc (PyPI, pinned in requirements.txt).

Serves on 127.0.0.1 only: discovery, a JWK Set (an RSA key `k1` for RS256 and a P-256 key `e1` for
ES256), the authorization endpoint (it consents at once, as the user set with /test/user), and the token
endpoint (authorization code with PKCE S256, checked). For tests only, /test/mint makes ID tokens, good and
forged, for an app's token exchange (`shift=SECONDS` moves their iat and exp, for a server whose clock a test
moves); /test/rotate adds a new key `k2`; /test/retire?kid=K stops publishing key K (tokens can still be minted
with it); /test/endless?path=/jwks[&declare=1] makes that path answer without end (with a Content-Length
of a gigabyte when declare is set); /test/count tells how many requests each path got.

A client given --client-secret ID=SECRET is confidential: the token endpoint then wants that secret
(client_secret_post) and answers 401 invalid_client without it.

Usage: provider.py [--port N] [--client-id ID]... [--client-secret ID=SECRET]... [--url-file PATH]; prints "listening on URL" (the issuer), writes it
to PATH too when asked, and serves until killed.
"""
import argparse
import base64
import hashlib
import hmac
import json
import secrets
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from joserfc import jwt
from joserfc.jwk import ECKey, KeySet, RSAKey


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Provider:
    def __init__(self, issuer, clients, client_secrets=None):
        self.issuer = issuer
        self.clients = set(clients)
        self.client_secrets = dict(client_secrets or {})
        self.keys = [RSAKey.generate_key(2048, parameters={"kid": "k1", "alg": "RS256", "use": "sig"}),
                     ECKey.generate_key("P-256", parameters={"kid": "e1", "alg": "ES256", "use": "sig"})]
        self.user = {"sub": "user-1", "preferred_username": "olive", "name": "Olive Oyl", "email": "olive@example.test"}
        self.codes = {}
        self.counts = {}
        self.retired = set()
        self.endless = {}
        self.local = threading.local()  # .shift: seconds added to the times of the tokens this thread mints
        self.lock = threading.Lock()

    def key(self, kid):
        return next(k for k in self.keys if k.kid == kid)

    def id_token(self, audience, nonce=None, kid="k1", changes=None, user=None):
        now = int(time.time()) + getattr(self.local, "shift", 0)
        claims = dict(user or self.user)
        claims.update({"iss": self.issuer, "aud": audience, "iat": now, "exp": now + 300})
        if nonce is not None:
            claims["nonce"] = nonce
        for name, value in (changes or {}).items():
            if value is None:
                claims.pop(name, None)
            else:
                claims[name] = value
        key = self.key(kid)
        return jwt.encode({"alg": key.alg, "kid": kid, "typ": "JWT"}, claims, key)

    def mint(self, variant, audience, sub, shift=0):
        self.local.shift = shift
        try:
            return self.mint_shifted(variant, audience, sub)
        finally:
            self.local.shift = 0

    def mint_shifted(self, variant, audience, sub):
        user = dict(self.user, sub=sub) if sub else None
        now = int(time.time()) + self.local.shift
        if variant == "good":
            return self.id_token(audience, user=user)
        if variant == "es256":
            return self.id_token(audience, kid="e1", user=user)
        if variant == "expired":
            return self.id_token(audience, user=user, changes={"exp": now - 3600, "iat": now - 7200})
        if variant == "wrong-audience":
            return self.id_token("someone-else", user=user)
        if variant == "wrong-issuer":
            return self.id_token(audience, user=user, changes={"iss": "https://evil.example"})
        if variant == "future":
            return self.id_token(audience, user=user, changes={"iat": now + 3600})
        if variant == "forged-signature":
            token = self.id_token(audience, user=user)
            head, body, signature = token.split(".")
            raw = bytearray(base64.urlsafe_b64decode(signature + "=="))
            raw[10] ^= 1
            return f"{head}.{body}.{b64url(bytes(raw))}"
        good = self.id_token(audience, user=user)
        body = good.split(".")[1]
        if variant == "alg-none":
            head = b64url(json.dumps({"alg": "none", "typ": "JWT"}).encode())
            return f"{head}.{body}."
        if variant == "hs256-public-key":
            # HMAC keyed with the provider's public key, as published in its JWK Set: a verifier that
            # lets the token choose the algorithm would accept it.
            head = b64url(json.dumps({"alg": "HS256", "kid": "k1", "typ": "JWT"}).encode())
            secret = json.dumps(self.key("k1").as_dict(private=False), sort_keys=True).encode()
            signature = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
            return f"{head}.{body}.{b64url(signature)}"
        if variant == "unknown-kid":
            stranger = RSAKey.generate_key(2048, parameters={"kid": "k-unknown", "alg": "RS256", "use": "sig"})
            claims = json.loads(base64.urlsafe_b64decode(body + "=="))
            return jwt.encode({"alg": "RS256", "kid": "k-unknown", "typ": "JWT"}, claims, stranger)
        if variant == "rotated":
            return self.id_token(audience, kid="k2", user=user)
        raise KeyError(variant)


def handler_for(provider):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_):
            pass

        def send(self, status, body, content_type="application/json", headers=()):
            data = body.encode() if isinstance(body, str) else body
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def send_endlessly(self, declare):
            # 64 KiB every 10 ms for 15 s (96 MiB), or until the client hangs up: what a broken or hostile
            # provider might send.
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if declare:
                self.send_header("Content-Length", str(1 << 30))
            self.end_headers()
            chunk = b'{"keys": [' + b" " * 65526
            try:
                for _ in range(1500):
                    self.wfile.write(chunk)
                    time.sleep(0.01)
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

        def count(self, path):
            with provider.lock:
                provider.counts[path] = provider.counts.get(path, 0) + 1

        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            self.count(url.path)
            with provider.lock:
                endless = provider.endless.get(url.path)
            if endless is not None:
                return self.send_endlessly(endless)
            if url.path == "/.well-known/openid-configuration":
                return self.send(200, json.dumps({
                    "issuer": provider.issuer, "authorization_endpoint": provider.issuer + "/authorize",
                    "token_endpoint": provider.issuer + "/token", "jwks_uri": provider.issuer + "/jwks",
                    "response_types_supported": ["code"], "subject_types_supported": ["public"],
                    "id_token_signing_alg_values_supported": ["RS256", "ES256"],
                    "code_challenge_methods_supported": ["S256"]}))
            if url.path == "/jwks":
                with provider.lock:
                    published = [k for k in provider.keys if k.kid not in provider.retired]
                return self.send(200, json.dumps(KeySet(published).as_dict(private=False)))
            if url.path == "/authorize":
                if query.get("client_id") not in provider.clients or query.get("response_type") != "code" \
                        or query.get("code_challenge_method") != "S256" or not query.get("code_challenge") \
                        or "openid" not in query.get("scope", "").split():
                    return self.send(400, json.dumps({"error": "invalid_request"}))
                code = secrets.token_urlsafe(24)
                with provider.lock:
                    provider.codes[code] = dict(query, user=dict(provider.user), made=time.time())
                target = query["redirect_uri"] + ("&" if "?" in query["redirect_uri"] else "?") + urllib.parse.urlencode(
                    {"code": code, "state": query.get("state", "")})
                return self.send(302, "", "text/plain", [("Location", target)])
            if url.path == "/test/user":
                with provider.lock:
                    provider.user = {key: value for key, value in query.items()}
                return self.send(200, json.dumps(provider.user))
            if url.path == "/test/mint":
                try:
                    token = provider.mint(query.get("variant", "good"), query.get("aud", ""), query.get("sub"),
                                          int(query.get("shift", "0")))
                except KeyError:
                    return self.send(404, json.dumps({"error": "no such variant"}))
                return self.send(200, token, "text/plain")
            if url.path == "/test/rotate":
                with provider.lock:
                    if not any(k.kid == "k2" for k in provider.keys):
                        provider.keys.append(RSAKey.generate_key(2048, parameters={"kid": "k2", "alg": "RS256", "use": "sig"}))
                return self.send(200, json.dumps({"kids": [k.kid for k in provider.keys]}))
            if url.path == "/test/retire":
                with provider.lock:
                    provider.retired.add(query.get("kid", ""))
                return self.send(200, json.dumps({"retired": sorted(provider.retired)}))
            if url.path == "/test/endless":
                with provider.lock:
                    provider.endless[query.get("path", "")] = query.get("declare") == "1"
                return self.send(200, json.dumps({"endless": query.get("path", "")}))
            if url.path == "/test/count":
                with provider.lock:
                    return self.send(200, json.dumps(provider.counts))
            return self.send(404, json.dumps({"error": "not found"}))

        def do_POST(self):
            url = urllib.parse.urlsplit(self.path)
            self.count(url.path)
            length = int(self.headers.get("Content-Length") or 0)
            form = dict(urllib.parse.parse_qsl(self.rfile.read(min(length, 65536)).decode()))
            if url.path != "/token":
                return self.send(404, json.dumps({"error": "not found"}))
            with provider.lock:
                grant = provider.codes.pop(form.get("code", ""), None)
            if not grant or form.get("grant_type") != "authorization_code" or time.time() - grant["made"] > 120:
                return self.send(400, json.dumps({"error": "invalid_grant"}))
            if form.get("client_id") != grant.get("client_id") or form.get("redirect_uri") != grant.get("redirect_uri"):
                return self.send(400, json.dumps({"error": "invalid_grant"}))
            secret = provider.client_secrets.get(form.get("client_id"))
            if secret is not None and not hmac.compare_digest(form.get("client_secret", ""), secret):
                return self.send(401, json.dumps({"error": "invalid_client"}))
            verifier = form.get("code_verifier", "")
            if b64url(hashlib.sha256(verifier.encode()).digest()) != grant["code_challenge"]:
                return self.send(400, json.dumps({"error": "invalid_grant", "error_description": "PKCE verifier"}))
            token = provider.id_token(grant["client_id"], nonce=grant.get("nonce"), user=grant["user"])
            return self.send(200, json.dumps({"id_token": token, "access_token": secrets.token_urlsafe(16),
                                              "token_type": "Bearer", "expires_in": 300}))

    return Handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--client-id", action="append", default=[])
    parser.add_argument("--client-secret", action="append", default=[], help="ID=SECRET: a confidential client")
    parser.add_argument("--url-file", help="also write the issuer URL to this file (for tests that start the provider)")
    arguments = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", arguments.port), None)
    issuer = f"http://127.0.0.1:{server.server_address[1]}"
    secrets_by_client = dict(pair.split("=", 1) for pair in arguments.client_secret)
    server.RequestHandlerClass = handler_for(Provider(issuer, arguments.client_id or ["lattice"], secrets_by_client))
    print(f"listening on {issuer}", flush=True)
    if arguments.url_file:
        with open(arguments.url_file + ".tmp", "w") as out:
            out.write(issuer)
        import os
        os.replace(arguments.url_file + ".tmp", arguments.url_file)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
