"""Detection's operators on the CPU engine against ONNX Runtime, on seeded random data beyond the
ONNX node cases: RoiAlign (avg and max, opset 10's and 16's coordinates, sampling ratios, regions
partly outside the image) and NonMaxSuppression (both box formats, thresholds given or not,
many boxes and classes, a computed max_output_boxes_per_class), through `kiln check`."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def _save(tmp_path, name, nodes, inputs, outputs, initializers, opset):
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, initializers),
                              opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("opset,mode,ratio,transform", [
    (16, "avg", 0, "half_pixel"), (16, "max", 2, "half_pixel"), (16, "avg", 3, "output_half_pixel"),
    (16, "max", 0, "output_half_pixel"), (10, "avg", 0, None), (10, "max", 1, None)])
def test_roi_align_matches_onnxruntime(tmp_path, check_against_onnxruntime, opset, mode, ratio, transform):
    rng = np.random.default_rng(opset * 7 + ratio)
    x = rng.standard_normal((2, 3, 12, 10)).astype(np.float32)
    corners = rng.uniform(-3, 14, size=(9, 2, 2)).astype(np.float32)  # some regions leave the image
    rois = np.concatenate([corners.min(axis=1), corners.max(axis=1)], axis=1)  # x1, y1, x2, y2
    batch = rng.integers(0, 2, size=9).astype(np.int64)
    attrs = dict(mode=mode, output_height=3, output_width=4, sampling_ratio=ratio, spatial_scale=0.75)
    if transform:
        attrs["coordinate_transformation_mode"] = transform
    path = _save(tmp_path, "roi_align", [helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y"], **attrs)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)),
                  helper.make_tensor_value_info("rois", TensorProto.FLOAT, [9, 4]),
                  helper.make_tensor_value_info("batch", TensorProto.INT64, [9])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["r", "c", "h", "w"])], [], opset)
    r = check_against_onnxruntime(path, {"x": x, "rois": rois, "batch": batch})
    assert "y [9, 3, 3, 4]" in r.stdout


def test_roi_align_refuses_a_batch_index_outside_x(run_kiln, tmp_path):
    path = _save(tmp_path, "roi_align", [helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y"], name="roi")],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["r", "c", "h", "w"])],
                 [numpy_helper.from_array(np.array([[0, 0, 2, 2]], dtype=np.float32), "rois"),
                  numpy_helper.from_array(np.array([3], dtype=np.int64), "batch")], 16)
    r = run_kiln("run", path, "--random")
    assert r.returncode == 1 and "batch_indices[0] is 3" in r.stderr and "roi" in r.stderr, r.describe()


@pytest.mark.parametrize("center,score_threshold,seed", [(0, None, 1), (0, 0.3, 2), (1, 0.0, 3), (1, None, 4)])
def test_non_max_suppression_matches_onnxruntime(tmp_path, check_against_onnxruntime, center, score_threshold, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(0, 20, size=(2, 3, 40, 2)).astype(np.float32)
    if center:  # x_center, y_center, width, height
        boxes = np.concatenate([a, rng.uniform(0.5, 8, size=(3, 40, 2)).astype(np.float32)], axis=2)
    else:  # two corners in either order
        boxes = np.concatenate([a, a + rng.uniform(-8, 8, size=(3, 40, 2)).astype(np.float32)], axis=2)[..., [1, 0, 3, 2]]
    scores = rng.random((3, 5, 40)).astype(np.float32)
    scores[0, 0, :10] = 0.5  # equal scores: the lower index first
    # max_output_boxes_per_class computed from the input's shape (not a constant), so the number
    # of selected boxes is known only when the model runs.
    nodes = [helper.make_node("Shape", ["scores"], ["shape"]),
             helper.make_node("Gather", ["shape", "last"], ["spatial"], axis=0),
             helper.make_node("Div", ["spatial", "four"], ["max_out"]),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou"] + (["score"] if score_threshold is not None else []),
                              ["selected"], center_point_box=center)]
    initializers = [numpy_helper.from_array(np.array([2], dtype=np.int64), "last"),
                    numpy_helper.from_array(np.array([4], dtype=np.int64), "four"),
                    numpy_helper.from_array(np.array([0.4], dtype=np.float32), "iou")]
    if score_threshold is not None:
        initializers.append(numpy_helper.from_array(np.array([score_threshold], dtype=np.float32), "score"))
    path = _save(tmp_path, "nms", nodes,
                 [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["batches", "spatial", 4]),
                  helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batches", 5, "spatial"])],
                 [helper.make_tensor_value_info("selected", TensorProto.INT64, ["selected", 3])], initializers, 11)
    r = check_against_onnxruntime(path, {"boxes": boxes, "scores": scores})
    assert "selected [" in r.stdout and "selected [0, 3]" not in r.stdout, r.stdout
