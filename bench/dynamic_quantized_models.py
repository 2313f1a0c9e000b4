"""BERT-base as ONNX Runtime's dynamic quantization writes it, for the CPU benches
(bench/cpu_models_ab.py): bench/cpu_compare.py's export of BERT-base (random weights, sequence
128), then onnxruntime.quantization.quantize_dynamic with int8 weights: every MatMul by weights
becomes a DynamicQuantizeLinear of its input and a MatMulInteger, rescaled in float after.

    .venv/bin/python bench/dynamic_quantized_models.py --out DIR    # writes DIR/bert_base_dynamic_int8.onnx
"""
from __future__ import annotations

import argparse
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for the .onnx files")
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cpu_compare
    from onnxruntime.quantization import QuantType, quantize_dynamic

    os.makedirs(args.out, exist_ok=True)
    fp32 = os.path.join(args.out, "bert_base.onnx")
    if not os.path.exists(fp32):
        cpu_compare.export("bert_base", fp32)
    path = os.path.join(args.out, "bert_base_dynamic_int8.onnx")
    quantize_dynamic(fp32, path, weight_type=QuantType.QInt8)
    print(path)


if __name__ == "__main__":
    main()
