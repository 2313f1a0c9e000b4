"""`kiln debug reduce`: a failing model shrinks to a small subgraph that still fails, written as
ONNX with its inputs' values, reproducible with the kiln check command it prints."""
from __future__ import annotations

import os
import shlex
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from test_errors import assert_clean_error

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FASHION = os.path.join(REPO, "models", "fashion_mnist_resnet.onnx")


def chain_with_a_refused_node(tmp_path) -> str:
    """A float chain with a branch, and in its middle a Dropout in training mode (which kiln, an
    inference engine, refuses; ONNX Runtime runs it, as the identity at ratio 0) of a computed
    value and two constants, feeding nodes after it: 9 nodes."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4), "w")
    ratio = numpy_helper.from_array(np.array(0.0, dtype=np.float32), "ratio")
    training = numpy_helper.from_array(np.array(True), "training_mode")
    nodes = [
        helper.make_node("Add", ["input", "w"], ["a"], name="add_w"),
        helper.make_node("Relu", ["a"], ["x"], name="relu"),
        helper.make_node("Sigmoid", ["input"], ["side"], name="side_branch"),
        helper.make_node("Mul", ["x", "x"], ["squared"], name="square"),
        helper.make_node("Dropout", ["squared", "ratio", "training_mode"], ["acc"], name="the_dropout_node"),
        helper.make_node("Tanh", ["acc"], ["t"], name="tanh"),
        helper.make_node("Add", ["t", "side"], ["u"], name="join"),
        helper.make_node("Neg", ["u"], ["v"], name="neg"),
        helper.make_node("Abs", ["v"], ["output"], name="abs"),
    ]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4])], [w, ratio, training])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    path = str(tmp_path / "chain.onnx")
    onnx.save(model, path)
    return path


def test_a_refused_node_is_reduced_to_itself(run_kiln, tmp_path):
    path = chain_with_a_refused_node(tmp_path)
    reduced = tmp_path / "reduced.onnx"
    r = run_kiln("debug", "reduce", path, "-o", reduced)
    assert r.returncode == 0, r.describe()
    assert "reduced 9 nodes to 1" in r.stdout and "'the_dropout_node' (Dropout)" in r.stdout, r.stdout
    model = onnx.load(str(reduced))
    assert [n.op_type for n in model.graph.node] == ["Dropout"]
    # The computed input is the reduced model's input, fed the value it has in the model; the
    # constants stay constants.
    assert [i.name for i in model.graph.input] == ["squared"]
    assert sorted(t.name for t in model.graph.initializer) == ["ratio", "training_mode"]
    # The printed command reproduces the failure: kiln refuses the training-mode Dropout.
    reproduce = shlex.split(r.stdout.split("reproduce: ", 1)[1].splitlines()[0])
    again = run_kiln(*reproduce[1:])
    assert again.returncode == 1 and "training_mode" in again.stdout + again.stderr, again.describe()


def test_a_command_decides_and_the_regex_narrows(run_kiln, tmp_path):
    """--check: a command that fails on any model holding a Sigmoid; the reduced model is that node."""
    path = chain_with_a_refused_node(tmp_path)
    reduced = tmp_path / "sigmoid.onnx"
    script = "import onnx, sys; m = onnx.load(sys.argv[1]); sys.exit(any(n.op_type == 'Sigmoid' for n in m.graph.node))"
    r = run_kiln("debug", "reduce", path, "-o", reduced, "--check", sys.executable, "-c", script, "{model}")
    assert r.returncode == 0, r.describe()
    assert [n.name for n in onnx.load(str(reduced)).graph.node] == ["side_branch"]
    # A regex no failure message matches: the model does not fail.
    r = run_kiln("debug", "reduce", path, "-o", tmp_path / "none.onnx", "--fail-regex", "no such message")
    assert r.returncode == 1 and "does not fail" in r.stdout, r.describe()
    assert not (tmp_path / "none.onnx").exists()


def test_a_model_that_passes_and_usage_errors(run_kiln, tmp_path):
    r = run_kiln("debug", "reduce", FASHION, "-o", tmp_path / "r.onnx", "--batch", "2")
    assert r.returncode == 1 and "does not fail: nothing to reduce" in r.stdout, r.describe()
    assert_clean_error(run_kiln("debug", "reduce", FASHION, "-o", tmp_path / "r.txt"), "name it .onnx")
    assert_clean_error(run_kiln("debug", "reduce", FASHION, "-o", tmp_path / "r.onnx", "--no-such-flag"), "--no-such-flag")
    assert_clean_error(run_kiln("debug", "frobnicate"), "no subcommand 'frobnicate'")
    assert_clean_error(run_kiln("debug", "reduce", tmp_path / "missing.onnx", "-o", tmp_path / "r.onnx"), "missing.onnx")
