#!/usr/bin/env bash
# The test command (README.md): installs what the tests need (libtorch, and
# etcd for coordinator/tests/etcd_store.rs), builds every binary and runs every
# test. The end-to-end tests start real coordinators, agents and workers on
# loopback, so all binaries are built first. CI (.ci/run) calls this too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-libtorch.sh
# The etcd store tests start a real etcd (Debian's etcd-server) and fail without it.
if ! command -v etcd >/dev/null; then
    echo "etcd not found: installing Debian's etcd-server" >&2
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        sudo=(sudo)
    fi
    "${sudo[@]}" apt-get update
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server
fi
cargo build --workspace --locked
cargo test --workspace --locked
