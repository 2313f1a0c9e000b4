"""Hostile and malformed model files: sizes that overflow, data reached through links, files that
are not files, runs larger than the memory limit. Each must end as a reported error (exit code 1,
"kiln: error:" naming the node, tensor or file and the reason), never a crash, a hang, a
terabyte allocation or a wrong answer.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from test_errors import assert_clean_error

OPSET = 17
BIG = 2**32


def save(nodes, inputs, outputs, initializers, path) -> str:
    graph = helper.make_graph(nodes, "hostile", inputs, outputs, initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), str(path))
    return str(path)


def x_in(shape=(1, 4)):
    return helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))


def y_out(elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info("y", elem, None)


def int64s(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


# (id, builder, words the error must name). Each builds a small file whose shapes, read from
# its constants, ask for more than 64-bit arithmetic or memory can hold.
def constant_of_shape(shape):
    return lambda p: save([helper.make_node("ConstantOfShape", ["s"], ["y"], name="the_cos")], [x_in()], [y_out()],
                          [int64s("s", shape)], p)


HOSTILE = [
    # 2^31 * 2^31 float32 elements: 2^64 bytes, which wrapped to 0 and was then written to.
    ("cos_bytes_wrap", constant_of_shape([2**31, 2**31]), ["the_cos", "ConstantOfShape", "larger than kiln allows"]),
    ("cos_2_62", constant_of_shape([2**62]), ["the_cos", "larger than kiln allows"]),
    ("cos_elements_wrap", constant_of_shape([BIG, BIG]), ["the_cos", "larger than kiln allows"]),
    # A zero dimension makes no elements, but the others still multiply in strides and loops.
    ("cos_zero_and_huge", constant_of_shape([0, 2**62, 2**62]), ["the_cos", "larger than kiln allows"]),
    ("expand", lambda p: save([helper.make_node("Expand", ["x", "s"], ["y"], name="the_expand")], [x_in()], [y_out()],
                              [int64s("s", [2**62, 4, 1, 4])], p), ["the_expand", "larger than kiln allows"]),
    ("tile", lambda p: save([helper.make_node("Tile", ["x", "r"], ["y"], name="the_tile")], [x_in()], [y_out()],
                            [int64s("r", [BIG, BIG])], p), ["the_tile", "larger than kiln allows"]),
    # limit - start of two int64 values needs 65 bits: the length came out 0 (a wrong answer).
    ("range", lambda p: save([helper.make_node("Range", ["a", "b", "d"], ["y"], name="the_range")],
                             [helper.make_tensor_value_info("x", TensorProto.INT64, [])], [y_out(TensorProto.INT64)],
                             [int64s("a", -2**63), int64s("b", 2**63 - 1), int64s("d", 1)], p),
     ["the_range", "elements"]),
    ("declared_input", lambda p: save([helper.make_node("Relu", ["x"], ["y"])], [x_in([0, BIG, BIG, 4])], [y_out()], [], p),
     ["'x'", "larger than kiln allows"]),
    ("initializer", lambda p: save([helper.make_node("Add", ["x", "w"], ["y"])], [x_in()], [y_out()],
                                   [helper.make_tensor("w", TensorProto.FLOAT, [0, BIG, BIG], [])], p),
     ["'w'", "larger than kiln allows"]),
]


@pytest.mark.parametrize("command", ["run", "inspect"])
@pytest.mark.parametrize("case", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_size_overflow_is_a_clean_error(case, command, run_kiln, tmp_path):
    _, build, words = case
    model = build(tmp_path / "m.onnx")
    result = run_kiln(command, model, *(["--random"] if command == "run" else []), timeout=60)
    assert_clean_error(result, *words)


def external_model(tmp_path, location) -> str:
    """y = x + w, with w's 16 bytes in an external file at `location` (relative to the model)."""
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1, 4])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    return save([helper.make_node("Add", ["x", "w"], ["y"])], [x_in()], [y_out()], [w], tmp_path / "model.onnx")


def test_external_data_inside_the_folder_is_read(run_kiln, tmp_path):
    (tmp_path / "sub").mkdir()
    np.arange(4, dtype=np.float32).tofile(tmp_path / "sub" / "w.bin")
    np.save(tmp_path / "x.npy", np.zeros((1, 4), dtype=np.float32))
    model = external_model(tmp_path, "sub/w.bin")
    result = run_kiln("run", model, "--input", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "out"))
    assert result.returncode == 0, result.describe()
    assert np.array_equal(np.load(tmp_path / "out" / "y.npy"), np.arange(4, dtype=np.float32).reshape(1, 4))


def test_external_data_link_leading_out_of_the_folder_is_refused(run_kiln, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    np.arange(4, dtype=np.float32).tofile(outside / "secret.bin")
    folder = tmp_path / "model"
    folder.mkdir()
    os.symlink(outside / "secret.bin", folder / "w.bin")
    model = external_model(folder, "w.bin")
    assert_clean_error(run_kiln("run", model, "--random"), "'w'", "outside the model's folder")


def test_external_data_folder_link_leading_out_is_refused(run_kiln, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    np.arange(4, dtype=np.float32).tofile(outside / "w.bin")
    folder = tmp_path / "model"
    folder.mkdir()
    os.symlink(outside, folder / "data")
    model = external_model(folder, "data/w.bin")
    assert_clean_error(run_kiln("run", model, "--random"), "'w'", "outside the model's folder")


def test_external_data_link_inside_the_folder_is_read(run_kiln, tmp_path):
    np.arange(4, dtype=np.float32).tofile(tmp_path / "real.bin")
    os.symlink("real.bin", tmp_path / "w.bin")
    model = external_model(tmp_path, "w.bin")
    result = run_kiln("run", model, "--random")
    assert result.returncode == 0, result.describe()


@pytest.mark.parametrize("location", ["../w.bin", "sub/../../w.bin", "/etc/passwd"])
def test_external_data_path_leaving_the_folder_is_refused(location, run_kiln, tmp_path):
    model = external_model(tmp_path, location)
    assert_clean_error(run_kiln("run", model, "--random"), "'w'", "relative path inside the model's folder")


def test_external_data_fifo_is_refused_without_waiting(run_kiln, tmp_path):
    os.mkfifo(tmp_path / "w.bin")
    model = external_model(tmp_path, "w.bin")
    assert_clean_error(run_kiln("run", model, "--random", timeout=30), "'w'", "not a regular file")


def test_external_data_directory_is_refused(run_kiln, tmp_path):
    (tmp_path / "w.bin").mkdir()
    model = external_model(tmp_path, "w.bin")
    assert_clean_error(run_kiln("run", model, "--random"), "'w'", "not a regular file")


def big_output_model(path) -> str:
    """y = Expand(x, [N, 1024]): a 4 KiB input and a 4 MiB output for N = 1024."""
    return save([helper.make_node("Expand", ["x", "s"], ["y"], name="the_expand")], [x_in([1, 1024])], [y_out()],
                [int64s("s", [1024, 1024])], path)


def test_run_past_the_memory_limit_is_refused(run_kiln, tmp_path):
    model = big_output_model(tmp_path / "m.onnx")
    assert_clean_error(run_kiln("run", model, "--random", "--max-memory", "1M"),
                       "the_expand", "'y'", "memory limit of 1.0 MiB", "--max-memory")
    result = run_kiln("run", model, "--random", "--max-memory", "64M")
    assert result.returncode == 0, result.describe()


@pytest.mark.parametrize("size", ["lots", "-1G", "12X", "1e30G"])
def test_unreadable_memory_limit_is_refused(size, run_kiln, tmp_path):
    model = big_output_model(tmp_path / "m.onnx")
    assert_clean_error(run_kiln("run", model, "--random", "--max-memory", size), "--max-memory", size)
