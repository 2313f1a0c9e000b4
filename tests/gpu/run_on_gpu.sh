#!/usr/bin/env bash
# The GPU test suites in one command, for the GPU machine (docs/testing.md): a kiln
# built here (scripts/build_gpu.sh -> build-gpu/) runs there with cuDNN from torch's wheel.
#   tests/gpu/run_on_gpu.sh STAGE...    stages: info conformance models dynamic python bench dynbench
# (python: the package's GPU tests, with the module of scripts/build_gpu_python.sh; carry build-gpu/python)
# Logs and JSON go to $OUT (default out/).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
CUDNN=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${CUDNN}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if [[ -f build-gpu/dist/kiln.xz ]]; then
  xz -dkc build-gpu/dist/kiln.xz > build-gpu/kiln && chmod +x build-gpu/kiln
fi
export KILN_BIN=$PWD/build-gpu/kiln
export PYTHONUNBUFFERED=1
status=0
for stage in "$@"; do
  echo "==> $stage"
  case $stage in
    info)
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
      "$KILN_BIN" --version ;;
    conformance)
      # onnx's own node cases of the installed onnx, on the GPU engine (fp32).
      [[ -d /tmp/onnx-node-tests/node ]] || python3 src/tools/generate_node_tests.py -o /tmp/onnx-node-tests > /dev/null
      "$KILN_BIN" conformance /tmp/onnx-node-tests --device cuda --json "$OUT/conformance_gpu.json" > "$OUT/conformance_gpu.log" 2>&1
      status=$((status | $?))
      grep -E "^FAIL" "$OUT/conformance_gpu.log" | head -60
      tail -2 "$OUT/conformance_gpu.log" | head -1 ;;
    dynamic)
      python3 -m pytest tests/gpu/test_gpu_dynamic.py -v -n 4 --timeout 600 -p no:cacheprovider -rA 2>&1 | tee "$OUT/gpu_dynamic.log" | tail -40
      status=$((status | ${PIPESTATUS[0]})) ;;
    models)
      python3 -m pytest tests/gpu -v -rf --timeout 600 -p no:cacheprovider --ignore tests/gpu/test_gpu_python.py --ignore tests/gpu/test_gpu_contexts.py \
        ${KILN_GPU_MODELS:+-k "$KILN_GPU_MODELS"} 2>&1 | tee "$OUT/gpu_models.log" | tail -40
      status=$((status | ${PIPESTATUS[0]})) ;;
    python)
      PYTHONPATH=$PWD/build-gpu/python python3 -m pytest tests/gpu/test_gpu_python.py tests/gpu/test_gpu_contexts.py -v -p no:cacheprovider 2>&1 |
        tee "$OUT/gpu_python.log" | tail -30
      status=$((status | ${PIPESTATUS[0]})) ;;
    dynbench)
      python3 bench/dynamic_bench.py --out "$OUT" 2>&1 | tee "$OUT/dynamic_bench.log" | tail -30
      status=$((status | ${PIPESTATUS[0]})) ;;
    bench)
      python3 bench/gpu_bench.py --out "$OUT" ${KILN_BENCH_MODELS:+--models "$KILN_BENCH_MODELS"} 2>&1 | tee "$OUT/bench.log" | tail -60
      status=$((status | ${PIPESTATUS[0]})) ;;
    *) echo "unknown stage $stage"; status=1 ;;
  esac
done
exit $status
