#!/usr/bin/env bash
# kiln's pipeline end to end on the CPU: export a torchvision ResNet-18 (random weights, dynamic
# batch) to ONNX, build it with kiln (import + optimize) and run it on a Fashion-MNIST image,
# printing the top-5 classes; then check kiln's output against ONNX Runtime.
#
#   bash scripts/setup.sh && bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/demo.py --kiln "${KILN_BUILD_DIR:-build}/kiln" "$@"
