#!/usr/bin/env bash
# Runs `kiln conformance` over a whole ONNX backend node test set and fails if any case whose
# ops kiln supports FAILs, or if fewer cases pass than MIN_PASSED (so that support cannot
# silently turn into "unsupported").
#   conformance_all.sh KILN DIR MIN_PASSED [--filter REGEX]
#   conformance_all.sh KILN --generate PYTHON OUTDIR MIN_PASSED --onnx-version V
#       (the cases of the installed onnx, which must be version V: the floor counts its cases)
set -euo pipefail
kiln=$1; shift
if [[ $1 == --generate ]]; then
  python=$2 dir=$3; shift 3
  if [[ ! -d $dir/node ]]; then
    "$python" "$(dirname "$0")/../../src/tools/generate_node_tests.py" -o "$dir" > /dev/null
  fi
else
  dir=$1; shift
fi
min_passed=$1; shift
if [[ ${1:-} == --onnx-version ]]; then
  installed=$("$python" -c 'import onnx; print(onnx.__version__)')
  if [[ $installed != "$2" ]]; then
    echo "conformance: the floor of $min_passed counts the cases of onnx $2 (requirements/dev.lock); $python has onnx $installed" >&2
    exit 1
  fi
  shift 2
fi
summary=$("$kiln" conformance "$dir" "$@" | tee /dev/stderr | grep -E '^[0-9]+ cases: ' | tail -1)
echo "$summary"
passed=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$summary")
failed=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$summary")
if (( failed > 0 )); then echo "conformance: $failed case(s) FAILED" >&2; exit 1; fi
if (( passed < min_passed )); then echo "conformance: only $passed passed, expected at least $min_passed" >&2; exit 1; fi
echo "conformance: ok ($passed passed, at least $min_passed expected)"
