"""Automatic GPU/CPU partitioning: a GPU build never fails for want of a GPU layer. Nodes without
one run on the CPU engine inside the GPU engine, the build names them (the command line's log, a
Python warning, `kiln build`'s summary) with what they cost, `kiln inspect` shows the partition,
and --strict (allow_cpu_fallback=False) refuses such a build, naming each node. The partitioned
engine matches the CPU engine, also with several contexts running it at once on threads (each
context has its own staging memory and CPU kernel for those nodes). And Swin-T (torchvision,
exported by `kiln export`: shifted windows, relative position bias) builds on GPU layers alone
and matches the CPU engine. torchvision's detection models run their backbones on the GPU and box
selection on the CPU engine, at 128 x 128 and at their own image sizes, where they match ONNX
Runtime. A Loop with a constant trip count and a Scan of a known length are unrolled and need no
CPU engine."""
from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from test_gpu_contexts import mismatch, on_threads


def partitioned_model(path: str) -> str:
    """y = Conv(LRN(Conv(x))) + MeanVarianceNormalization(x): LRN and MeanVarianceNormalization
    have no GPU layer (the LRN reads a GPU layer's output, the MVN the engine's input), the convs
    and the Add have. Float32, x 4x8x24x24. (Should either op gain a GPU layer, pick another from
    docs/operators.md's ops without one.)"""
    rng = np.random.default_rng(7)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 16, 3, 3)).astype(np.float32) * 0.2, "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("LRN", ["c1"], ["s"], name="lrn", size=3),
        helper.make_node("Conv", ["s", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("MeanVarianceNormalization", ["x"], ["h"], name="mvn"),
        helper.make_node("Add", ["h", "c2"], ["y"], name="add"),
    ]
    graph = helper.make_graph(nodes, "partitioned", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8, 24, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8, 24, 24])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return partitioned_model(str(tmp_path_factory.mktemp("partition") / "partitioned.onnx"))


def inputs(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((4, 8, 24, 24)).astype(np.float32)


def test_default_build_runs_nodes_without_gpu_layer_on_the_cpu_and_says_so(model):
    with pytest.warns(UserWarning, match=r"2 node\(s\) have no GPU layer and run on the CPU engine") as warned:
        engine = kiln.Builder(device="cuda").build(model)
    said = " ".join(str(w.message) for w in warned)
    assert "lrn (LRN)" in said and "mvn (MeanVarianceNormalization)" in said, said
    on_cpu = {l["name"]: l["tactic"] for l in engine.info()["layers"] if l["cpu_fallback"]}
    assert on_cpu == {"lrn": "cpu-fallback", "mvn": "cpu-fallback"}
    assert any(l["op"] == "Conv" and not l["cpu_fallback"] for l in engine.info()["layers"])
    reference = kiln.Engine.from_onnx(model, kiln.Builder(device="cpu").options)
    for seed in (1, 2):
        x = inputs(seed)
        got, want = engine.run({"x": x})["y"], reference.run({"x": x})["y"]
        assert np.allclose(got, want, rtol=1e-3, atol=1e-3), np.abs(got - want).max()


def test_strict_build_refuses_and_names_each_node(model):
    with pytest.raises(kiln.Error, match=r"2 node\(s\) cannot run on the GPU") as refused:
        kiln.Builder(device="cuda", allow_cpu_fallback=False).build(model)
    assert "lrn (LRN): kiln has no CUDA layer for LRN" in str(refused.value)
    assert "mvn (MeanVarianceNormalization): kiln has no CUDA layer for MeanVarianceNormalization" in str(refused.value)


def test_contexts_on_threads_each_have_their_own_cpu_staging(model):
    """Four contexts of one partitioned engine on four threads, different inputs at the same
    moment: every result equals what one context computes alone (shared staging would mix them)."""
    with pytest.warns(UserWarning):
        engine = kiln.Builder(device="cuda").build(model)
    xs = [inputs(10 + i) for i in range(6)]
    alone = engine.create_context()
    want = [alone.run({"x": x})["y"].copy() for x in xs]
    assert not np.array_equal(want[0], want[1])
    contexts = [engine.create_context() for _ in range(4)]

    def job(context, t, r):
        i = (t + r) % len(xs)  # threads run different inputs at the same moment
        return mismatch(context.run({"x": xs[i]})["y"], want[i])

    errors = on_threads(contexts, 20, job)
    assert not errors, errors[:5]


def test_command_line_names_the_partition_and_strict_refuses(kiln_bin, model, tmp_path):
    engine = str(tmp_path / "partitioned.engine")
    built = subprocess.run([kiln_bin, "build", model, "-o", engine], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    line = next((l for l in built.stderr.splitlines() if "have no GPU layer" in l), "")
    assert "2 node(s) have no GPU layer and run on the CPU engine: " in line, built.stderr
    assert "lrn (LRN)" in line and "mvn (MeanVarianceNormalization)" in line, line
    assert "between the GPU and the host" in built.stderr and "--strict" in built.stderr
    # Per run: the LRN's input and output (4x16x24x24 float32 each) and the MVN's (4x8x24x24).
    assert "copies 432.0 KiB between the GPU and the host" in built.stderr, built.stderr
    assert "2 layer(s) run on the CPU engine" in built.stdout

    shown = subprocess.run([kiln_bin, "inspect", engine], capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    shown_line = next((l for l in shown.stdout.splitlines() if l.startswith("partition: ")), "")
    assert "layer(s) on the GPU, 2 on the CPU engine: " in shown_line, shown.stdout
    assert "lrn (LRN)" in shown_line and "mvn (MeanVarianceNormalization)" in shown_line, shown_line
    as_json = subprocess.run([kiln_bin, "inspect", engine, "--json", "-"], capture_output=True, text=True, timeout=300)
    assert as_json.returncode == 0, as_json.stderr
    partition = json.loads(as_json.stdout)["partition"]
    assert sorted(partition["cpu_layers"]) == ["lrn (LRN)", "mvn (MeanVarianceNormalization)"] and partition["gpu_layers"] >= 2

    ran = subprocess.run([kiln_bin, "run", engine, "--random"], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr

    strict = subprocess.run([kiln_bin, "build", model, "--strict", "-o", str(tmp_path / "strict.engine")], capture_output=True,
                            text=True, timeout=600)
    assert strict.returncode == 1
    assert "lrn (LRN): kiln has no CUDA layer for LRN" in strict.stderr
    assert "mvn (MeanVarianceNormalization): kiln has no CUDA layer for MeanVarianceNormalization" in strict.stderr
    assert not (tmp_path / "strict.engine").exists()


def test_a_cpu_node_that_fails_at_run_time_raises_and_the_next_run_is_clean(tmp_path):
    """MaxUnpool has no GPU layer; its CPU kernel refuses an index outside the unpooled tensor
    when it runs. The partitioned engine raises that error from run() (eager and CUDA graph
    replays alike) instead of returning the poisoned outputs, and a valid run after it answers
    right."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("MaxUnpool", ["r", "at"], ["y"], name="unpool", kernel_shape=[2, 2], strides=[2, 2])]
    graph = helper.make_graph(nodes, "unpool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2, 2]),
                                                helper.make_tensor_value_info("at", TensorProto.INT64, [1, 2, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])])
    path = str(tmp_path / "unpool.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.warns(UserWarning, match=r"unpool \(MaxUnpool\)"):
        engine = kiln.Builder(device="cuda").build(path)
    x = np.random.default_rng(5).standard_normal((1, 2, 2, 2)).astype(np.float32)
    good = np.array([0, 3, 9, 14, 17, 20, 26, 31], dtype=np.int64).reshape(1, 2, 2, 2)
    want = np.zeros(32, dtype=np.float32)
    want[good.ravel()] = np.maximum(x, 0).ravel()
    want = want.reshape(1, 2, 4, 4)
    bad = good.copy()
    bad[0, 1, 1, 1] = 32
    for _ in range(3):
        assert np.array_equal(engine.run({"x": x, "at": good})["y"], want)
        with pytest.raises(kiln.Error, match=r"index 32 is outside the unpooled tensor of 32 elements"):
            engine.run({"x": x, "at": bad})


def test_swin_transformer_runs_on_gpu_layers_alone_and_matches_the_cpu_engine(kiln_bin, model_cache):
    path = os.path.join(model_cache, "swin_t_224.onnx")
    if not os.path.exists(path):
        made = subprocess.run([kiln_bin, "export", "swin_t", "--size", "224", "-o", path], capture_output=True, text=True,
                              timeout=600)
        assert made.returncode == 0, made.stderr
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)  # --strict: every node on a GPU layer
    assert not any(l["cpu_fallback"] for l in gpu.info()["layers"])
    cpu = kiln.Builder(device="cpu").build(path)
    name = gpu.inputs[0].name
    for seed in (0, 1):
        x = np.random.default_rng(seed).standard_normal((1, 3, 224, 224)).astype(np.float32)
        got, want = gpu.run({name: x}), cpu.run({name: x})
        for out, w in want.items():
            err = np.linalg.norm(got[out] - w) / max(np.linalg.norm(w), 1e-30)
            assert err < 1e-4, f"{out}: relative L2 error {err}"


def test_a_loop_with_a_constant_trip_count_runs_on_gpu_layers_alone(tmp_path):
    """A Loop of 6 iterations whose condition stays true and whose carried value keeps its type
    (a recurrence, tests/e2e/test_control_flow.py) is unrolled: a strict GPU build (no CPU engine
    for any node) of a batch profile 1..8 matches the CPU engine at batches 1, 3 and 8."""
    from test_control_flow import recurrence_model

    path = str(tmp_path / "recurrence.onnx")
    onnx.save(recurrence_model(6), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False, profiles=[{"x": ([1, 4], [3, 4], [8, 4])}]).build(path)
    info = gpu.info()
    assert not info["data_dependent_nodes"] and not any(l["cpu_fallback"] for l in info["layers"])
    cpu = kiln.Builder(device="cpu").build(path)
    for rows in (1, 3, 8):
        x = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)
        got, want = gpu.run({"x": x}), cpu.run({"x": x})
        assert got["scans"].shape == (6, rows, 4)
        for out, w in want.items():
            np.testing.assert_allclose(got[out], w, rtol=1e-4, atol=1e-5, err_msg=out)


def test_a_scan_of_a_known_length_runs_on_gpu_layers_alone(tmp_path):
    """A Scan over 5 slices read in reverse, its outputs stacked along other axes
    (tests/e2e/test_control_flow.py) is unrolled: a strict GPU build matches the CPU engine."""
    from test_control_flow import scan_model

    path = str(tmp_path / "scan.onnx")
    onnx.save(scan_model(5), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    assert not any(l["cpu_fallback"] for l in gpu.info()["layers"])
    cpu = kiln.Builder(device="cpu").build(path)
    rng = np.random.default_rng(3)
    feed = {"x": rng.standard_normal((2, 5, 3)).astype(np.float32), "x0": rng.standard_normal((2, 3)).astype(np.float32)}
    got, want = gpu.run(feed), cpu.run(feed)
    for out, w in want.items():
        np.testing.assert_allclose(got[out], w, rtol=1e-4, atol=1e-5, err_msg=out)
