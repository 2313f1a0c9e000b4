#!/usr/bin/env bash
# Installs what kiln needs on Debian 12 and builds it. No GPU is needed; where the CUDA toolkit
# is installed (/usr/local/cuda) the CUDA backend is compiled too (it runs only on a GPU machine).
#
#   bash scripts/setup.sh                 # what the demo needs (scripts/demo.sh)
#   bash scripts/setup.sh --for-tests     # and what the tests need (scripts/test.sh runs this)
#
# Steps, each skipped when already done, so running it again is cheap:
#   1. Debian packages (apt-get; needs root, or sudo)
#   2. a Python virtual environment .venv as requirements/demo.lock pins it (numpy, matplotlib,
#      pybind11); with --for-tests as requirements/dev.lock pins it (torch, onnx, onnxruntime,
#      pytest, ... as well), .venv-tf with TensorFlow and tf2onnx, and .venv-serve with KServe and
#      Triton's clients (kept apart so their pins never move torch's)
#   3. cmake + ninja build into build/ (KILN_BUILD_DIR overrides), with the Python package's
#      extension module laid out in build/python; the tests are built with --for-tests
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD_DIR=${KILN_BUILD_DIR:-build}
FOR_TESTS=0
for arg in "$@"; do
  case $arg in
    --for-tests) FOR_TESTS=1 ;;
    *) echo "setup.sh: unknown argument '$arg' (the one option is --for-tests)" >&2; exit 1 ;;
  esac
done

# Build tools and libraries kiln links (see CMakeLists.txt; onnx.proto is vendored in third_party/);
# libstb-dev decodes images for `kiln run --input photo.jpg`; dataset-fashion-mnist gives the
# demo real images without a download; gRPC's C++ library builds kiln serve's native gRPC front
# (kiln serve --grpc-front native).
DEBIAN_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
  zlib1g-dev libopenblas-dev libfmt-dev libcli11-dev nlohmann-json3-dev libstb-dev
  dataset-fashion-mnist
  python3 python3-venv python3-dev
)
# For the tests: GoogleTest; libonnx-testdata holds the ONNX backend test cases of `kiln
# conformance`; clang and libclang-rt-14-dev build the fuzz targets and the ThreadSanitizer
# build; chromium renders the HTML report in its test.
if ((FOR_TESTS)); then
  DEBIAN_PACKAGES+=(libgtest-dev libonnx-testdata clang libclang-rt-14-dev chromium ccache)
fi
# The Python environments, every package pinned (requirements/*.lock, so that CI and every
# developer run the same versions; the conformance floors count the cases of the pinned onnx):
# .venv for the demo (demo.lock): numpy, matplotlib for its chart and `kiln report`, pybind11 to
# build the Python package (kiln._kiln). For the tests (dev.lock, which includes demo.lock):
# torch, torchvision, onnx, onnxruntime, pytest, onnxscript, transformers; scikit-build-core
# builds the wheel (`pip wheel .`); nbconvert and ipykernel execute notebooks/demo.ipynb.
# .venv-tf (tests): tensorflow-cpu and tf2onnx for `kiln export --from savedmodel` and its test,
# kept apart so their pins never move torch's.
# .venv-serve (tests): KServe's model server and Ray Serve for `kiln serve`, and Triton's clients and
# perf_analyzer to talk to it (their protobuf and grpcio pins differ from onnx's and TensorFlow's).
PIP_VERSION=26.3

say() { printf '\n==> %s\n' "$*"; }

# pip unpacks each wheel under $TMPDIR before it installs into .venv: torch with its CUDA
# libraries and TensorFlow need about 10 GB between the two places. A full disk otherwise shows
# up as pip's "[Errno 28] No space left on device" halfway through a download.
require_free_gb() {  # require_free_gb GB PATH...: fail with a message naming the short path
  local need=$1; shift
  local path avail_kb
  for path in "$@"; do
    avail_kb=$(df -Pk "$path" | awk 'NR == 2 {print $4}')
    if ((avail_kb < need * 1024 * 1024)); then
      echo "setup.sh: $path has $((avail_kb / 1024)) MB free; installing the Python packages needs" \
           "about $need GB there (free some space, or point TMPDIR elsewhere)" >&2
      df -h "$path" >&2
      exit 1
    fi
  done
}

# --- 1. Debian packages ---------------------------------------------------------------------
missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup.sh: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
  fi
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
else
  say "Debian packages: all installed"
fi

# --- 2. Python environments -----------------------------------------------------------------
install_lock() {  # install_lock VENV LOCK GB: the environment VENV as LOCK pins it
  local venv=$1 lock=$2 gb=$3
  if [[ ! -x $venv/bin/python ]]; then
    say "creating the virtual environment $venv"
    python3 -m venv "$venv"
  fi
  if "$venv/bin/python" scripts/check_lock.py "$lock" > /dev/null; then
    say "Python packages of $venv: as $lock pins them"
  else
    say "installing $lock into $venv"
    "$venv/bin/python" scripts/check_lock.py "$lock" | head -20 || true
    require_free_gb "$gb" . "${TMPDIR:-/tmp}"
    # --no-cache-dir: a second copy of every wheel in ~/.cache/pip would cost another 3 GB.
    "$venv/bin/python" -m pip install --no-cache-dir "pip==$PIP_VERSION"
    "$venv/bin/python" -m pip install --no-cache-dir -r "$lock"
  fi
}
# Header-only build dependencies from PyPI, without their Python dependencies (the cuDNN
# frontend's wheel would bring a CUTLASS DSL kiln does not use).
install_headers() {  # install_headers VENV LOCK
  local venv=$1 lock=$2
  if "$venv/bin/python" scripts/check_lock.py "$lock" > /dev/null; then
    say "build headers of $venv: as $lock pins them"
  else
    say "installing $lock into $venv (no dependencies)"
    "$venv/bin/python" -m pip install --no-cache-dir --no-deps -r "$lock"
  fi
}
# What the build needs (pybind11, the cuDNN frontend's headers) comes first.
install_lock .venv requirements/demo.lock 1
install_headers .venv requirements/build-headers.lock
# The tests' packages download and unpack while the build compiles; their log follows the
# build's. torch from PyPI brings its CUDA libraries (about 3 GB); kiln's tests use it on the
# CPU only. dev.lock includes demo.lock, whose pins (pybind11's among them) it leaves as they are.
if ((FOR_TESTS)); then
  test_envs_log=$(mktemp)
  (install_lock .venv requirements/dev.lock 8
   install_lock .venv-tf requirements/tf.lock 3
   install_lock .venv-serve requirements/serve.lock 3) > "$test_envs_log" 2>&1 &
  test_envs=$!
  trap 'kill "$test_envs" 2> /dev/null || true' EXIT
  say "installing the tests' Python packages (.venv, .venv-tf, .venv-serve) in the background, beside the build"
fi

# --- 3. build -------------------------------------------------------------------------------
# The tests are built with --for-tests; a build configured for the tests keeps them.
# CI has no GPU: its CUDA build embeds the kernels as PTX only (compute_90), which checks that
# they compile and link while skipping ptxas, most of the build's time. The GPU gate's build
# (scripts/build_gpu.sh) carries the machine code that runs.
CUDA_ARCHITECTURES=()
if [[ "${CI:-}" == "true" ]]; then CUDA_ARCHITECTURES=(-DKILN_CUDA_ARCHITECTURES=90-virtual); fi
# The wheel's test (tests/e2e/test_pip_install.py) compiles the CPU library once more, in a
# build folder as deep as this one: through ccache, with paths made relative to the repository
# (CCACHE_BASEDIR), its compiles of the same sources are cache hits.
COMPILER_LAUNCHER=()
if ((FOR_TESTS)) && command -v ccache > /dev/null; then
  COMPILER_LAUNCHER=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$PWD;CCACHE_NOHASHDIR=true;ccache")
fi
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  say "configuring $BUILD_DIR (Release; the CUDA backend too if the CUDA toolkit is installed)"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_PYTHON="$PWD/.venv/bin/python" \
    -DKILN_BUILD_TESTS=$( ((FOR_TESTS)) && echo ON || echo OFF) "${CUDA_ARCHITECTURES[@]}" "${COMPILER_LAUNCHER[@]}"
elif ((FOR_TESTS)) && ! grep -q "^KILN_BUILD_TESTS:BOOL=ON" "$BUILD_DIR/CMakeCache.txt"; then
  say "configuring $BUILD_DIR with the tests"
  cmake -S . -B "$BUILD_DIR" -DKILN_BUILD_TESTS=ON
fi
say "building $BUILD_DIR"
ninja -C "$BUILD_DIR" -j"$(nproc)"
if ((FOR_TESTS)); then
  say "waiting for the tests' Python packages"
  status=0
  wait "$test_envs" || status=$?
  cat "$test_envs_log"
  rm -f "$test_envs_log"
  if ((status)); then echo "setup.sh: installing the tests' Python packages failed (exit $status; the log is above)" >&2; exit 1; fi
fi
say "setup done: $BUILD_DIR/kiln --help"
