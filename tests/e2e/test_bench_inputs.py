"""`kiln bench --input NAME=FILE` (trtexec's --loadInputs): the engine is timed on the file's data
instead of random data, at the file's shape, converted to the input's dtype; a file that does not
fit the input is a clear error (exit 1, naming the input), never a run on other data."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


@pytest.fixture(scope="module")
def gather_model(tmp_path_factory):
    """y = table[indices]: indices int64 [N] (dynamic), a constant table of 10 floats. An index
    past the table makes the run fail, so a run that passes or fails tells which data it ran."""
    folder = tmp_path_factory.mktemp("bench_inputs")
    table = numpy_helper.from_array(np.arange(10, dtype=np.float32), "table")
    graph = helper.make_graph([helper.make_node("Gather", ["table", "indices"], ["y"])], "gather",
                              [helper.make_tensor_value_info("indices", TensorProto.INT64, ["N"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])], [table])
    path = folder / "gather.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return folder, path


def bench(run_kiln, model, *args):
    return run_kiln("bench", model, "--device", "cpu", "--iterations", "3", "--warmup", "1", *args)


def test_the_files_data_and_shape_are_timed(run_kiln, gather_model):
    folder, model = gather_model
    np.save(folder / "ok.npy", np.array([0, 3, 9, 2, 2, 7, 1], dtype=np.int64))
    r = bench(run_kiln, model, "--input", f"indices={folder / 'ok.npy'}", "--json", folder / "ok.json")
    assert r.returncode == 0, r.describe()
    result = json.loads((folder / "ok.json").read_text())["results"]
    assert [x["batch"] for x in result] == [7]
    # int32 data converted to the input's int64, with a note; trtexec's spelling, NAME:FILE
    np.save(folder / "ok32.npy", np.array([1, 2, 3], dtype=np.int32))
    r = bench(run_kiln, model, f"--loadInputs=indices:{folder / 'ok32.npy'}")
    assert r.returncode == 0, r.describe()
    assert "converted from int32 to int64" in r.stdout


def test_data_the_model_refuses_fails_the_run(run_kiln, gather_model):
    # Random indices are small (0..9) and would pass: the failure shows the file's data ran.
    folder, model = gather_model
    np.save(folder / "bad.npy", np.array([1, 50], dtype=np.int64))
    r = bench(run_kiln, model, "--input", f"indices={folder / 'bad.npy'}")
    assert r.returncode != 0, r.describe()
    assert "50" in r.stderr, r.describe()


@pytest.mark.parametrize("case, spec_args, message", [
    ("unknown_name", ["--input", "{folder}/ok.npy=x"], "expected NAME=FILE|does not exist|no input named"),
    ("no_name", ["--input", "{folder}/ok.npy"], "expected NAME=FILE"),
    ("other_input", ["--input", "ids={folder}/ok.npy"], "no input named 'ids'.*indices"),
    ("twice", ["--input", "indices={folder}/ok.npy", "--input", "indices={folder}/ok.npy"], "given twice"),
    ("not_integers", ["--input", "indices={folder}/halves.npy"], "indices.*0.5.*int64"),
    ("other_batch", ["--input", "indices={folder}/ok.npy", "--batches", "3"], "--batches 3.*batch 7"),
    ("missing_file", ["--input", "indices={folder}/nothing.npy"], "nothing.npy.*does not exist"),
    ("not_a_tensor_file", ["--input", "indices={folder}/gather.onnx"], "neither .npy nor .pb"),
])
def test_files_that_do_not_fit_are_clear_errors(run_kiln, gather_model, case, spec_args, message):
    import re
    folder, model = gather_model
    np.save(folder / "ok.npy", np.arange(7, dtype=np.int64))
    np.save(folder / "halves.npy", np.array([0.5, 1.0], dtype=np.float32))
    r = bench(run_kiln, model, *[a.format(folder=folder) for a in spec_args])
    assert r.returncode == 1, r.describe()
    assert re.search(message, r.stderr), r.describe()
