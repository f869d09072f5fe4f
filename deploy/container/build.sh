#!/usr/bin/env bash
# Builds the gpuctl image with buildah from nothing (`buildah from scratch`):
# no base image is pulled. It holds the release binaries, the shared
# libraries they load (found with ldd on this host, so build on the Debian
# release you run, bookworm here) and, unless --no-torch, the libtorch
# site-packages the workers load (scripts/install-libtorch.sh puts it in
# ~/.cache/gpuctl/libtorch-2.11.0/site-packages; the agent finds it through
# GPUCTL_LIBTORCH). NVML (libnvidia-ml.so.1) and /dev/nvidia* are not in the
# image: on a GPU host the NVIDIA container toolkit puts the host's in
# (deploy/kubernetes/agent-daemonset.yaml, `podman run --device nvidia.com/gpu=all`).
#
# Same layout as deploy/container/Dockerfile's image: binaries in
# /usr/local/bin, entrypoint gpuctl. deploy/container/smoke.sh runs the
# coordinator and an agent from it.
#
#   deploy/container/build.sh [--tag NAME] [--bin-dir DIR] [--torch DIR | --no-torch]
#
# Needs buildah (Debian: apt-get install buildah) and root, or rootless
# buildah under `buildah unshare`.
set -euo pipefail
cd "$(dirname "$0")/../.."

tag=localhost/gpuctl:latest
bin_dir=target/release
torch="${GPUCTL_LIBTORCH:-$HOME/.cache/gpuctl/libtorch-2.11.0/site-packages}"
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) tag="$2"; shift 2 ;;
        --bin-dir) bin_dir="$2"; shift 2 ;;
        --torch) torch="$2"; shift 2 ;;
        --no-torch) torch=""; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
bins=(gpuctl gpuctl-coordinator gpuctl-agent gpuctl-worker)
for b in "${bins[@]}"; do
    if [ ! -x "$bin_dir/$b" ]; then
        echo "$bin_dir/$b is missing: cargo build --release --locked --workspace" >&2
        exit 1
    fi
done
if [ -n "$torch" ] && [ ! -f "$torch/torch/lib/libtorch_cpu.so" ]; then
    echo "no libtorch in $torch (bash scripts/install-libtorch.sh, or --no-torch)" >&2
    exit 1
fi

ctr=$(buildah from scratch)
# The working container goes also when a step fails.
trap 'buildah umount "$ctr" >/dev/null 2>&1 || true; buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
root=$(buildah mount "$ctr")

mkdir -p "$root/usr/local/bin" "$root/tmp" "$root/etc" "$root/var/lib/gpuctl-agent" "$root/data"
chmod 1777 "$root/tmp"
for b in "${bins[@]}"; do
    install -m 0755 "$bin_dir/$b" "$root/usr/local/bin/$b"
done

# Every shared library the binaries load, at the path the loader looks in,
# except libtorch's (they come with the site-packages below) and those of
# libraries ldd cannot find here.
copy_lib() {
    local src="$1"
    local dst="$root$src"
    [ -e "$dst" ] && return
    mkdir -p "$(dirname "$dst")"
    cp -L "$src" "$dst"
}
for b in "${bins[@]}"; do
    ldd "$bin_dir/$b" | while read -r line; do
        case "$line" in
            *"=> not found"*) ;;
            *site-packages*|*libtorch*|*libc10*) ;;
            *"=> /"*) copy_lib "$(echo "$line" | sed 's/.*=> \([^ ]*\).*/\1/')" ;;
            /*) copy_lib "$(echo "$line" | cut -d' ' -f1)" ;;
        esac
    done
done
# Name lookups (glibc loads these at run time, not through ldd) and a
# resolver configuration, so `--coordinator http://name:7070` works.
for lib in /lib/x86_64-linux-gnu/libnss_files.so.2 /lib/x86_64-linux-gnu/libnss_dns.so.2 \
           /lib/x86_64-linux-gnu/libresolv.so.2; do
    [ -e "$lib" ] && copy_lib "$lib"
done
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\n' > "$root/etc/passwd"
printf 'root:x:0:\n' > "$root/etc/group"
printf 'hosts: files dns\n' > "$root/etc/nsswitch.conf"
# TLS to the coordinator uses the CA given to it (--tls-ca); no system store needed.

if [ -n "$torch" ]; then
    # The workers' libtorch, NCCL and CUDA runtime (nvidia/*/lib) as the
    # wheel laid them out; the agent builds LD_LIBRARY_PATH from it.
    mkdir -p "$root/opt/torch"
    cp -a "$torch/." "$root/opt/torch/"
    buildah config --env GPUCTL_LIBTORCH=/opt/torch "$ctr"
fi

buildah config \
    --entrypoint '["gpuctl"]' \
    --cmd '[]' \
    --workingdir / \
    --port 7070 --port 7071 --port 9401 \
    --label org.opencontainers.image.title=gpuctl \
    --label org.opencontainers.image.source=https://github.com/gpuctl/gpuctl \
    "$ctr"
buildah umount "$ctr" >/dev/null
buildah commit --quiet "$ctr" "$tag"
echo "built $tag"
