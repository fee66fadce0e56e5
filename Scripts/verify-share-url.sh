#!/usr/bin/env bash
# Verifies a Lattice share URL offline, with only bash, python3 (standard library) and openssl.
#
#   Scripts/verify-share-url.sh URL JWKS_URL_OR_FILE
#
# URL is `{public-url}/share/{token}` (or the bare token). JWKS is the server's published key set, as a file or
# an http(s) URL. The script checks the token's shape, finds the key named by its `kid` in the JWKS, converts
# that JWK to a PEM public key and has `openssl pkeyutl` check the Ed25519 signature over `header.payload`.
# It then prints the claims and checks `exp` (60 s leeway, like the server).
#
# Exit status: 0 valid; 1 invalid (malformed, unknown or retired key, bad signature); 2 usage or I/O error;
# 3 signature valid but the link has expired. Whether the share still exists, its epoch and its use count only
# the server knows.
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 SHARE_URL JWKS_URL_OR_FILE" >&2
    exit 2
fi
command -v openssl >/dev/null || { echo "openssl not found" >&2; exit 2; }
command -v python3 >/dev/null || { echo "python3 not found" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Decode the token and the JWKS, write pub.pem, input (the signing input) and sig (the raw signature).
python3 - "$1" "$2" "$work" <<'PYTHON'
import base64, json, re, sys, time, urllib.request

url, jwks_source, work = sys.argv[1:4]

def fail(message, status=1):
    print("INVALID: " + message, file=sys.stderr)
    sys.exit(status)

def b64url(text):
    # Strict: the base64url alphabet only, no padding, no impossible length.
    if not re.fullmatch(r"[A-Za-z0-9_-]*", text) or len(text) % 4 == 1:
        fail("a token part is not unpadded base64url")
    decoded = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if base64.urlsafe_b64encode(decoded).decode().rstrip("=") != text:
        fail("a token part is not canonical base64url")
    return decoded

def strict_json(data, what):
    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            fail(what + " has a duplicate member")
        return dict(pairs)
    try:
        return json.loads(data, object_pairs_hook=no_duplicates)
    except ValueError as error:
        fail(what + " is not JSON: " + str(error))

token = url.split("/share/", 1)[1] if "/share/" in url else url
token = re.split(r"[?#/]", token, maxsplit=1)[0]
if len(token) > 4096:
    fail("the token is longer than 4096 bytes")
parts = token.split(".")
if len(parts) != 3:
    fail("a token has exactly three dot-separated parts, this one has %d" % len(parts))

header = strict_json(b64url(parts[0]), "the header")
claims = strict_json(b64url(parts[1]), "the payload")
signature = b64url(parts[2])
if not isinstance(header, dict) or not isinstance(claims, dict):
    fail("the header and payload must be JSON objects")
if header.get("alg") != "EdDSA":
    fail("alg must be EdDSA, not %r" % header.get("alg"))
if set(header) - {"alg", "kid", "typ"}:
    fail("unexpected header members: %s" % sorted(set(header) - {"alg", "kid", "typ"}))
kid = header.get("kid")
if not isinstance(kid, str) or not kid:
    fail("the header has no kid")
if len(signature) != 64:
    fail("an Ed25519 signature is 64 bytes, this one is %d" % len(signature))

try:
    if re.match(r"https?://", jwks_source):
        with urllib.request.urlopen(jwks_source, timeout=10) as response:
            jwks_bytes = response.read(1 << 20)
    else:
        with open(jwks_source, "rb") as file:
            jwks_bytes = file.read(1 << 20)
except OSError as error:
    fail("cannot read the JWKS: %s" % error, 2)
jwks = strict_json(jwks_bytes, "the JWKS")
keys = [k for k in jwks.get("keys", []) if isinstance(k, dict) and k.get("kid") == kid]
if not keys:
    fail("kid %s is not in the JWKS (unknown or retired key)" % kid)
jwk = keys[0]
if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519" or jwk.get("alg", "EdDSA") != "EdDSA":
    fail("the JWK for kid %s is not an Ed25519 (OKP) key" % kid)
x = b64url(jwk.get("x", ""))
if len(x) != 32:
    fail("the JWK's x is not 32 bytes")

# SubjectPublicKeyInfo for Ed25519 (RFC 8410): a fixed 12-byte DER prefix, then the raw key.
der = bytes.fromhex("302a300506032b6570032100") + x
pem = base64.b64encode(der).decode()
with open(work + "/pub.pem", "w") as file:
    file.write("-----BEGIN PUBLIC KEY-----\n" + pem + "\n-----END PUBLIC KEY-----\n")
with open(work + "/input", "wb") as file:
    file.write((parts[0] + "." + parts[1]).encode("ascii"))
with open(work + "/sig", "wb") as file:
    file.write(signature)
exp = claims.get("exp")
if exp is not None and (isinstance(exp, bool) or not isinstance(exp, int)):
    fail("exp is not an integer")
# Reported after the signature check; 60 s leeway, like the server.
with open(work + "/expiry", "w") as file:
    if exp is None:
        file.write("never expires")
    elif time.time() >= exp + 60:
        file.write("EXPIRED at %d (now %d)" % (exp, time.time()))
    else:
        file.write("expires at %d" % exp)

print("header: " + json.dumps(header, sort_keys=True))
print("claims: " + json.dumps(claims, sort_keys=True))
PYTHON

echo "+ openssl pkeyutl -verify -pubin -inkey pub.pem -rawin -in input -sigfile sig"
if ! (cd "$work" && openssl pkeyutl -verify -pubin -inkey pub.pem -rawin -in input -sigfile sig); then
    echo "INVALID: the signature does not verify" >&2
    exit 1
fi

expiry=$(cat "$work/expiry")
if [[ $expiry == EXPIRED* ]]; then
    echo "$expiry: the signature is genuine but the link has expired" >&2
    exit 3
fi
echo "VALID: signed by a key in the JWKS; $expiry"
