"""Writes the tiny ONNX models used by tests/unit/elementwise_test.cc and reduce_test.cc.

Run from the repository root: .venv/bin/python tests/data/make_elementwise_models.py
They exercise the importer's rewriting of old opset forms into the IR's newest form.
"""
import onnx
from onnx import TensorProto, helper

OUT = "tests/data/"


def save(name, nodes, inputs, outputs, opset, inits=()):
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, ir_version=7, opset_imports=[helper.make_opsetid("", opset)], producer_name="kiln-tests")
    # No checker: it insists on output shapes, and the tests check what kiln infers.
    onnx.save(m, OUT + name + ".onnx")


f = TensorProto.FLOAT
# Opset 11 Softmax: flattens to 2-D at axis 1, normalizes over dims 1 and 2 together.
save("softmax_opset11_axis1", [helper.make_node("Softmax", ["X"], ["Y"], axis=1)],
     [helper.make_tensor_value_info("X", f, [2, 3, 4])], [helper.make_tensor_value_info("Y", f, None)], 11)
# Opset 11 ReduceSum and opset 13 ReduceMean take axes as an attribute.
save("reducesum_opset11_axes_attr", [helper.make_node("ReduceSum", ["X"], ["Y"], axes=[1], keepdims=0)],
     [helper.make_tensor_value_info("X", f, [2, 3, 4])], [helper.make_tensor_value_info("Y", f, None)], 11)
save("reducemean_opset13_axes_attr", [helper.make_node("ReduceMean", ["X"], ["Y"], axes=[-1])],
     [helper.make_tensor_value_info("X", f, [2, 3, 4])], [helper.make_tensor_value_info("Y", f, None)], 13)
# A legacy-export shape chain: Reshape(X, Concat(Shape(X) / [1, 3], [3])) turns [N, 6] into
# [N, 2, 3]; N must stay symbolic through Div.
save("symbolic_div_reshape",
     [helper.make_node("Shape", ["X"], ["s"]),
      helper.make_node("Div", ["s", "d"], ["h"]),
      helper.make_node("Concat", ["h", "three"], ["target"], axis=0),
      helper.make_node("Reshape", ["X", "target"], ["Y"])],
     [helper.make_tensor_value_info("X", f, ["N", 6])], [helper.make_tensor_value_info("Y", f, None)], 13,
     [helper.make_tensor("d", TensorProto.INT64, [2], [1, 3]),
      helper.make_tensor("three", TensorProto.INT64, [1], [3])])
