#!/usr/bin/env bash
# Installs the libtorch that the worker builds and runs against: the CPU
# libraries and headers of PyPI's torch 2.11.0 wheel (the version tch 0.24
# wants) plus the CUDA runtime and CUPTI that libtorch_cpu.so loads at start.
# Everything is cached outside the clone (GPUCTL_CACHE, default ~/.cache/gpuctl)
# and linked into the clone as .libtorch, which .cargo/config.toml points
# LIBTORCH at. Safe to run again: finished steps are skipped.
set -euo pipefail

TORCH_VERSION=2.11.0
CUDART_VERSION=13.0.96
CUPTI_VERSION=13.0.85
CACHE="${GPUCTL_CACHE:-$HOME/.cache/gpuctl}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$CACHE/libtorch-$TORCH_VERSION"
SP="$DEST/site-packages"

if [ -f "$DEST/.complete" ]; then
  echo "libtorch $TORCH_VERSION already installed in $DEST"
else
  mkdir -p "$CACHE/wheels" "$SP"
  PY="$(command -v python3 || command -v python)"
  have() { ls "$CACHE/wheels"/$1 >/dev/null 2>&1; }
  if ! have "torch-$TORCH_VERSION-*.whl" || ! have "nvidia_cuda_runtime-$CUDART_VERSION-*.whl" || ! have "nvidia_cuda_cupti-$CUPTI_VERSION-*.whl"; then
    echo "downloading torch==$TORCH_VERSION (about 530 MB) and the CUDA runtime wheels into $CACHE/wheels"
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_25_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$CACHE/wheels" \
      "torch==$TORCH_VERSION" "nvidia-cuda-runtime==$CUDART_VERSION" "nvidia-cuda-cupti==$CUPTI_VERSION"
  fi
  echo "unpacking libtorch into $SP"
  # Only what a CPU build and a CPU run need: the CUDA libraries of the wheel
  # are a gigabyte and GPU hosts bring their own (see docs/operations.md).
  # Python's zipfile rather than unzip(1), which a bare CI image may lack.
  "$PY" - "$CACHE/wheels" "$SP" "$TORCH_VERSION" "$CUDART_VERSION" "$CUPTI_VERSION" <<'PYEOF'
import glob, sys, zipfile
wheels, sp, tv, rv, cv = sys.argv[1:]
def extract(pattern, want):
    path = glob.glob(f"{wheels}/{pattern}")[0]
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if want(n)]
        for n in names:
            z.extract(n, sp)
        print(f"  {len(names)} files from {path.rsplit('/', 1)[-1]}")
keep = {"torch/lib/libtorch_cpu.so", "torch/lib/libc10.so", "torch/lib/libgomp.so.1", "torch/lib/libtorch.so", "torch/version.py"}
extract(f"torch-{tv}-*.whl", lambda n: n in keep or n.startswith("torch/include/"))
extract(f"nvidia_cuda_runtime-{rv}-*.whl", lambda n: n == "nvidia/cu13/lib/libcudart.so.13")
extract(f"nvidia_cuda_cupti-{cv}-*.whl", lambda n: n == "nvidia/cu13/lib/libcupti.so.13")
PYEOF
  # The folder tch builds against: only the CPU libraries (torch-sys always
  # passes -ltorch, so libtorch.so too, a stub that --as-needed drops), so the binary needs
  # no CUDA library to link or to start (DESIGN.md).
  mkdir -p "$DEST/libtorch/lib"
  for f in libtorch_cpu.so libc10.so libgomp.so.1 libtorch.so; do
    ln -sfn "$SP/torch/lib/$f" "$DEST/libtorch/lib/$f"
  done
  ln -sfn "$SP/torch/include" "$DEST/libtorch/include"
  touch "$DEST/.complete"
fi
ln -sfn "$DEST" "$ROOT/.libtorch"
echo "libtorch ready: $ROOT/.libtorch -> $DEST"
