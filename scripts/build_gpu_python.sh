#!/usr/bin/env bash
# Builds the Python package's extension module for the GPU machine's Python (3.12 there, 3.11
# here: a module built for one does not import in the other), so the
# package's GPU paths (Builder on cuda, Context.run_torch over DLPack) can be tested there. It
# uses the developer build's objects (build/, or KILN_BUILD_DIR), as scripts/build_gpu.sh does.
# The GPU machine's Python headers are not on this machine: copy them once from there
# (tar /usr/include/python3.12 and /usr/include/x86_64-linux-gnu/python3.12) into
# $KILN_GPU_PYTHON_INCLUDE as python3.12/ and x86_64-linux-gnu/python3.12/.
#
#   KILN_GPU_PYTHON_INCLUDE=/tmp/py312 bash scripts/build_gpu_python.sh
#
# Writes build-gpu/python/kiln/ (the package's .py files and _kiln.cpython-312-x86_64-linux-gnu.so)
# and build-gpu/pyxz/python.tar.xz, the same xz-compressed (what a device call has room for);
# carry build-gpu/pyxz and source scripts/gpu_env.sh there. The module links the shared
# protobuf and OpenBLAS libraries, which the GPU machine has. Where the developer build has kiln
# serve's native gRPC front (src/serve, with gRPC's C++ library), the module has it too, and gRPC's
# libraries, which the GPU machine lacks, go beside it in kiln/libs/ (found through its rpath).
set -euo pipefail
cd "$(dirname "$0")/.."
INC=${KILN_GPU_PYTHON_INCLUDE:?set KILN_GPU_PYTHON_INCLUDE to the GPU machine\'s Python headers (see above)}
PYVER=${KILN_GPU_PYTHON_VERSION:-3.12}
TAG=cpython-${PYVER/./}-x86_64-linux-gnu
BUILD_DIR=${KILN_BUILD_DIR:-build}
[[ -f "$BUILD_DIR/build.ninja" ]] || { echo "$BUILD_DIR/ is missing: run scripts/setup.sh first" >&2; exit 1; }
PYBIND11_INCLUDE=$(.venv/bin/python -c "import pybind11; print(pybind11.get_include())")
OUT=build-gpu/python/kiln
mkdir -p "$OUT" build-gpu/python-obj
cp python/kiln/*.py "$OUT"/
NATIVE_GRPC=()
SERVE_OBJECTS=()
if [[ -d "$BUILD_DIR/CMakeFiles/kiln_serve.dir" ]]; then
  NATIVE_GRPC=(-DKILN_WITH_NATIVE_GRPC=1 -isystem "$BUILD_DIR/serve_proto")
  mapfile -t SERVE_OBJECTS < <(find "$BUILD_DIR/CMakeFiles/kiln_serve.dir" -name '*.o' | sort)
fi
BINDINGS=(module)
((${#NATIVE_GRPC[@]})) && BINDINGS+=(serve)
for binding in "${BINDINGS[@]}"; do
  g++ -O2 -fPIC -fvisibility=hidden -std=gnu++20 -DFMT_HEADER_ONLY -DKILN_VERSION=\"0.1.0\" -DKILN_WITH_CUDA=1 \
    "${NATIVE_GRPC[@]}" -Iinclude -Isrc -isystem "$INC/python$PYVER" -isystem "$INC" -isystem "$PYBIND11_INCLUDE" \
    -isystem /usr/local/cuda/include -isystem "$BUILD_DIR/proto" -isystem /usr/include/x86_64-linux-gnu/openblas-pthread \
    -c "python/bindings/$binding.cc" -o "build-gpu/python-obj/$binding.o"
done
# kiln_cuda_sm90a holds the kernels compiled for sm_90a alone (CUTLASS's products), where the
# toolkit builds them. Only objects whose source still exists (in the tree, or written into the
# build by CMake): a build keeps those of files since removed or renamed.
OBJECTS=()
while read -r object; do
  source=${object#"$BUILD_DIR"/CMakeFiles/kiln_*.dir/}
  [[ -f ${source%.o} || -f $BUILD_DIR/${source%.o} ]] && OBJECTS+=("$object")
done < <(find "$BUILD_DIR/CMakeFiles/kiln_core.dir" "$BUILD_DIR/CMakeFiles/kiln_cuda.dir" \
              $(ls -d "$BUILD_DIR/CMakeFiles/kiln_cuda_sm90a.dir" 2>/dev/null) -name '*.o' | sort)
GRPC_LINK=()
((${#NATIVE_GRPC[@]})) && GRPC_LINK=($(pkg-config --libs grpc++) -Wl,-rpath,'$ORIGIN/libs')
BINDING_OBJECTS=()
for binding in "${BINDINGS[@]}"; do BINDING_OBJECTS+=("build-gpu/python-obj/$binding.o"); done
g++ -shared -o "$OUT/_kiln.$TAG.so" "${BINDING_OBJECTS[@]}" "${OBJECTS[@]}" "${SERVE_OBJECTS[@]}" \
  "$BUILD_DIR/libkiln_onnx_proto.a" /usr/lib/x86_64-linux-gnu/libprotobuf.so /usr/lib/x86_64-linux-gnu/libopenblas.so \
  "${GRPC_LINK[@]}" -fopenmp -lz -L/usr/local/cuda/lib64 -lcudart_static -lcublasLt -lcudnn -lnvrtc -ldl -lrt -lpthread -Wl,-s
rm -rf "$OUT/libs"
if ((${#NATIVE_GRPC[@]})); then
  mkdir -p "$OUT/libs"
  ldd "$OUT/_kiln.$TAG.so" | awk '/(grpc|gpr|upb|absl|cares|re2|address_sorting)/ {print $3}' |
    while read -r lib; do cp -L "$lib" "$OUT/libs/"; done
fi
du -sh "$OUT/_kiln.$TAG.so"
mkdir -p build-gpu/pyxz
# (-9: 25 MB where -3 gives 26, so that the binary, the package, the serving wheels and
# build/bench/infer_load fit one device call's 64 MiB beside the working tree; about 35 s on two cores)
tar cf - -C build-gpu python | xz -T0 -9 > build-gpu/pyxz/python.tar.xz
du -sh build-gpu/pyxz/python.tar.xz
