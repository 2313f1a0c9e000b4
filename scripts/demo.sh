#!/usr/bin/env bash
# kiln on a real task: the trained Fashion-MNIST classifier of models/ on real test images, fp32
# and INT8 side by side (classes by name, accuracy on the test split, speed, a chart in
# out/demo/); on the GPU where kiln has its CUDA backend and the machine a GPU, else on the CPU.
#
#   bash scripts/setup.sh && bash scripts/demo.sh       # --images 1000: accuracy on fewer test images
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KILN_BUILD_DIR:-build}
if [[ ! -d "$BUILD_DIR/python/kiln" ]] || ! compgen -G "$BUILD_DIR/python/kiln/_kiln*.so" > /dev/null; then
  echo "demo.sh: $BUILD_DIR/python has no kiln Python module: build kiln first (bash scripts/setup.sh)" >&2
  exit 1
fi
PYTHONPATH="$BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}" exec .venv/bin/python scripts/demo.py "$@"
