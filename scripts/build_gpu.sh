#!/usr/bin/env bash
# Builds kiln for the GPU machine into build-gpu/: Release, sm_90, OpenBLAS linked in (the
# GPU machine has none), stripped and xz-compressed into build-gpu/dist/kiln.xz (what a
# device call carries). cuDNN and cuBLASLt come from the GPU machine itself
# (tests/gpu/run_on_gpu.sh unpacks the binary and sets the library path).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_CUDA=ON -DKILN_BUILD_TESTS=OFF -DKILN_STATIC_BLAS=ON > /dev/null
ninja -C build-gpu kiln
# What travels to the GPU machine (carry build-gpu/dist): the stripped binary, compressed.
mkdir -p build-gpu/dist
strip -o build-gpu/dist/kiln build-gpu/kiln
xz -f -T0 -3 build-gpu/dist/kiln
du -sh build-gpu/dist/kiln.xz
