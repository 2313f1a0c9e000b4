"""Bad input through the command line: kiln exits with code 1 and a message naming what is wrong.

Exit code 1 is what main.cc returns for a kiln::Error. A crash (negative code: killed by a
signal; 134 abort; 139 segfault) or an internal error (2) fails these tests: bad input from a
user must always be a reported error.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def small_model(shape=(1, 3, 4, 4)) -> onnx.ModelProto:
    """y = relu(pixels + w): valid, with an initializer, so truncating it cuts through tensor
    data. The input has a long name so a test can look for it in an error message."""
    w = numpy_helper.from_array(np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape), "w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["pixels", "w"], ["s"], name="add0"),
         helper.make_node("Relu", ["s"], ["y"], name="relu0")],
        "small",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model


def unsupported_op_model() -> onnx.ModelProto:
    """Relu then a node of an op type that exists nowhere ("FooBar", in the default domain)."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu0"),
         helper.make_node("FooBar", ["r"], ["y"], name="the_foobar_node")],
        "foobar",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def scan_model() -> onnx.ModelProto:
    """A valid ONNX Scan: the running sum of x's rows."""
    body = helper.make_graph(
        [helper.make_node("Add", ["sum_in", "row"], ["sum_out"]),
         helper.make_node("Identity", ["sum_out"], ["row_out"])],
        "body",
        [helper.make_tensor_value_info("sum_in", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("row", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("sum_out", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("row_out", TensorProto.FLOAT, [4])])
    graph = helper.make_graph(
        [helper.make_node("Scan", ["zero", "x"], ["total", "running"], name="the_scan_node", body=body,
                          num_scan_inputs=1)],
        "scan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("running", TensorProto.FLOAT, [3, 4])],
        [numpy_helper.from_array(np.zeros(4, dtype=np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model


def assert_clean_error(result, *must_mention: str) -> None:
    """Exit code 1, a "kiln: error:" line, and each of must_mention somewhere in stderr."""
    assert result.returncode == 1, f"expected exit code 1 (a reported error)\n{result.describe()}"
    assert "kiln: error:" in result.stderr, f"no 'kiln: error:' message\n{result.describe()}"
    for word in must_mention:
        assert word in result.stderr, f"the error message does not mention {word!r}\n{result.describe()}"


# --- a model file kiln cannot read: both `inspect` and `run` must reject it -------------------

MODEL_COMMANDS = [["inspect"], ["run", "--random"]]


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=lambda c: c[0])
def test_missing_model_file(command, run_kiln, tmp_path):
    path = tmp_path / "does_not_exist.onnx"
    assert_clean_error(run_kiln(command[0], path, *command[1:]), "does_not_exist.onnx")


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("fraction", [0.5, 0.9])
def test_truncated_model(command, fraction, run_kiln, tmp_path):
    data = small_model().SerializeToString()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: int(len(data) * fraction)])
    assert_clean_error(run_kiln(command[0], path, *command[1:]), "truncated.onnx")


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_bytes(command, seed, run_kiln, tmp_path):
    path = tmp_path / "random.onnx"
    path.write_bytes(np.random.default_rng(seed).integers(0, 256, size=4096, dtype=np.uint8).tobytes())
    assert_clean_error(run_kiln(command[0], path, *command[1:]), "random.onnx")


def test_empty_file(run_kiln, tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    assert_clean_error(run_kiln("inspect", path), "empty.onnx")


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=lambda c: c[0])
def test_unsupported_op(command, run_kiln, tmp_path):
    path = save(unsupported_op_model(), tmp_path / "foobar.onnx")
    assert_clean_error(run_kiln(command[0], path, *command[1:]), "FooBar", "the_foobar_node")


def bernoulli_model() -> onnx.ModelProto:
    """A valid ONNX Bernoulli (random sampling, which kiln does not run)."""
    graph = helper.make_graph(
        [helper.make_node("Bernoulli", ["x"], ["y"], name="the_bernoulli_node")], "bernoulli",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=lambda c: c[0])
def test_a_valid_op_kiln_lacks_is_named_with_its_node(command, run_kiln, tmp_path):
    path = save(bernoulli_model(), tmp_path / "bernoulli.onnx")
    assert_clean_error(run_kiln(command[0], path, *command[1:]), "Bernoulli", "the_bernoulli_node")


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=lambda c: c[0])
def test_scan_runs_on_the_cpu_engine(command, run_kiln, tmp_path):
    path = save(scan_model(), tmp_path / "scan.onnx")
    r = run_kiln(command[0], path, *command[1:])
    assert r.returncode == 0, r.describe()
    if command[0] == "run":
        assert "output 'running': float32 [3x4]" in r.stdout, r.describe()


def opset_model(opset: int, op: str) -> onnx.ModelProto:
    """y = op(a, b) on booleans (Where: a ? b : b), at an old opset."""
    inputs = ["a", "b", "b"] if op == "Where" else ["a", "b"]
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], name="the_node")], "old",
        [helper.make_tensor_value_info("a", TensorProto.BOOL, [2, 3]), helper.make_tensor_value_info("b", TensorProto.BOOL, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.BOOL, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_old_opsets_import_op_by_op(run_kiln, tmp_path):
    """Opsets 7 to 10 import where each node's op means at that opset what kiln implements (And
    since opset 7); an op read only from a later opset is refused naming it, and opsets before 7
    (other broadcasting rules) are refused as a whole."""
    ok = run_kiln("run", save(opset_model(7, "And"), tmp_path / "and7.onnx"), "--random")
    assert ok.returncode == 0, ok.describe()
    assert_clean_error(run_kiln("run", save(opset_model(8, "Where"), tmp_path / "where8.onnx"), "--random"),
                       "Where", "supported from opset 9")
    assert_clean_error(run_kiln("run", save(opset_model(6, "And"), tmp_path / "and6.onnx"), "--random"),
                       "opset 6", "kiln reads opsets 7 to 28")


# --- a good model with bad inputs to `kiln run` --------------------------------------------

@pytest.fixture
def good_model(tmp_path) -> str:
    return save(small_model(), tmp_path / "small.onnx")


def test_good_model_runs(good_model, run_kiln, tmp_path):
    """The baseline of the tests below: with a right input the same command succeeds."""
    x = np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = run_kiln("run", good_model, "--input", f"pixels={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "out")
    assert result.returncode == 0, result.describe()
    w = np.linspace(-1, 1, x.size, dtype=np.float32).reshape(x.shape)
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), np.maximum(x + w, 0), rtol=1e-6)


def test_missing_input_file(good_model, run_kiln, tmp_path):
    result = run_kiln("run", good_model, "--input", f"pixels={tmp_path / 'no_such_input.npy'}")
    assert_clean_error(result, "no_such_input.npy")


def test_input_file_not_npy(good_model, run_kiln, tmp_path):
    path = tmp_path / "garbage.npy"
    path.write_bytes(b"this is not a numpy file")
    assert_clean_error(run_kiln("run", good_model, "--input", f"pixels={path}"), "garbage.npy")


def test_input_not_given(good_model, run_kiln):
    """No --input and no --random: kiln must say which input has no value."""
    assert_clean_error(run_kiln("run", good_model), "pixels")


@pytest.mark.parametrize("shape", [(1, 3, 5, 5), (1, 4, 4, 4), (3, 4, 4), (2, 3, 4, 4)], ids=str)
def test_wrong_input_shape(shape, good_model, run_kiln, tmp_path):
    np.save(tmp_path / "bad.npy", np.zeros(shape, dtype=np.float32))
    assert_clean_error(run_kiln("run", good_model, "--input", f"pixels={tmp_path / 'bad.npy'}"), "pixels")


def int_input_model() -> onnx.ModelProto:
    """y = token_ids + 1, with an int64 input, as a text model's token ids are."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["token_ids", "one"], ["y"], name="add0")],
        "ints",
        [helper.make_tensor_value_info("token_ids", TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2, 3])],
        [numpy_helper.from_array(np.array(1, dtype=np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("dtype", [np.int64, np.float64, np.int32, np.uint8], ids=lambda d: d.__name__)
def test_exactly_convertible_dtype_is_converted_with_a_note(dtype, good_model, run_kiln, tmp_path):
    """kiln run converts an input whose values the model's dtype holds exactly (numpy writes
    float64 by default), and says so, naming the input and the dtype it was given."""
    x = np.arange(48).reshape(1, 3, 4, 4).astype(dtype)
    np.save(tmp_path / "x.npy", x)
    result = run_kiln("run", good_model, "--input", f"pixels={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "out")
    assert result.returncode == 0, result.describe()
    assert "pixels" in result.stdout and np.dtype(dtype).name in result.stdout, result.describe()
    w = np.linspace(-1, 1, x.size, dtype=np.float32).reshape(x.shape)
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), np.maximum(x.astype(np.float32) + w, 0), rtol=1e-6)


def test_fractional_floats_for_an_integer_input_are_rejected(run_kiln, tmp_path):
    """Token ids given as 0.5, 1.5, ...: truncating them silently would run the model on other
    data than the user's, so this must be an error naming the input."""
    path = save(int_input_model(), tmp_path / "ints.onnx")
    np.save(tmp_path / "ids.npy", np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5)
    assert_clean_error(run_kiln("run", path, "--input", f"token_ids={tmp_path / 'ids.npy'}"), "token_ids")


def test_unreadable_dtype_is_rejected(good_model, run_kiln, tmp_path):
    """complex64 .npy: no ONNX model input here takes it and kiln cannot convert it."""
    np.save(tmp_path / "complex.npy", np.zeros((1, 3, 4, 4), dtype=np.complex64))
    assert_clean_error(run_kiln("run", good_model, "--input", f"pixels={tmp_path / 'complex.npy'}"), "complex.npy")


def test_integer_input_runs(run_kiln, tmp_path):
    """The baseline of the rejection test above: the right dtype works."""
    path = save(int_input_model(), tmp_path / "ints.onnx")
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    np.save(tmp_path / "ids.npy", ids)
    result = run_kiln("run", path, "--input", f"token_ids={tmp_path / 'ids.npy'}", "--output-dir", tmp_path / "out")
    assert result.returncode == 0, result.describe()
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), ids + 1)


def test_unknown_input_name(good_model, run_kiln, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 4, 4), dtype=np.float32))
    assert_clean_error(run_kiln("run", good_model, "--input", f"not_an_input={tmp_path / 'x.npy'}"), "not_an_input")
