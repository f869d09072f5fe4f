#!/usr/bin/env bash
# The test command (README.md): installs libtorch if needed, builds every
# binary and runs every test. The end-to-end tests start real coordinators,
# agents and workers on loopback, so all binaries are built first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-libtorch.sh
cargo build --workspace --locked
cargo test --workspace --locked
