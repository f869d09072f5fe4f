#!/usr/bin/env bash
# The test command (README.md): installs what the tests need (libtorch, etcd
# for coordinator/tests/etcd_store.rs, chromium for cli/tests/html.rs,
# prometheus and promtool for cli/tests/prometheus.rs, Slurm and munge for
# cli/tests/slurm.rs), builds every binary and runs every test. The end-to-end tests start real
# coordinators, agents and workers on loopback, so all binaries are built
# first. CI (.ci/run) calls this too.
set -euo pipefail
cd "$(dirname "$0")/.."
# A clean build and its test binaries take 5.6 GB in target/ (2026-12-06) and
# libtorch 1 GB more. A disk that fills mid-build shows only as the linker
# dying of SIGBUS (a CI run on 2026-12-05), so the room is checked first.
target="${CARGO_TARGET_DIR:-target}"
need_mb=8000
there_mb="$(du -sm "$target" 2>/dev/null | cut -f1 || true)"
# The disk target/ is on (or will be: its nearest folder that exists).
on="$target"
while [ ! -d "$on" ]; do on="$(dirname "$on")"; done
free_mb="$(df -Pm "$on" | awk 'NR == 2 { print $4 }')"
if [ "$((free_mb + ${there_mb:-0}))" -lt "$need_mb" ]; then
    echo "error: $free_mb MB free on $on and ${there_mb:-0} MB in $target; the build and the tests need about $need_mb MB: free disk space, or set CARGO_TARGET_DIR to a larger disk" >&2
    exit 1
fi
bash scripts/install-libtorch.sh
sudo=()
if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
fi
missing=()
# The etcd store tests start a real etcd (Debian's etcd-server) and fail without it.
if ! command -v etcd >/dev/null; then
    echo "etcd not found: installing Debian's etcd-server" >&2
    missing+=(etcd-server)
fi
# cli/tests/html.rs opens the HTML reports in a real headless Chromium and fails without it.
if [ ! -x /usr/bin/chromium ]; then
    echo "/usr/bin/chromium not found: installing Debian's chromium" >&2
    missing+=(chromium)
fi
# cli/tests/prometheus.rs starts a real Prometheus against a local fleet and
# runs promtool on deploy/prometheus/; Debian's prometheus brings both.
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    echo "prometheus/promtool not found: installing Debian's prometheus" >&2
    missing+=(prometheus)
fi
# cli/tests/slurm.rs starts a real munged, slurmctld and slurmd (Debian's
# 22.05) and fails without them.
for tool in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge; do
    if ! PATH="$PATH:/usr/sbin:/sbin" command -v "${tool%%:*}" >/dev/null; then
        echo "${tool%%:*} not found: installing Debian's ${tool##*:}" >&2
        missing+=("${tool##*:}")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    "${sudo[@]}" apt-get update
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
fi
# The GPU tests fail without their GPUs (worker/tests/one_pass_sgd.rs needs
# one, side_stream.rs two); on a machine without them they are opted out
# here, out loud.
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU 0:'; then
    echo "no GPU here: the GPU tests (worker/tests/one_pass_sgd.rs, side_stream.rs) are opted out (GPUCTL_SKIP_GPU_TESTS=1)" >&2
    export GPUCTL_SKIP_GPU_TESTS="${GPUCTL_SKIP_GPU_TESTS:-1}"
elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU 1:'; then
    echo "one GPU here: the 2-GPU test (worker/tests/side_stream.rs) is opted out (GPUCTL_SKIP_2GPU_TESTS=1)" >&2
    export GPUCTL_SKIP_2GPU_TESTS="${GPUCTL_SKIP_2GPU_TESTS:-1}"
fi
cargo build --workspace --locked
# Every test binary runs even when one fails, so that one failure never hides
# the others (issue 47: a failed p2p test stopped the run before prestart's).
cargo test --workspace --locked --no-fail-fast
