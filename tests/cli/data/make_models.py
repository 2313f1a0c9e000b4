"""Makes the tiny models and image the CLI tests use (committed; rerun to regenerate).

    .venv/bin/python tests/cli/data/make_models.py
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))


def save(graph, name, opset=17):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="kiln-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(HERE, name))


# A classifier head with a dynamic batch: x [N, 4] -> Gemm (3 classes) -> Relu -> y [N, 3].
w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4) / 10.0, "w")
save(helper.make_graph(
    [helper.make_node("Gemm", ["x", "w"], ["logits"], transB=1), helper.make_node("Relu", ["logits"], ["y"])],
    "dynamic_classifier",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
    [w]), "dynamic_classifier.onnx")

# Two inputs of a dynamic batch and sequence, as a transformer takes them: ids, mask [N, S] -> Add.
save(helper.make_graph(
    [helper.make_node("Add", ["ids", "mask"], ["y"])],
    "two_dynamic_inputs",
    [helper.make_tensor_value_info("ids", TensorProto.FLOAT, ["batch", "sequence"]),
     helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "sequence"])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence"])]), "two_dynamic_inputs.onnx")

# An image model: [1, 3, 8, 8] -> Identity, to check the image preprocessing end to end.
save(helper.make_graph(
    [helper.make_node("Identity", ["image"], ["pixels"])],
    "image_identity",
    [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8])],
    [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, [1, 3, 8, 8])]), "image_identity.onnx")

# Image means of a dynamic batch: [N, 3, 224, 224] -> ReduceMean over the pixels -> [N, 3]; kiln
# serve's large-request test (16 images are 9.6 MB, past gRPC's default message size).
save(helper.make_graph(
    [helper.make_node("ReduceMean", ["image"], ["mean"], axes=[2, 3], keepdims=0)],
    "image_means",
    [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 224, 224])],
    [helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["N", 3])]), "image_means.onnx")

# Slow products of a dynamic batch: x [N, 512, 512] times the 512x512 identity (made in the graph,
# so that the file stays small; exact in float32), 48 times, then the mean of each row's matrix ->
# y [N]: about 13 GFLOP a row, so that kiln serve's queue-bound test finds its run busy on the CPU
# engine.
nodes = [helper.make_node("ConstantOfShape", ["w_shape"], ["zeros"]),
         helper.make_node("EyeLike", ["zeros"], ["w"])]
last = "x"
for i in range(48):
    nodes.append(helper.make_node("MatMul", [last, "w"], [f"p{i}"]))
    last = f"p{i}"
nodes.append(helper.make_node("ReduceMean", [last], ["y"], axes=[1, 2], keepdims=0))
save(helper.make_graph(
    nodes, "slow_products",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 512, 512])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
    [numpy_helper.from_array(np.array([512, 512], np.int64), "w_shape")]), "slow_products.onnx")

# Wide rows of a dynamic batch: x [N, 65536] -> Identity -> y [N, 65536], 256 KB a row each way;
# kiln serve's test of a stream whose client takes no answers.
save(helper.make_graph(
    [helper.make_node("Identity", ["x"], ["y"])],
    "wide_identity",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 65536])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 65536])]), "wide_identity.onnx")

# A pure red 16x12 PPM photo (stb_image reads binary PPM; no image library needed here).
with open(os.path.join(HERE, "red_16x12.ppm"), "wb") as f:
    f.write(b"P6\n16 12\n255\n" + bytes([255, 0, 0]) * (16 * 12))
