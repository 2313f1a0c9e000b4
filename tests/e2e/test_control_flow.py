"""If on the CPU engine against ONNX Runtime: branches whose outputs differ in shape, values read
from the enclosing graphs, nested Ifs, engine files, malformed Ifs refused with a reason; and
torchvision's detection models (random weights; Faster R-CNN, RetinaNet, SSDlite), whose box
selection runs in an If, end to end."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from test_errors import assert_clean_error

OPSET = 17


def _branch(name, nodes, output, shape, initializers=()):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(output, TensorProto.FLOAT, shape)],
                             list(initializers))


def if_model(nested: bool = False) -> onnx.ModelProto:
    """y = relu(x) * w when sum(x) > 0, else the first row of -x; with `nested`, the else branch
    is itself an If on the first element of x, whose then branch reads w (two scopes out)."""
    then_branch = _branch("then", [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "w"], ["t"])],
                          "t", ["n", 4])
    first_row = [helper.make_node("Neg", ["x"], ["neg"]), helper.make_node("Slice", ["neg", "s0", "s1"], ["e"])]
    slices = [numpy_helper.from_array(np.array([0], np.int64), "s0"), numpy_helper.from_array(np.array([1], np.int64), "s1")]
    else_branch = _branch("else", first_row, "e", ["m", 4], slices)
    if nested:
        inner_then = _branch("inner_then", [helper.make_node("Add", ["x", "w"], ["it"])], "it", ["n", 4])
        inner = helper.make_node("If", ["c2"], ["e2"], then_branch=inner_then, else_branch=else_branch, name="inner_if")
        first = [helper.make_node("Flatten", ["x"], ["flat"], axis=0),
                 helper.make_node("Gather", ["flat", "zero_i"], ["x0"], axis=1),
                 helper.make_node("Greater", ["x0", "zero"], ["c2"]), inner]
        else_branch = _branch("else_outer", first, "e2", [None, 4],
                              [numpy_helper.from_array(np.array(0, np.int64), "zero_i")])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch, name="the_if"),
             helper.make_node("Shape", ["y"], ["y_shape"])]
    graph = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", 4]),
                               helper.make_tensor_value_info("y_shape", TensorProto.INT64, [2])],
                              [numpy_helper.from_array(np.array(0, np.float32), "zero"),
                               numpy_helper.from_array(np.linspace(1, 2, 4, dtype=np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model


def _inputs(tmp_path, offset: float, first: float = 1.0) -> str:
    x = np.random.default_rng(int(offset * 10) + 100).standard_normal((3, 4)).astype(np.float32) + offset
    x[0, 0] = first
    path = tmp_path / f"x_{offset}_{first}.npy"
    np.save(path, x)
    return f"x={path}"


@pytest.mark.parametrize("nested", [False, True], ids=["if", "nested_if"])
def test_both_branches_match_onnxruntime(run_kiln, tmp_path, nested):
    path = tmp_path / "if.onnx"
    onnx.save(if_model(nested), path)
    cases = [(2.0, 1.0, "y [3, 4]"), (-2.0, 1.0, "y [3, 4]" if nested else "y [1, 4]"), (-2.0, -1.0, "y [1, 4]")]
    for offset, first, shape in cases:
        r = run_kiln("check", path, "--inputs", _inputs(tmp_path, offset, first))
        assert r.returncode == 0 and "PASSED" in r.stdout and shape in r.stdout, r.describe()


def test_an_engine_file_keeps_the_branches(run_kiln, tmp_path):
    path = tmp_path / "if.onnx"
    onnx.save(if_model(), path)
    engine = tmp_path / "if.engine"
    assert run_kiln("build", path, "--device", "cpu", "-o", engine).returncode == 0
    for offset, rows in ((2.0, 3), (-2.0, 1)):
        r = run_kiln("run", engine, "--input", _inputs(tmp_path, offset), "-o", tmp_path / f"out{offset}")
        assert r.returncode == 0, r.describe()
        assert np.load(tmp_path / f"out{offset}" / "y_shape.npy").tolist() == [rows, 4]


def test_malformed_ifs_are_refused_with_a_reason(run_kiln, tmp_path):
    def branch(model, name):
        return next(a for a in model.graph.node[2].attribute if a.name == name)

    model = if_model()
    model.graph.node[2].attribute.remove(branch(model, "else_branch"))
    path = tmp_path / "no_else.onnx"
    onnx.save(model, path)
    assert_clean_error(run_kiln("inspect", path), "the_if", "else_branch")
    model = if_model()
    for name in ("then_branch", "else_branch"):  # neither branch says what type y is
        branch(model, name).g.output[0].type.tensor_type.elem_type = 0
    path = tmp_path / "untyped.onnx"
    onnx.save(model, path)
    assert_clean_error(run_kiln("inspect", path), "the_if", "declares the type")
    # Ifs nested past the depth limit.
    inner = _branch("leaf", [helper.make_node("Identity", ["x"], ["leaf_out"])], "leaf_out", ["N", 4])
    for depth in range(20):
        leaf = _branch(f"leaf{depth}", [helper.make_node("Identity", ["x"], [f"leaf{depth}_out"])], f"leaf{depth}_out", ["N", 4])
        node = helper.make_node("If", ["c"], [f"out{depth}"], then_branch=inner, else_branch=leaf)
        inner = _branch(f"level{depth}", [node], f"out{depth}", ["N", 4])
    model = if_model()
    branch(model, "then_branch").g.CopyFrom(inner)
    path = tmp_path / "deep.onnx"
    onnx.save(model, path)
    assert_clean_error(run_kiln("inspect", path), "nested more than 16 deep")


# --- torchvision's detection models: their box selection (batched NMS) runs in an If --------------

THRESHOLDS = {"fasterrcnn_mobilenet_v3_large_320_fpn": {"box_score_thresh": 0.0}, "retinanet_resnet50_fpn": {"score_thresh": 0.0},
              "ssdlite320_mobilenet_v3_large": {"score_thresh": 0.0}}


def _export_detection(name: str, model_cache: str) -> str:
    path = os.path.join(model_cache, f"{name}_128_thresh0.onnx")
    if os.path.exists(path):
        return path
    import torch
    import torchvision

    torch.manual_seed(0)
    # Random weights score every box low: the score thresholds go to 0 so that boxes remain.
    kwargs = dict(weights=None, weights_backbone=None, **THRESHOLDS[name])
    if not name.startswith("ssd"):
        kwargs.update(min_size=128, max_size=128)
    model = getattr(torchvision.models.detection, name)(**kwargs).eval()
    torch.onnx.export(model, ([torch.rand(3, 128, 128)],), path + ".tmp", opset_version=OPSET, dynamo=False,
                      input_names=["images"])
    os.replace(path + ".tmp", path)
    return path


def _matched(boxes_a, scores_a, labels_a, boxes_b, scores_b, labels_b) -> float:
    """The share of detections of a that b has too (same label, score within 1e-3, box corners
    within 0.05 pixels): detections whose scores nearly tie may come in another order."""
    found = 0
    for box, score, label in zip(boxes_a, scores_a, labels_a):
        close = (labels_b == label) & (np.abs(scores_b - score) < 1e-3) & (np.abs(boxes_b - box).max(axis=1) < 0.05)
        found += bool(close.any())
    return found / max(len(scores_a), 1)


@pytest.mark.parametrize("name", list(THRESHOLDS))
def test_detection_models_match_onnxruntime(run_kiln, model_cache, tmp_path, name):
    import onnxruntime as ort

    path = _export_detection(name, model_cache)
    image = np.random.default_rng(0).random((3, 128, 128)).astype(np.float32)
    np.save(tmp_path / "image.npy", image)
    r = run_kiln("run", path, "--input", f"images={tmp_path / 'image.npy'}", "-o", tmp_path / "out")
    assert r.returncode == 0, r.describe()
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    want = dict(zip(names, session.run(None, {"images": image})))
    got = {n: np.load(tmp_path / "out" / f"{n}.npy") for n in names}
    # The outputs by what they hold (the models list them in different orders): boxes [n, 4],
    # scores [n] float, labels [n] int64.
    boxes = next(n for n in names if want[n].ndim == 2)
    scores = next(n for n in names if want[n].ndim == 1 and want[n].dtype == np.float32)
    labels = next(n for n in names if want[n].dtype == np.int64)
    assert want[boxes].shape[0] > 0
    assert all(got[n].shape == want[n].shape and got[n].dtype == want[n].dtype for n in names)
    assert _matched(want[boxes], want[scores], want[labels], got[boxes], got[scores], got[labels]) >= 0.95
    assert _matched(got[boxes], got[scores], got[labels], want[boxes], want[scores], want[labels]) >= 0.95
