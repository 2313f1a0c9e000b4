# Sourced on the GPU machine, in the tree a device call copied there: unpacks what the call carried
# (build-gpu/dist/kiln.xz from scripts/build_gpu.sh, build-gpu/pyxz/python.tar.xz from
# scripts/build_gpu_python.sh, build-gpu/serving-site.tar.xz from scripts/serving_wheels.sh, each
# when present) and sets the environment the GPU suites and benchmarks run in:
#
#   source scripts/gpu_env.sh && python3 scripts/gpu_gate.py run --out /tmp/gate --gpus 4
#
# cuDNN comes from torch's wheel there (../shared/gpu/README.md).
CUDNN_LIB=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${CUDNN_LIB:+$CUDNN_LIB:}/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [[ -f build-gpu/dist/kiln.xz ]]; then
  xz -dkc build-gpu/dist/kiln.xz > build-gpu/kiln && chmod +x build-gpu/kiln
fi
if [[ -f build-gpu/pyxz/python.tar.xz ]]; then
  tar xJf build-gpu/pyxz/python.tar.xz -C build-gpu
  # gRPC's libraries, for the package's native gRPC front (and for each other: only the module
  # itself has an rpath to them)
  [[ -d build-gpu/python/kiln/libs ]] && export LD_LIBRARY_PATH=$PWD/build-gpu/python/kiln/libs:$LD_LIBRARY_PATH
fi
if [[ -f build-gpu/serving-site.tar.xz && ! -f /tmp/kiln-gate-serving-site/.done ]]; then
  tar xJf build-gpu/serving-site.tar.xz -C /tmp
fi
export KILN_BIN=$PWD/build-gpu/kiln PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/build-gpu/python${PYTHONPATH:+:$PYTHONPATH}
