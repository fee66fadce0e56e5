#!/usr/bin/env bash
# Quick start, command 1: build Lattice and run the main job (two replicas merging, for now).
set -euo pipefail
cd "$(dirname "$0")/.."
bash Scripts/bootstrap.sh
swift build -c release --product lattice
.build/release/lattice demo "$@"
