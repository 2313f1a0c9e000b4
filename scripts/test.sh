#!/usr/bin/env bash
# Runs kiln's whole test suite: GoogleTest unit tests, command-line tests and the pytest
# end-to-end tests, all through CTest. Installs and builds first where needed
# (scripts/setup.sh --for-tests).
#
#   bash scripts/test.sh              # everything
#   bash scripts/test.sh -L unit      # extra arguments go to ctest: -L e2e, -R resnet, ...
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD_DIR=${KILN_BUILD_DIR:-build}

bash scripts/setup.sh --for-tests

# The disk left for the builds and the tests' files, in the log: a run that fails for want of
# space says so here first.
free_disk() { df -h --output=avail . | tail -1 | tr -d ' '; }
echo "==> disk free in $(pwd): $(free_disk)"

# With no filter given, first: bounded, seeded libFuzzer runs of the ONNX importer (through passes
# and the CPU engine), of generated graphs (fuzz_graph), of engine files, of the .npy reader and
# of the native gRPC front's request and answer messages (fuzz_infer_request),
# and the fuzzers' regression tests, in a clang build with AddressSanitizer and UBSan; then the
# thread-safety tests in a clang build with ThreadSanitizer.
if (($# == 0)); then
  FUZZ_DIR=${KILN_FUZZ_BUILD_DIR:-build-fuzz}
  echo
  echo "==> libFuzzer targets in $FUZZ_DIR"
  mkdir -p "$FUZZ_DIR"
  cmake -S . -B "$FUZZ_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_FUZZ=ON -DKILN_WITH_CUDA=OFF \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ > "$FUZZ_DIR/configure.log" 2>&1 ||
    { cat "$FUZZ_DIR/configure.log"; exit 1; }
  # (fuzz_infer_request: kiln serve's native gRPC front's messages, where gRPC's C++ library is)
  INFER_FUZZER=$(ninja -C "$FUZZ_DIR" -t targets all | grep -o "^fuzz/fuzz_infer_request:" | cut -d: -f1 || true)
  ninja -C "$FUZZ_DIR" fuzz_onnx_import fuzz_npy fuzz_engine_file fuzz_graph fuzz_regression_tests kiln $INFER_FUZZER
  # Each fuzzer and sanitized test runs on one core: two at a time on two cores.
  ctest --test-dir "$FUZZ_DIR" -L fuzz --output-on-failure -j"$(nproc)"
  # CI starts from a clean clone and needs this build no more: its space goes to the tests.
  if [[ "${CI:-}" == "true" ]]; then rm -rf "$FUZZ_DIR"; fi

  # Then the tests of engines shared by threads, in a clang build with ThreadSanitizer.
  TSAN_DIR=${KILN_TSAN_BUILD_DIR:-build-tsan}
  echo
  echo "==> ThreadSanitizer build in $TSAN_DIR"
  mkdir -p "$TSAN_DIR"
  cmake -S . -B "$TSAN_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_TSAN=ON -DKILN_WITH_CUDA=OFF -DKILN_NATIVE_GRPC=OFF \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ > "$TSAN_DIR/configure.log" 2>&1 ||
    { cat "$TSAN_DIR/configure.log"; exit 1; }
  ninja -C "$TSAN_DIR" thread_safety_tests kiln_tsan_python
  ctest --test-dir "$TSAN_DIR" -L tsan --output-on-failure -j"$(nproc)"
  if [[ "${CI:-}" == "true" ]]; then rm -rf "$TSAN_DIR"; fi
fi

echo
echo "==> ctest in $BUILD_DIR (disk free: $(free_disk))"
# ctest's exit code is non-zero when any test fails; set -e passes it on.
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)" "$@"
