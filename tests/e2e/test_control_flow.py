"""If and Loop on the CPU engine against ONNX Runtime: branches whose outputs differ in shape,
values read from the enclosing graphs, nested Ifs, engine files, malformed Ifs refused with a
reason; loops with and without a trip count and condition, scan outputs, a carried value that
grows; and torchvision's detection models (random weights; Faster R-CNN, RetinaNet, SSDlite,
Mask R-CNN, FCOS), whose box selection runs in an If and whose masks are pasted in a Loop, end to end."""
from __future__ import annotations

import os
import re

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


def _x(offset: float, first: float = 1.0) -> np.ndarray:
    x = np.random.default_rng(int(offset * 10) + 100).standard_normal((3, 4)).astype(np.float32) + offset
    x[0, 0] = first
    return x


def _file_name(output: str) -> str:
    """kiln run names each file after its output, characters other than [A-Za-z0-9_.-] as "_"."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", output) + ".npy"


def run_both(run_kiln, tmp_path, path, feed: dict, engine=None) -> tuple[dict, dict]:
    """`kiln run` (of `engine` if given, else of the model) and ONNX Runtime on `feed`: their
    outputs by name. The comparison stays in this process, so the sanitized build's kiln (which
    has no Python package) runs these tests too."""
    import onnxruntime as ort

    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
    args = ["run", engine or path, "-o", out]
    for name, value in feed.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    r = run_kiln(*args)
    assert r.returncode == 0, r.describe()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    want = dict(zip(names, session.run(None, feed)))
    got = {n: np.load(out / _file_name(n)) for n in names}
    return got, want


def assert_same(got: dict, want: dict, tolerance: float = 1e-5) -> None:
    for name in want:
        assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype, \
            (name, got[name].shape, want[name].shape, got[name].dtype, want[name].dtype)
        np.testing.assert_allclose(got[name], want[name], rtol=tolerance, atol=tolerance, err_msg=name)


@pytest.mark.parametrize("nested", [False, True], ids=["if", "nested_if"])
def test_both_branches_match_onnxruntime(run_kiln, tmp_path, nested):
    path = tmp_path / "if.onnx"
    onnx.save(if_model(nested), path)
    cases = [(2.0, 1.0, 3), (-2.0, 1.0, 3 if nested else 1), (-2.0, -1.0, 1)]
    for offset, first, rows in cases:
        got, want = run_both(run_kiln, tmp_path, path, {"x": _x(offset, first)})
        assert_same(got, want)
        assert got["y"].shape == (rows, 4)


def test_an_if_on_a_static_shape_is_inlined(run_kiln, tmp_path):
    """The condition of an If on x's first dim (3 > 1, known when building) folds to a constant:
    the branch it picks replaces the If (in it, an If on the data stays one)."""
    model = if_model(nested=True)
    graph = model.graph
    del graph.node[:2]  # ReduceSum, Greater: the condition comes from x's shape instead
    graph.node.insert(0, helper.make_node("Shape", ["x"], ["x_shape"]))
    graph.node.insert(1, helper.make_node("Gather", ["x_shape", "zero_i"], ["rows"], axis=0))
    graph.node.insert(2, helper.make_node("Greater", ["rows", "one_i"], ["c"]))
    graph.initializer.extend([numpy_helper.from_array(np.array(0, np.int64), "zero_i"),
                              numpy_helper.from_array(np.array(1, np.int64), "one_i")])
    graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    for cond in (True, False):  # rows > 1, or (with the comparison reversed) not
        graph.node[2].op_type = "Greater" if cond else "Less"
        path = tmp_path / f"static_{cond}.onnx"
        onnx.save(model, path)
        layers = run_kiln("inspect", path, "--optimize")
        assert layers.returncode == 0, layers.describe()
        ifs = [line for line in layers.stdout.splitlines() if " If " in line]
        assert len(ifs) == (0 if cond else 1) and "the_if/" in layers.stdout, layers.stdout  # the branch's nodes
        for offset, first in ((2.0, 1.0), (-2.0, -1.0)):
            assert_same(*run_both(run_kiln, tmp_path, path, {"x": _x(offset, first)}))


def test_an_engine_file_keeps_the_branches(run_kiln, tmp_path):
    path = tmp_path / "if.onnx"
    onnx.save(if_model(), path)
    engine = tmp_path / "if.engine"
    assert run_kiln("build", path, "--device", "cpu", "-o", engine).returncode == 0
    for offset, rows in ((2.0, 3), (-2.0, 1)):
        got, want = run_both(run_kiln, tmp_path, path, {"x": _x(offset)}, engine=engine)
        assert_same(got, want)
        assert got["y_shape"].tolist() == [rows, 4]


def test_malformed_ifs_are_refused_with_a_reason(run_kiln, tmp_path):
    def branch(model, name):
        return next(a for a in model.graph.node[2].attribute if a.name == name)

    model = if_model()
    model.graph.node[2].attribute.remove(branch(model, "else_branch"))
    path = tmp_path / "no_else.onnx"
    onnx.save(model, path)
    assert_clean_error(run_kiln("inspect", path), "the_if", "else_branch")
    # Neither branch says what type y is, and the type cannot be inferred: the then branch reads
    # a value whose rank only the run decides (x squeezed along axes the caller gives).
    model = if_model()
    for name in ("then_branch", "else_branch"):
        branch(model, name).g.output[0].ClearField("type")
    branch(model, "then_branch").g.node[0].input[0] = "x_any"
    model.graph.node.insert(0, helper.make_node("Squeeze", ["x", "axes"], ["x_any"]))
    model.graph.input.append(helper.make_tensor_value_info("axes", TensorProto.INT64, ["k"]))
    path = tmp_path / "untyped.onnx"
    onnx.save(model, path)
    assert_clean_error(run_kiln("inspect", path), "the_if", "declares the type", "cannot be inferred")
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
    # A Loop whose body takes fewer inputs than the iteration, the condition and the carried values.
    model = loop_model(True, True)
    body = model.graph.node[0].attribute[0].g
    del body.input[3]
    path = tmp_path / "short_body.onnx"
    onnx.save(model, path)
    assert_clean_error(run_kiln("inspect", path), "the_loop", "its body must take 4 inputs")


def test_subgraphs_without_output_types_take_them_from_their_inference(run_kiln, tmp_path):
    """Neither branch of an If (nested Ifs too) nor a Loop's body declares its outputs' types, as
    some converters write them: kiln infers them from the subgraphs, and both match ONNX Runtime."""
    model = if_model(nested=True)
    for attribute in model.graph.node[2].attribute:
        attribute.g.output[0].ClearField("type")
    path = tmp_path / "untyped_if.onnx"
    onnx.save(model, path)
    for x in (_x(1.0), _x(-1.0, first=1.0), _x(-1.0, first=-1.0)):
        assert_same(*run_both(run_kiln, tmp_path, path, {"x": x}))
    model = loop_model(True, True)
    for output in model.graph.node[0].attribute[0].g.output[1:]:
        output.ClearField("type")
    path = tmp_path / "untyped_loop.onnx"
    onnx.save(model, path)
    feed = {"x": np.array([[1.0, 2.0, 0.5, 1.5]], np.float32), "M": np.array(5, np.int64), "go": np.array(True)}
    assert_same(*run_both(run_kiln, tmp_path, path, feed))


def known_size_if_model(size_length) -> onnx.ModelProto:
    """As ONNX's expanded functions (AffineGrid's) test which form an input has: cond =
    (Size(size) == 3); the then branch splits `size` into its three elements, the else branch
    gives `size` whole three times (another dim); neither declares its outputs' types. x is
    reshaped to the elements joined, and a second If on cond reads the reshaped value (of a rank
    known only when the first If's dims are)."""
    untyped = lambda names: [onnx.ValueInfoProto(name=n) for n in names]
    then_split = helper.make_graph([helper.make_node("Split", ["size"], ["a", "b", "c"], axis=0, num_outputs=3)],
                                   "then_split", [], untyped(["a", "b", "c"]))
    else_whole = helper.make_graph([helper.make_node("Identity", ["size"], [n]) for n in ("d", "e", "f")],
                                   "else_whole", [], untyped(["d", "e", "f"]))
    then_same = helper.make_graph([helper.make_node("Neg", ["r"], ["g"])], "then_same", [], untyped(["g"]))
    else_more = helper.make_graph([helper.make_node("Unsqueeze", ["r", "zero_1d"], ["h"])], "else_more", [], untyped(["h"]))
    nodes = [helper.make_node("Size", ["size"], ["size_n"]),
             helper.make_node("Equal", ["size_n", "three"], ["cond"]),
             helper.make_node("If", ["cond"], ["n0", "n1", "n2"], then_branch=then_split, else_branch=else_whole,
                              name="split_if"),
             helper.make_node("Concat", ["n0", "n1", "n2"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_same, else_branch=else_more, name="rank_if")]
    graph = helper.make_graph(nodes, "known_size_if",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
                               helper.make_tensor_value_info("size", TensorProto.INT64, [size_length])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(3, np.int64), "three"),
                               numpy_helper.from_array(np.array([0], np.int64), "zero_1d")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_an_if_on_known_sizes_takes_the_types_of_the_branch_that_runs(run_kiln, tmp_path):
    """The condition compares sizes known when building: the If's outputs take the dims of the
    branch that runs (here [1] each, where the other branch gives [3]), so the shape made of them
    has a known length, the reshaped value a known rank, and the second If can be typed; both
    fold to their then branches."""
    path = tmp_path / "known_size_if.onnx"
    onnx.save(known_size_if_model(3), path)
    layers = run_kiln("inspect", path, "--optimize")
    assert layers.returncode == 0, layers.describe()
    assert " If " not in layers.stdout and "split_if/" in layers.stdout and "rank_if/" in layers.stdout, layers.stdout
    x = np.random.default_rng(5).standard_normal((2, 3, 4)).astype(np.float32)
    for size in ([4, 3, 2], [1, 24, 1], [6, 2, 2]):
        got, want = run_both(run_kiln, tmp_path, path, {"x": x, "size": np.array(size, np.int64)})
        assert_same(got, want)
        assert got["y"].shape == tuple(size)
    # A length the build does not know leaves the condition to the run: the dims the branches give
    # differently stay unknown, the reshaped value's rank too, and the second If is refused,
    # named, with the reason.
    path = tmp_path / "unknown_size_if.onnx"
    onnx.save(known_size_if_model("k"), path)
    r = run_kiln("inspect", path)
    assert r.returncode != 0 and "rank_if" in r.stderr and "rank of input 'r' is not known" in r.stderr, r.describe()


def loop_model(with_trip_count: bool, with_cond: bool) -> onnx.ModelProto:
    """acc += x * w each iteration; the scan output stacks each iteration's acc; a carried
    history grows by a row each time (a carried value whose shape changes); the condition stays
    true while acc's sum is below 40. M and the condition are inputs, each optional."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["xw"]),
         helper.make_node("Add", ["acc_in", "xw"], ["acc_out"]),
         helper.make_node("Concat", ["hist_in", "acc_out"], ["hist_out"], axis=0),
         helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["cond_out"]),
         helper.make_node("Identity", ["acc_out"], ["scan"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("hist_in", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("hist_out", TensorProto.FLOAT, [None, 4]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [1, 4])])
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])]
    if with_trip_count:
        inputs.append(helper.make_tensor_value_info("M", TensorProto.INT64, []))
    if with_cond:
        inputs.append(helper.make_tensor_value_info("go", TensorProto.BOOL, []))
    loop = helper.make_node("Loop", ["M" if with_trip_count else "", "go" if with_cond else "", "acc0", "hist0"],
                            ["acc", "hist", "scans"], body=body, name="the_loop")
    graph = helper.make_graph(
        [loop], "loop", inputs,
        [helper.make_tensor_value_info("acc", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("hist", TensorProto.FLOAT, ["h", 4]),
         helper.make_tensor_value_info("scans", TensorProto.FLOAT, ["s", 1, 4])],
        [numpy_helper.from_array(np.zeros((1, 4), np.float32), "acc0"),
         numpy_helper.from_array(np.zeros((0, 4), np.float32), "hist0"),
         numpy_helper.from_array(np.linspace(0.5, 2, 4, dtype=np.float32).reshape(1, 4), "w"),
         numpy_helper.from_array(np.array(40, np.float32), "limit")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("trip_count,cond", [(True, True), (True, False), (False, True)],
                         ids=["for_while", "for", "while"])
def test_loop_matches_onnxruntime(run_kiln, tmp_path, trip_count, cond):
    path = tmp_path / "loop.onnx"
    onnx.save(loop_model(trip_count, cond), path)
    # M = 0 (no iteration: empty scans), 3, and 50 (the condition stops it first where it counts).
    for m in ((0, 3, 50) if trip_count else (None,)):
        feed = {"x": np.array([[1.0, 2.0, 0.5, 1.5]], np.float32)}
        if m is not None:
            feed["M"] = np.array(m, np.int64)
        if cond:
            feed["go"] = np.array(True)
        got, want = run_both(run_kiln, tmp_path, path, feed)
        assert_same(got, want)
        # The sum grows by 6.25 an iteration: the body's condition ends the loop after 7, with or
        # without a cond input (as ONNX Runtime runs it).
        rows = {0: 0, 3: 3, 50: 7, None: 7}[m]
        assert got["scans"].shape == (rows, 1, 4) and got["hist"].shape == (rows, 4)



def test_a_loop_extending_a_value_by_a_piece_that_does_not_fit_is_refused(run_kiln, tmp_path):
    """The engine appends what a body concatenates to its carried value (no copy of the whole value
    each iteration): a piece of another width is an error naming the loop and both shapes, as the
    body's Concat would have been."""
    body = helper.make_graph(
        [helper.make_node("Concat", ["hist_in", "piece"], ["hist_out"], axis=0),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("hist_in", TensorProto.FLOAT, [None, None])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("hist_out", TensorProto.FLOAT, [None, None])])
    loop = helper.make_node("Loop", ["M", "", "hist0"], ["hist"], body=body, name="grow")
    graph = helper.make_graph(
        [loop], "grow", [helper.make_tensor_value_info("M", TensorProto.INT64, []),
                         helper.make_tensor_value_info("hist0", TensorProto.FLOAT, [None, None])],
        [helper.make_tensor_value_info("hist", TensorProto.FLOAT, [None, None])],
        [numpy_helper.from_array(np.ones((1, 3), np.float32), "piece")])
    path = tmp_path / "grow.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)
    fits = {"M": np.array(4, np.int64), "hist0": np.zeros((2, 3), np.float32)}
    got, want = run_both(run_kiln, tmp_path, path, fits)
    assert got["hist"].shape == (6, 3)
    assert_same(got, want)
    np.save(tmp_path / "M.npy", np.array(2, np.int64))
    np.save(tmp_path / "hist0.npy", np.zeros((0, 4), np.float32))
    r = run_kiln("run", path, "-o", tmp_path / "bad", "--input", f"M={tmp_path / 'M.npy'}", "--input",
                 f"hist0={tmp_path / 'hist0.npy'}")
    assert r.returncode != 0 and "grow" in r.stderr and "1x3" in r.stderr and "0x4" in r.stderr, r.stderr

def _growing_loop(path, piece_rows_grow: bool) -> None:
    """Loop(M, go, hist0) whose body appends to hist a piece of value i: 2 rows each iteration, or
    i + 1 rows when piece_rows_grow; it stops once i reaches `stop` (an outer-scope input)."""
    two = numpy_helper.from_array(np.array([2], np.int64), "two")
    width = numpy_helper.from_array(np.array([3], np.int64), "width")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    rows = [helper.make_node("Add", ["i", "one"], ["i1"]), helper.make_node("Unsqueeze", ["i1", "axis0"], ["rows"])] \
        if piece_rows_grow else [helper.make_node("Identity", ["two"], ["rows"])]
    body = helper.make_graph(
        rows + [helper.make_node("Concat", ["rows", "width"], ["shape"], axis=0),
                helper.make_node("ConstantOfShape", ["shape"], ["ones"],
                                 value=numpy_helper.from_array(np.array([1], np.float32))),
                helper.make_node("Cast", ["i"], ["i_float"], to=TensorProto.FLOAT),
                helper.make_node("Mul", ["ones", "i_float"], ["piece"]),
                helper.make_node("Concat", ["hist_in", "piece"], ["hist_out"], axis=0),
                helper.make_node("Add", ["i", "one"], ["next"]),
                helper.make_node("Less", ["next", "stop"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("hist_in", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("hist_out", TensorProto.FLOAT, [None, 3])],
        [two, width, one, numpy_helper.from_array(np.array([0], np.int64), "axis0")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "go", "hist0"], ["hist"], body=body)], "grow",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []), helper.make_tensor_value_info("go", TensorProto.BOOL, []),
         helper.make_tensor_value_info("stop", TensorProto.INT64, []),
         helper.make_tensor_value_info("hist0", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("hist", TensorProto.FLOAT, [None, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)


@pytest.mark.parametrize("piece_rows_grow", [False, True], ids=["equal_pieces", "growing_pieces"])
def test_a_loop_extending_a_value_matches_onnxruntime_however_it_ends(run_kiln, tmp_path, piece_rows_grow):
    """The appended value's buffer is reserved for the trip count at the first piece's size: the
    loop that runs all its trips (the buffer becomes the value), the one its condition stops after
    a few of many trips (most of the room unused: copied out), pieces that grow each iteration
    (doubling past the reservation) and an initial value of rows or none all match ONNX Runtime."""
    path = tmp_path / "grow.onnx"
    _growing_loop(path, piece_rows_grow)
    for m, stop, initial_rows in ((40, 1000, 0), (40, 1000, 3), (100000, 5, 1), (1, 1000, 0), (0, 1000, 2)):
        feed = {"M": np.array(m, np.int64), "go": np.array(True), "stop": np.array(stop, np.int64),
                "hist0": np.arange(initial_rows * 3, dtype=np.float32).reshape(initial_rows, 3) - 7}
        got, want = run_both(run_kiln, tmp_path, path, feed)
        iterations = min(m, stop)
        pieces = sum(i + 1 for i in range(iterations)) if piece_rows_grow else 2 * iterations
        assert got["hist"].shape == (initial_rows + pieces, 3), (m, stop, initial_rows)
        np.testing.assert_array_equal(got["hist"], want["hist"])


def recurrence_model(trips: int, cond: str = "none", grow: bool = False) -> onnx.ModelProto:
    """h = tanh(h @ w + x * (i + 1)) for a constant trip count `trips` (an initializer), h [N, 4]
    with N the input's batch; the scan output stacks every iteration's h. `cond`: "none" (no
    cond input, the body passes its condition on), "true" (a constant true cond input) or
    "computed" (the body's condition is sum(h) < 100). `grow`: a carried history that gains a
    row block every iteration too (its type changes from one iteration to the next)."""
    i1 = [helper.make_node("Add", ["i", "one"], ["i1"]), helper.make_node("Cast", ["i1"], ["i1f"], to=TensorProto.FLOAT)]
    step = [helper.make_node("MatMul", ["h_in", "w"], ["hw"]), helper.make_node("Mul", ["x", "i1f"], ["xi"]),
            helper.make_node("Add", ["hw", "xi"], ["pre"]), helper.make_node("Tanh", ["pre"], ["h_out"]),
            helper.make_node("Identity", ["h_out"], ["scan"])]
    if cond == "computed":
        step += [helper.make_node("ReduceSum", ["h_out"], ["total"], keepdims=0),
                 helper.make_node("Less", ["total", "limit"], ["cond_out"])]
    else:
        step += [helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    body_inputs = [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                   helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                   helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["N", 4])]
    body_outputs = [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["N", 4])]
    loop_inputs, loop_outputs = ["trips", {"none": "", "true": "go", "computed": ""}[cond], "h0"], ["h"]
    graph_outputs = [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", 4])]
    if grow:
        step.append(helper.make_node("Concat", ["hist_in", "h_out"], ["hist_out"], axis=0))
        body_inputs.append(helper.make_tensor_value_info("hist_in", TensorProto.FLOAT, [None, 4]))
        body_outputs.append(helper.make_tensor_value_info("hist_out", TensorProto.FLOAT, [None, 4]))
        loop_inputs.append("hist0")
        loop_outputs.append("hist")
        graph_outputs.append(helper.make_tensor_value_info("hist", TensorProto.FLOAT, [None, 4]))
    body_outputs.append(helper.make_tensor_value_info("scan", TensorProto.FLOAT, ["N", 4]))
    loop_outputs.append("scans")
    graph_outputs.append(helper.make_tensor_value_info("scans", TensorProto.FLOAT, [None, "N", 4]))
    body = helper.make_graph(i1 + step, "body", body_inputs, body_outputs)
    nodes = [helper.make_node("Mul", ["x", "half"], ["h0"]),
             helper.make_node("Loop", loop_inputs, loop_outputs, body=body, name="the_loop")]
    if grow:
        nodes.insert(1, helper.make_node("Identity", ["h0"], ["hist0"]))
    w = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32) * 0.5
    initializers = [numpy_helper.from_array(np.array(trips, np.int64), "trips"), numpy_helper.from_array(w, "w"),
                    numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array(0.5, np.float32), "half"),
                    numpy_helper.from_array(np.array(True), "go"), numpy_helper.from_array(np.array(100, np.float32), "limit")]
    graph = helper.make_graph(nodes, "recurrence", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              graph_outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("cond", ["none", "true"])
def test_a_loop_with_a_constant_trip_count_is_unrolled(run_kiln, tmp_path, cond):
    """A Loop of 5 iterations whose condition stays true and whose carried value keeps its type
    becomes its body's nodes five times (each iteration's number a constant, the scan output an
    Unsqueeze and a Concat): no Loop is left, and the outputs match ONNX Runtime for batches the
    model was not specialized to."""
    path = tmp_path / "recurrence.onnx"
    onnx.save(recurrence_model(5, cond), path)
    layers = run_kiln("inspect", path, "--optimize")
    assert layers.returncode == 0, layers.describe()
    assert " Loop " not in layers.stdout and "the_loop/iteration4/" in layers.stdout, layers.stdout
    for rows in (1, 3):
        x = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)
        got, want = run_both(run_kiln, tmp_path, path, {"x": x})
        assert_same(got, want)
        assert got["scans"].shape == (5, rows, 4)


def nested_loop_model() -> onnx.ModelProto:
    """recurrence_model(2)'s Loop inside the body of a Loop of 3 trips: h goes through 6 steps."""
    inner = recurrence_model(2)
    inner_loop = next(n for n in inner.graph.node if n.op_type == "Loop")
    inner_loop.input[2] = "h_in"
    inner_loop.output[:] = ["h_out", "inner_scans"]
    body = helper.make_graph([inner_loop, helper.make_node("Identity", ["cond_in"], ["cond_out"])], "outer_body",
                             [helper.make_tensor_value_info("j", TensorProto.INT64, []),
                              helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["N", 4])],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["N", 4])])
    outer = helper.make_node("Loop", ["three", "", "h0"], ["h"], body=body, name="outer_loop")
    graph = helper.make_graph([inner.graph.node[0], outer], "nested", list(inner.graph.input),
                              [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", 4])],
                              list(inner.graph.initializer) + [numpy_helper.from_array(np.array(3, np.int64), "three")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("why", ["computed_condition", "type_changes", "too_many_trips", "nested_loop"])
def test_loops_that_cannot_be_unrolled_stay_loops(run_kiln, tmp_path, why):
    """A condition the body computes, a carried value that grows every iteration, more trips than
    kiln unrolls (128), or a body with a loop of its own (unrolled, nested loops would multiply):
    the Loop stays one node, and runs as ONNX Runtime runs it."""
    model = {"computed_condition": lambda: recurrence_model(12, "computed"),
             "type_changes": lambda: recurrence_model(4, grow=True),
             "too_many_trips": lambda: recurrence_model(129),
             "nested_loop": nested_loop_model}[why]()
    path = tmp_path / "loop.onnx"
    onnx.save(model, path)
    layers = run_kiln("inspect", path, "--optimize")
    assert layers.returncode == 0, layers.describe()
    assert " Loop " in layers.stdout and "iteration0" not in layers.stdout, layers.stdout
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    assert_same(*run_both(run_kiln, tmp_path, path, {"x": x}))


def chained_loops_model(loops: int, trips: int) -> onnx.ModelProto:
    """`loops` copies of recurrence_model(trips)'s Loop one after another, each carrying on the
    h the one before it made; the output is the last h."""
    single = recurrence_model(trips)
    loop = next(n for n in single.graph.node if n.op_type == "Loop")
    nodes, carried = [single.graph.node[0]], "h0"
    for k in range(loops):
        copy = onnx.NodeProto()
        copy.CopyFrom(loop)
        copy.name, copy.input[2] = f"loop{k}", carried
        copy.output[:] = [f"h{k + 1}", f"scans{k + 1}"]
        nodes.append(copy)
        carried = f"h{k + 1}"
    graph = helper.make_graph(nodes + [helper.make_node("Identity", [carried], ["h"])], "chained", list(single.graph.input),
                              [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", 4])], list(single.graph.initializer))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


@pytest.mark.parametrize("loops,trips", [(20, 2), (40, 128)], ids=["chain", "past_the_graph_bound"])
def test_chained_loops_unroll_until_the_graph_bound(run_kiln, tmp_path, loops, trips):
    """20 chained loops unroll together (each reads the one before it's unrolled output: more
    than the optimizer's 16 rounds would take one at a time); of 40 loops of 128 iterations (642
    nodes each unrolled, with the stacking of their scan outputs) the first unroll while the graph
    stays within 16,384 nodes and the rest stay loops, each reading the carried value of the one
    before it (of the rank its body declares). Both match ONNX Runtime."""
    path = tmp_path / "chained.onnx"
    onnx.save(chained_loops_model(loops, trips), path)
    layers = run_kiln("inspect", path, "--optimize")
    assert layers.returncode == 0, layers.describe()
    left = layers.stdout.count(" Loop ")
    if trips == 2:
        assert left == 0, layers.stdout
    else:
        assert 0 < left < loops and f"loop{loops - 1} " in layers.stdout and "loop0/iteration127/" in layers.stdout
        assert int(re.search(r"layers \((\d+)\)", layers.stdout).group(1)) <= 16384
    x = np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32)
    assert_same(*run_both(run_kiln, tmp_path, path, {"x": x}))


def test_a_carried_value_of_another_rank_than_declared_is_refused(run_kiln, tmp_path):
    """A body that declares its carried value [N, 4] going in and coming out but reshapes it to
    a shape the run gives (of three dims): the Loop's output was planned at rank 2, so the run is
    an error naming the loop and both ranks, not a wrong answer."""
    body = helper.make_graph(
        [helper.make_node("Reshape", ["h_in", "s"], ["h_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [None, 4])])
    graph = helper.make_graph([helper.make_node("Loop", ["M", "", "x"], ["h"], body=body, name="rank_changer")], "lying",
                              [helper.make_tensor_value_info("M", TensorProto.INT64, []),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                               helper.make_tensor_value_info("s", TensorProto.INT64, [None])],
                              [helper.make_tensor_value_info("h", TensorProto.FLOAT, None)])
    path = tmp_path / "lying.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)
    feed = {"M": np.array(1, np.int64), "x": np.ones((2, 4), np.float32), "s": np.array([1, 2, 4], np.int64)}
    args = ["run", path, "-o", tmp_path / "out"]
    for name, value in feed.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    r = run_kiln(*args)
    assert r.returncode != 0 and "rank_changer" in r.stderr and "rank 3, not the declared 2" in r.stderr, r.stderr


def scan_model(length: int | str) -> onnx.ModelProto:
    """Scan over x [2, L, 3] along axis 1, read in reverse: the state s [2, 3] becomes
    s * 0.5 + slice + b (b read from the enclosing graph); two scan outputs, s stacked along axis 1
    in reverse and s * s stacked along axis -1. `length`: L, a number or a named (unknown) dim."""
    nodes = [helper.make_node("Mul", ["s_in", "half"], ["decayed"]), helper.make_node("Add", ["decayed", "xs"], ["sum"]),
             helper.make_node("Add", ["sum", "b"], ["s_out"]), helper.make_node("Mul", ["s_out", "s_out"], ["sq"]),
             helper.make_node("Identity", ["s_out"], ["e0"])]
    body = helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [2, 3]), helper.make_tensor_value_info("xs", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3]) for name in ("s_out", "e0", "sq")],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    scan = helper.make_node("Scan", ["s0", "x"], ["s", "stacked", "squares"], body=body, name="the_scan",
                            num_scan_inputs=1, scan_input_axes=[1], scan_input_directions=[1],
                            scan_output_axes=[1, -1], scan_output_directions=[1, 0])
    graph = helper.make_graph([helper.make_node("Mul", ["x0", "half"], ["s0"]), scan], "scan",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, length, 3]),
                               helper.make_tensor_value_info("x0", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 3]),
                               helper.make_tensor_value_info("stacked", TensorProto.FLOAT, [2, length, 3]),
                               helper.make_tensor_value_info("squares", TensorProto.FLOAT, [2, 3, length])],
                              [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
                               numpy_helper.from_array(np.array([0.1, -0.2, 0.3], np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("length", [5, "L"], ids=["known_length", "unknown_length"])
def test_a_scan_of_a_known_length_is_unrolled(run_kiln, tmp_path, length):
    """A Scan over 5 slices (read in reverse; outputs stacked along axis 1 in reverse and along
    the last axis) becomes Gathers, its body five times and Unsqueeze/Concat stacks; with a length
    the model leaves open it stays a Scan. Both match ONNX Runtime."""
    path = tmp_path / "scan.onnx"
    onnx.save(scan_model(length), path)
    layers = run_kiln("inspect", path, "--optimize")
    assert layers.returncode == 0, layers.describe()
    unrolled = length == 5
    assert (" Scan " not in layers.stdout) == unrolled and ("the_scan/iteration4/" in layers.stdout) == unrolled, layers.stdout
    rng = np.random.default_rng(5)
    feed = {"x": rng.standard_normal((2, 5, 3)).astype(np.float32), "x0": rng.standard_normal((2, 3)).astype(np.float32)}
    got, want = run_both(run_kiln, tmp_path, path, feed)
    assert_same(got, want)
    assert got["stacked"].shape == (2, 5, 3) and got["squares"].shape == (2, 3, 5)


def opset8_scan_model(sequence_lens: bool = False) -> onnx.ModelProto:
    """Opset 8's Scan: x [B, L, 3] and y [B, L, 3] scanned along L for each batch entry on its
    own, y in reverse; the state s [B, 3] becomes s * 0.5 + x_t - y_t; the scan output stacks
    s * s. With `sequence_lens`, the node is given per-entry lengths (kiln refuses them)."""
    nodes = [helper.make_node("Mul", ["s_in", "half"], ["decayed"]), helper.make_node("Add", ["decayed", "xt"], ["plus"]),
             helper.make_node("Sub", ["plus", "yt"], ["s_out"]), helper.make_node("Mul", ["s_out", "s_out"], ["sq"])]
    body = helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in ("s_in", "xt", "yt")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in ("s_out", "sq")],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    scan = helper.make_node("Scan", ["lens" if sequence_lens else "", "s0", "x", "y"], ["s", "squares"], body=body,
                            name="the_scan", num_scan_inputs=2, directions=[0, 1])
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
              for n, shape in (("s0", ["B", 3]), ("x", ["B", "L", 3]), ("y", ["B", "L", 3]))]
    if sequence_lens:
        inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT64, ["B"]))
    graph = helper.make_graph([scan], "scan8", inputs,
                              [helper.make_tensor_value_info("s", TensorProto.FLOAT, ["B", 3]),
                               helper.make_tensor_value_info("squares", TensorProto.FLOAT, ["B", "L", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    model.ir_version = 4
    onnx.checker.check_model(model)
    return model


def test_opset_8_scans_each_batch_entry_on_its_own(run_kiln, tmp_path):
    """Opset 8's Scan (a batch axis before the scanned one, directions per scanned input) matches
    ONNX Runtime for batches of 1 and 3; a node given sequence_lens is refused, saying so."""
    path = tmp_path / "scan8.onnx"
    onnx.save(opset8_scan_model(), path)
    rng = np.random.default_rng(8)
    for batch, length in ((1, 4), (3, 5)):
        feed = {"s0": rng.standard_normal((batch, 3)).astype(np.float32),
                "x": rng.standard_normal((batch, length, 3)).astype(np.float32),
                "y": rng.standard_normal((batch, length, 3)).astype(np.float32)}
        got, want = run_both(run_kiln, tmp_path, path, feed)
        assert_same(got, want)
        assert got["squares"].shape == (batch, length, 3)
    path = tmp_path / "scan8_lens.onnx"
    onnx.save(opset8_scan_model(sequence_lens=True), path)
    r = run_kiln("inspect", path)
    assert r.returncode != 0 and "the_scan" in r.stderr and "sequence_lens is not supported" in r.stderr, r.describe()


# --- torchvision's detection models: their box selection (batched NMS) runs in an If --------------

THRESHOLDS = {"fasterrcnn_mobilenet_v3_large_320_fpn": {"box_score_thresh": 0.0}, "retinanet_resnet50_fpn": {"score_thresh": 0.0},
              "ssdlite320_mobilenet_v3_large": {"score_thresh": 0.0}, "maskrcnn_resnet50_fpn": {"box_score_thresh": 0.0},
              "fcos_resnet50_fpn": {"score_thresh": 0.0}}


def _export_detection(name: str, model_cache: str, thresholds: dict | None = None, full_size: bool = False) -> str:
    """torchvision's `name` with random weights, exported for a 128 x 128 image it keeps at that
    size, or (full_size) for a 480 x 640 image it resizes to its own size (800 on the short side,
    SSD 300 x 300). `thresholds`: its score threshold arguments (default THRESHOLDS[name])."""
    height, width = (480, 640) if full_size else (128, 128)
    path = os.path.join(model_cache, f"{name}_{height}x{width}_thresh0.onnx" if full_size else f"{name}_128_thresh0.onnx")
    if os.path.exists(path):
        return path
    import torch
    import torchvision

    torch.manual_seed(0)
    # Random weights score every box low: the score thresholds go to 0 so that boxes remain.
    kwargs = dict(weights=None, weights_backbone=None, **(thresholds if thresholds is not None else THRESHOLDS[name]))
    if not name.startswith("ssd") and not full_size:
        kwargs.update(min_size=128, max_size=128)
    model = getattr(torchvision.models.detection, name)(**kwargs).eval()
    torch.onnx.export(model, ([torch.rand(3, height, width)],), path + ".tmp", opset_version=OPSET, dynamo=False,
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
    path = _export_detection(name, model_cache)
    image = np.random.default_rng(0).random((3, 128, 128)).astype(np.float32)
    got, want = run_both(run_kiln, tmp_path, path, {"images": image})
    names = list(want)
    # The outputs by what they hold (the models list them in different orders): boxes [n, 4],
    # scores [n] float, labels [n] int64.
    masks = next((n for n in names if want[n].ndim == 4), None)  # Mask R-CNN's [n, 1, H, W], pasted in a Loop
    boxes = next(n for n in names if want[n].ndim == 2)
    scores = next(n for n in names if want[n].ndim == 1 and want[n].dtype == np.float32)
    labels = next(n for n in names if want[n].dtype == np.int64)
    assert want[boxes].shape[0] > 0
    assert all(got[n].shape == want[n].shape and got[n].dtype == want[n].dtype for n in names)
    assert _matched(want[boxes], want[scores], want[labels], got[boxes], got[scores], got[labels]) >= 0.95
    assert _matched(got[boxes], got[scores], got[labels], want[boxes], want[scores], want[labels]) >= 0.95
    if masks:
        # Where both list the same detection at the same place, its mask is the same.
        same = (np.abs(got[scores] - want[scores]) < 1e-4) & (np.abs(got[boxes] - want[boxes]).max(axis=1) < 0.05)
        assert same.mean() > 0.9
        # Each mask is resampled into its box: boxes that differ in float noise (hundredths of a
        # pixel) move a few border pixels by a little.
        diff = np.abs(got[masks][same] - want[masks][same])
        assert diff.max() < 0.02 and diff.mean() < 1e-4, (diff.max(), diff.mean())
