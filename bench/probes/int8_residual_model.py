#!/usr/bin/env python3
"""A ResNet-50 bottleneck's 1x1 convolutions alone, for profiling kiln's INT8 kernels (C = 64
and size 56 is layer1, C = 256 and size 14 layer3):
x -> c1 = Relu(Conv1x1 C->C) -> r = Conv1x1 C->4C (int8 residual)
                            -> c2 = Relu(Conv1x1 C->4C + r) -> y = Conv1x1 4C->C
so c2 is the 1x1 convolution with an int8 residual and an int8 output.

    python3 bench/probes/int8_residual_model.py OUT.onnx CALIB.npy [--batch 128 --size 56 --channels 64]
"""
import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("calib")
ap.add_argument("--batch", type=int, default=128)
ap.add_argument("--size", type=int, default=56)
ap.add_argument("--channels", type=int, default=64)
a = ap.parse_args()
rng = np.random.default_rng(0)
c = a.channels
w = {"w1": (c, c), "wd": (4 * c, c), "w2": (4 * c, c), "w3": (c, 4 * c)}
inits = [numpy_helper.from_array((rng.standard_normal((o, i, 1, 1)) / np.sqrt(i)).astype(np.float32), n) for n, (o, i) in w.items()]
nodes = [helper.make_node("Conv", ["x", "w1"], ["a1"], name="c1"), helper.make_node("Relu", ["a1"], ["y1"]),
         helper.make_node("Conv", ["y1", "wd"], ["r"], name="down"),
         helper.make_node("Conv", ["y1", "w2"], ["a2"], name="c2"), helper.make_node("Add", ["a2", "r"], ["s2"]),
         helper.make_node("Relu", ["s2"], ["y2"]), helper.make_node("Conv", ["y2", "w3"], ["y"], name="c3")]
shape = [a.batch, c, a.size, a.size]
g = helper.make_graph(nodes, "residual_1x1", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), a.model)
np.save(a.calib, rng.standard_normal(shape).astype(np.float32))  # one batch
