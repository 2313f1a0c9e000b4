"""Small QuantizeLinear -> DequantizeLinear graphs with constant scales and zero points, per
tensor and per channel, int8 and uint8, and inputs that hit exact .5 quotients and saturation:
shared by tests/e2e (CPU engine vs ONNX Runtime) and tests/gpu (GPU vs CPU engine)."""
from __future__ import annotations

import numpy as np


def make_model(path, qtype, per_channel):
    import onnx
    from onnx import TensorProto, helper

    c = 3
    scale = np.array([0.5, 0.25, 2.0], np.float32) if per_channel else np.array(0.5, np.float32)
    zero = (np.array([0, 3, -2], np.int8) if qtype == "int8" else np.array([128, 120, 0], np.uint8)) if per_channel \
        else (np.array(-1, np.int8) if qtype == "int8" else np.array(128, np.uint8))
    tp = TensorProto.INT8 if qtype == "int8" else TensorProto.UINT8
    inits = [helper.make_tensor("scale", TensorProto.FLOAT, scale.shape, scale.ravel().tolist()),
             helper.make_tensor("zero", tp, zero.shape, zero.ravel().tolist())]
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], axis=1),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c, 4, 5])],
                              [helper.make_tensor_value_info("q", tp, [2, c, 4, 5]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, c, 4, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every ONNX Runtime reads
    onnx.save(model, path)


def make_input():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((2, 3, 4, 5)) * 60).astype(np.float32)
    x.flat[:8] = [0.25, 0.75, -0.25, 1.25, 2.5, -2.5, 1000.0, -1000.0]  # halves and saturation
    return x
