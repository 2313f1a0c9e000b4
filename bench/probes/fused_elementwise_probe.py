#!/usr/bin/env python3
"""Writes DenseNet-style models whose one memory-bound group is Concat -> Mul -> Add -> Relu
(parts of `--part` channels, `--parts` of them, NCHW [batch, channels, size, size]) or a
chain over two inputs of the output's shape, for `kiln bench --profile` and ncu to time the fused kernel alone.

    python3 bench/probes/fused_elementwise_probe.py --out DIR
"""
from __future__ import annotations

import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save(path, nodes, inits, inputs, out_shape):
    graph = helper.make_graph(nodes, os.path.basename(path), [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--size", type=int, default=28)
    p.add_argument("--parts", type=int, default=8)
    p.add_argument("--part", type=int, default=32)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(0)
    n, s, c = a.batch, a.size, a.parts * a.part

    # Each part is a 1x1 convolution's output (channels-last in an fp16 engine, as DenseNet's are).
    inits = [numpy_helper.from_array(rng.standard_normal([a.part, 8, 1, 1]).astype(np.float32), f"w{k}") for k in range(a.parts)]
    nodes = [helper.make_node("Conv", ["x", f"w{k}"], [f"p{k}"]) for k in range(a.parts)]
    inits += [numpy_helper.from_array(rng.uniform(0.5, 1.5, [1, c, 1, 1]).astype(np.float32), "scale"),
              numpy_helper.from_array(rng.uniform(-0.5, 0.5, [1, c, 1, 1]).astype(np.float32), "shift")]
    nodes += [helper.make_node("Concat", [f"p{k}" for k in range(a.parts)], ["joined"], axis=1),
              helper.make_node("Mul", ["joined", "scale"], ["scaled"]),
              helper.make_node("Add", ["scaled", "shift"], ["shifted"]),
              helper.make_node("Relu", ["shifted"], ["y"])]
    save(os.path.join(a.out, "concat_bn_relu.onnx"), nodes, inits, [("x", [n, 8, s, s])], [n, c, s, s])

    # A chain over two inputs read as the output is: (a * s + b) -> Sigmoid -> * a.
    inits = [numpy_helper.from_array(rng.uniform(0.5, 1.5, [1, c, 1, 1]).astype(np.float32), "scale")]
    nodes = [helper.make_node("Mul", ["a", "scale"], ["as"]), helper.make_node("Add", ["as", "b"], ["sum"]),
             helper.make_node("Sigmoid", ["sum"], ["g"]), helper.make_node("Mul", ["g", "a"], ["y"])]
    save(os.path.join(a.out, "residual_gate.onnx"), nodes, inits, [("a", [n, c, s, s]), ("b", [n, c, s, s])], [n, c, s, s])

if __name__ == "__main__":
    main()
