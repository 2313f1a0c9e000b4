#!/usr/bin/env bash
# Fetches the serving packages the GPU machine lacks (requirements/serve-gpu.txt) as wheels for its
# Python 3.12 into .whl/, which a device call carries: scripts/gpu_gate.py run installs them for
# the serving suites, bench/serve_bench.py for its server and clients. .whl/ is not part of the
# tree (.gitignore).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  --platform manylinux_2_5_x86_64 -d .whl -r requirements/serve-gpu.txt
echo "$(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/"
