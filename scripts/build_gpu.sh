#!/usr/bin/env bash
# Packs kiln for the GPU machine into build-gpu/dist/: the developer build's objects (build/, or
# KILN_BUILD_DIR; scripts/setup.sh makes it, with the CUDA backend wherever the toolkit is) linked
# as kiln_portable, with OpenBLAS inside (the GPU machine has none), stripped and xz-compressed
# into kiln.xz (what a device call carries). cuDNN and cuBLASLt come from the GPU machine itself
# (scripts/gpu_gate.py run and tests/gpu/run_on_gpu.sh unpack the binary and set the library
# path). BUILD_INFO.json beside it records the commit and the sources' common hash it was built
# from and its sha256, which the GPU gate checks and writes into every result.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KILN_BUILD_DIR:-build}
[[ -f "$BUILD_DIR/build.ninja" ]] || { echo "build_gpu.sh: $BUILD_DIR/ is not configured: run scripts/setup.sh first" >&2; exit 1; }
grep -q "kiln_cuda" "$BUILD_DIR/build.ninja" ||
  { echo "build_gpu.sh: $BUILD_DIR/ has no CUDA backend (is the CUDA toolkit in /usr/local/cuda?)" >&2; exit 1; }
# A CI-style build holds PTX only (scripts/setup.sh): the GPU would compile every kernel at load.
if grep -q "^KILN_CUDA_ARCHITECTURES:STRING=.*virtual" "$BUILD_DIR/CMakeCache.txt"; then
  echo "build_gpu.sh: $BUILD_DIR/ compiles the CUDA kernels to PTX only; reconfigure it with machine code:" \
       "cmake -S . -B $BUILD_DIR -DKILN_CUDA_ARCHITECTURES=90" >&2
  exit 1
fi
ninja -C "$BUILD_DIR" kiln_portable
mkdir -p build-gpu/dist
strip -o build-gpu/dist/kiln "$BUILD_DIR/kiln_portable"
PYTHON=${KILN_PYTHON:-$(command -v python3)}
"$PYTHON" - <<'PY'
import json, sys
sys.path.insert(0, "scripts")
import gpu_gate
info = {"commit": gpu_gate.git_commit(), "common_hash": gpu_gate.source_hashes()["common"],
        "binary_sha256": gpu_gate.sha256_file("build-gpu/dist/kiln")}
json.dump(info, open("build-gpu/dist/BUILD_INFO.json", "w"), indent=1)
print(f"built from {info['commit']} (sources {info['common_hash'][:12]}), sha256 {info['binary_sha256'][:12]}")
PY
xz -f -T0 -3 build-gpu/dist/kiln
du -sh build-gpu/dist/kiln.xz
