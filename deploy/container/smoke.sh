#!/usr/bin/env bash
# Runs the coordinator and one CPU agent from the image (deploy/container/build.sh)
# with podman on the host network, waits for the agent to register, reads
# both /metrics, optionally runs a short stress job (--job, needs an image
# with libtorch), and removes the containers, also on failure.
#
#   deploy/container/smoke.sh [--image NAME] [--job] [--gpu]
#
# --gpu: the agent tests the host's GPUs instead of a CPU rank; NVML and
# /dev/nvidia* come from the NVIDIA container toolkit's CDI spec
# (`nvidia-ctk cdi generate`), as `--device nvidia.com/gpu=all`.
#
# PODMAN_ARGS adds podman flags before `run`, e.g. PODMAN_ARGS="--runtime runc"
# where crun refuses the host's cgroups. Podman's default ulimits (nofile
# 1048576) need CAP_SYS_RESOURCE where the host's hard limit is lower, so the
# containers get limits under this shell's (ULIMITS overrides them).
set -euo pipefail

image=localhost/gpuctl:latest
job=0
gpu=(--no-gpu --cpu-ranks 1)
devices=()
while [ $# -gt 0 ]; do
    case "$1" in
        --image) image="$2"; shift 2 ;;
        --job) job=1; shift ;;
        --gpu) gpu=(); devices=(--device nvidia.com/gpu=all); shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
read -r -a podman_args <<< "${PODMAN_ARGS:-}"
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=65536
read -r -a ulimits <<< "${ULIMITS:---ulimit nofile=$nofile:$nofile --ulimit nproc=16384:16384}"

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
grpc=$(free_port); cmetrics=$(free_port); ametrics=$(free_port)
tag=gpuctl-smoke-$$
url=http://127.0.0.1:$grpc

cleanup() {
    podman "${podman_args[@]}" rm -f -t 5 "$tag-agent" "$tag-coordinator" >/dev/null 2>&1 || true
}
trap cleanup EXIT

run() {
    podman "${podman_args[@]}" run "${ulimits[@]}" --network host "$@"
}
fail() {
    echo "smoke: $*" >&2
    for c in coordinator agent; do
        echo "--- $c log" >&2
        podman "${podman_args[@]}" logs "$tag-$c" 2>&1 | tail -20 >&2 || true
    done
    exit 1
}

run -d --name "$tag-coordinator" --entrypoint gpuctl-coordinator "$image" \
    --listen "127.0.0.1:$grpc" --metrics-listen "127.0.0.1:$cmetrics" --data-dir /data >/dev/null
# The agent as the DaemonSet runs it: the host's /proc, /sys and /dev/shm
# under /host (--host-root), the host's IPC namespace (NCCL's shared-memory
# transport), its metrics port; CPU ranks unless --gpu.
run -d --name "$tag-agent" --entrypoint gpuctl-agent --ipc host "${devices[@]}" \
    -v /proc:/host/proc:ro -v /sys:/host/sys:ro -v /dev/shm:/host/dev/shm:ro \
    "$image" --coordinator "$url" --name smoke-0 "${gpu[@]}" \
    --work-dir /var/lib/gpuctl-agent --host-root /host \
    --metrics-listen "127.0.0.1:$ametrics" >/dev/null

gpuctl() {
    run --rm -e GPUCTL_COORDINATOR="$url" "$image" "$@"
}
for _ in $(seq 60); do
    if gpuctl nodes --output json 2>/dev/null | grep -q '"ready"'; then
        break
    fi
    sleep 1
done
gpuctl nodes || fail "no answer from the coordinator"
gpuctl nodes --output json | grep -q '"ready"' || fail "the agent did not register in 60 s"

scrape() { python3 -c "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1]).read().decode())" "$1"; }
agent=$(scrape "http://127.0.0.1:$ametrics/metrics") || fail "no agent /metrics"
coord=$(scrape "http://127.0.0.1:$cmetrics/metrics") || fail "no coordinator /metrics"
grep -qx 'gpuctl_agent_coordinator_connected{node="smoke-0"} 1' <<< "$agent" \
    || fail "agent /metrics: not connected"$'\n'"$agent"
grep -qx 'gpuctl_nodes{state="ready"} 1' <<< "$coord" \
    || fail "coordinator /metrics: no ready node"$'\n'"$coord"
echo "smoke: coordinator and agent run from $image; both /metrics answer"

if [ "$job" = 1 ]; then
    gpuctl submit stress --nodes 1 --duration 3s --wait || fail "the stress job failed"
    echo "smoke: a stress job ran on the containerised agent"
fi
