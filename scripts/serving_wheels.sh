#!/usr/bin/env bash
# Fetches the serving packages the GPU machine lacks (requirements/serve-gpu.txt) as wheels for its
# Python 3.12 into .whl/, and packs them installed, xz-compressed, into
# build-gpu/serving-site.tar.xz (about 7 MB against the wheels' 18: a device call carries 64 MiB
# in all, the kiln binary and package included). Carry build-gpu/serving-site.tar.xz (or .whl/):
# scripts/gpu_gate.py run unpacks (or installs) it for the serving suites; scripts/gpu_env.sh
# unpacks it into /tmp/kiln-gate-serving-site, which bench/serve_bench.py takes on PYTHONPATH.
# Neither is part of the tree (.gitignore).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  --platform manylinux_2_5_x86_64 -d .whl -r requirements/serve-gpu.txt
echo "$(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/"
site=$(mktemp -d)
python3 -m pip install -q --no-deps --no-index --no-compile --target "$site/kiln-gate-serving-site" \
  --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  --platform manylinux_2_5_x86_64 .whl/*.whl
touch "$site/kiln-gate-serving-site/.done"
mkdir -p build-gpu
tar cf - -C "$site" kiln-gate-serving-site | xz -T0 -9 > build-gpu/serving-site.tar.xz
rm -rf "$site"
echo "installed and packed: build-gpu/serving-site.tar.xz, $(du -sh build-gpu/serving-site.tar.xz | cut -f1)"
