#!/usr/bin/env bash
# Runs kiln's whole test suite: GoogleTest unit tests, command-line tests and the pytest
# end-to-end tests, all through CTest. Installs and builds first where needed (scripts/setup.sh).
#
#   bash scripts/test.sh              # everything
#   bash scripts/test.sh -L unit      # extra arguments go to ctest: -L e2e, -R resnet, ...
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD_DIR=${KILN_BUILD_DIR:-build}

bash scripts/setup.sh
echo
echo "==> ctest in $BUILD_DIR"
# ctest's exit code is non-zero when any test fails; set -e passes it on.
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)" "$@"
