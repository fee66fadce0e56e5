#!/usr/bin/env bash
# Runs the tests' OpenID Connect provider (Tests/OIDCProvider/provider.py), installing its one PyPI
# dependency (Tests/OIDCProvider/requirements.txt) into .build/oidc-venv first when missing.
# Usage: Scripts/oidc-provider.sh [--port N] [--client-id ID]...   (prints "listening on URL")
# With --install-only, installs and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.build/oidc-venv
if ! "$venv/bin/python" -c 'import joserfc' 2>/dev/null; then
    echo "oidc-provider: installing joserfc into $venv" >&2
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r Tests/OIDCProvider/requirements.txt >&2
fi
if [ "${1:-}" = "--install-only" ]; then exit 0; fi
exec "$venv/bin/python" Tests/OIDCProvider/provider.py "$@"
