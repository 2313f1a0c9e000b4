#!/usr/bin/env bash
# Diagnostics on the GPU machine (not a test), after tests/gpu/run_on_gpu.sh info has unpacked
# the binary. Stages:
#   tactics MODEL BATCH   build fp16 with every tactic candidate's time logged, and profile it
#   compare MODEL BATCH   layer-by-layer comparison of fp16 on the GPU with the CPU engine
# e.g. tests/gpu/diagnose.sh tactics resnet50 1 compare mobilenet_v2 8
# KILN_DIAG_PRECISION=int8 makes `tactics` build INT8 (calibrated on 32 random inputs).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
CUDNN=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${CUDNN}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
K=$PWD/build-gpu/kiln
M=/tmp/diag-models
mkdir -p $M
export_once() { [[ -f $M/$1.onnx ]] || python3 scripts/export_model.py $1 -o $M/$1.onnx --size 224 > /dev/null 2>&1; }
while (($# >= 3)); do
  stage=$1 model=$2 b=$3
  shift 3
  export_once $model
  tag=${model}_b$b
  case $stage in
    tactics)
      prec=${KILN_DIAG_PRECISION:-fp16}
      extra=()
      if [[ $prec == int8 ]]; then
        [[ -f $M/${model}_calib.npy ]] || python3 -c "import sys, numpy as np; sys.path.insert(0, 'scripts'); import export_model; np.save('$M/${model}_calib.npy', export_model.input_maker('$model', size=224)(32, seed=5)[0])"
        extra=(--calib $M/${model}_calib.npy --calib-cache $M/$model.calib)
        tag=${tag}_int8
      fi
      KILN_TACTIC_LOG=1 $K bench $M/$model.onnx --$prec "${extra[@]}" --batch $b -v --profile --json $OUT/${tag}_profile.json > $OUT/${tag}_tactics.log 2>&1
      echo "$tag: $(grep -E "median" $OUT/${tag}_tactics.log)"
      python3 - "$OUT/${tag}_profile.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
layers = sorted(r["profile"]["layers"], key=lambda l: -l["median_ms"])
total = r["profile"]["total_ms"]
print(f"  profile total {total:.3f} ms; slowest layers:")
for l in layers[:25]:
    print(f"  {l['median_ms']*1000:8.1f} us  {l['name'][:60]:60s} {l.get('tactic', '')}")
PY
      ;;
    compare)
      $K run $M/$model.onnx --random --seed 3 --batch $b --mark-outputs all -o /tmp/cpu_$tag > /dev/null 2>&1
      $K run $M/$model.onnx --random --seed 3 --batch $b --device cuda --fp16 -v --mark-outputs all -o /tmp/gpu_$tag > $OUT/${tag}_build.log 2>&1
      python3 scripts/compare_outputs.py /tmp/cpu_$tag /tmp/gpu_$tag --model $M/$model.onnx > $OUT/${tag}_cmp.log
      echo "$tag: $(grep -c BAD $OUT/${tag}_cmp.log) tensors beyond 1e-2; first:"; grep -m3 BAD $OUT/${tag}_cmp.log
      ;;
    *) echo "unknown stage $stage"; exit 1 ;;
  esac
done
