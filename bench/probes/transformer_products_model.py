#!/usr/bin/env python3
"""A model of one transformer block's four matrix products at BERT-base's sizes, nothing else:
the products' tactics timed by `kiln build` on the shapes bench/probes/cutlass_gemm_probe.cu
times alone, so the two can be compared in one call.

    python3 bench/probes/transformer_products_model.py OUT.onnx [--tokens 4096] [--hidden 768] [--ffn 3072]

x [tokens, hidden] ->  x Wqkv + b                      (output qkv)
                       x Wo + b + x                    (output attn: a residual)
                       gelu(x W1 + b1) W2 + b2 + x     (output ffn: the GELU value feeds only W2)
Weights are seeded random normals; calibrate with `kiln calibrate` on random inputs.
"""
import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--ffn", type=int, default=3072)
    a = ap.parse_args()
    rng = np.random.default_rng(5)
    h, f = a.hidden, a.ffn
    weights = {"wqkv": (h, 3 * h), "bqkv": (3 * h,), "wo": (h, h), "bo": (h,), "w1": (h, f), "b1": (f,),
               "w2": (f, h), "b2": (h,)}
    init = [numpy_helper.from_array((rng.standard_normal(s) * (0.02 if len(s) == 2 else 0.1)).astype(np.float32), n)
            for n, s in weights.items()]
    node = helper.make_node
    nodes = [node("MatMul", ["x", "wqkv"], ["p_qkv"]), node("Add", ["p_qkv", "bqkv"], ["qkv"]),
             node("MatMul", ["x", "wo"], ["p_o"]), node("Add", ["p_o", "bo"], ["h_o"]), node("Add", ["h_o", "x"], ["attn"]),
             node("MatMul", ["x", "w1"], ["p_1"]), node("Add", ["p_1", "b1"], ["h_1"]), node("Gelu", ["h_1"], ["g_1"]),
             node("MatMul", ["g_1", "w2"], ["p_2"]), node("Add", ["p_2", "b2"], ["h_2"]), node("Add", ["h_2", "x"], ["ffn"])]
    shape = lambda n: [a.tokens, n]  # noqa: E731
    graph = helper.make_graph(nodes, "transformer_products", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape(h))],
                              [helper.make_tensor_value_info("qkv", TensorProto.FLOAT, shape(3 * h)),
                               helper.make_tensor_value_info("attn", TensorProto.FLOAT, shape(h)),
                               helper.make_tensor_value_info("ffn", TensorProto.FLOAT, shape(h))], init)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), a.out)


if __name__ == "__main__":
    main()
