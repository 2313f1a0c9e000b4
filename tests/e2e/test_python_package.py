"""The Python package `kiln` (python/kiln, extension kiln._kiln) used as a user would: engines
from ONNX run on numpy arrays and torch tensors against ONNX Runtime, errors as kiln.Error, INT8
calibration from a torch DataLoader on real Fashion-MNIST images, kiln.simplify and
`kiln export --simplify`, `kiln compare` on the CPU writing a results file of the documented
schema, and the type stubs (_kiln.pyi) against the extension module. CTest runs this with
PYTHONPATH=<build>/python, where the build lays the package out.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import kiln

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FASHION = os.path.join(REPO, "models", "fashion_mnist_resnet.onnx")
sys.path.insert(0, os.path.join(REPO, "scripts"))
import export_model  # noqa: E402
import train_fashion_mnist  # noqa: E402


def ort_run(path: str, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_engine_matches_onnxruntime_on_numpy_and_torch_inputs():
    import torch

    engine = kiln.Engine.from_onnx(FASHION)
    assert engine.backend == "cpu"
    assert engine.gpu == -1 and engine.info()["gpu"] == -1  # a GPU engine names its GPU (tests/gpu)
    assert [d.name for d in engine.inputs] == ["input"] and engine.inputs[0].shape == [-1, 1, 28, 28]
    assert engine.inputs[0].dtype == "float32"
    rng = np.random.default_rng(7)
    for batch in (1, 5):
        x = rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)
        want = ort_run(FASHION, {"input": x})[0]
        got = engine.run({"input": x})["logits"]
        assert got.shape == (batch, 10) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        from_torch = engine.run({"input": torch.from_numpy(x)})["logits"]
        np.testing.assert_array_equal(from_torch, got)
    info = engine.info()
    assert info["backend"] == "cpu" and len(info["layers"]) == engine.layer_count > 0
    with pytest.raises(kiln.Error, match="GPU|CUDA|cuda"):
        engine.create_context()  # contexts belong to GPU engines
    with pytest.raises(kiln.Error, match="GPU|CUDA|cuda"):
        engine.create_context(share_activation_memory=True)


def test_cpu_engine_profile_times_every_layer():
    """Engine.profile runs a CPU engine once and times each of its layers, in its order, with the
    layer's FLOPs and the bytes of its activations at the run's shapes; bad inputs are the same
    errors as run()'s."""
    engine = kiln.Engine.from_onnx(FASHION)
    x = np.random.default_rng(3).standard_normal((4, 1, 28, 28)).astype(np.float32)
    rows = engine.profile({"input": x})
    layers = engine.info()["layers"]
    assert [(r["name"], r["op"]) for r in rows] == [(layer["name"], layer["op"]) for layer in layers]
    assert all(r["ms"] > 0 and r["tactic"] == "cpu" for r in rows)
    # Convolutions channels-first, or channels-last where the CPU has AVX-512 (the layout pass).
    convs = [r for r in rows if r["op"] in ("FusedConv", "ChannelsLastConv")]
    assert convs and all(r["flops"] > 0 for r in convs)
    # Bytes: the stem reads the input and writes its feature map; the first block's first
    # convolution reads that map and writes one of the same size (weights are not counted).
    stem, block = convs[0], convs[1]
    assert rows.index(block) == rows.index(stem) + 1
    assert stem["bytes"] > x.nbytes
    assert block["bytes"] == 2 * (stem["bytes"] - x.nbytes)
    with pytest.raises(kiln.Error, match="input"):
        engine.profile({"input": x[:, :, :10]})


def test_model_inputs_reads_the_declared_inputs_without_a_build(tmp_path):
    (declared,) = kiln.model_inputs(FASHION)
    assert declared.name == "input" and declared.shape == [-1, 1, 28, 28] and declared.dtype == "float32"
    with pytest.raises(kiln.Error, match="missing.onnx"):
        kiln.model_inputs(str(tmp_path / "missing.onnx"))


def test_threads_sharing_one_cpu_engine_match_serial_runs_bit_for_bit():
    """Python threads run kiln at once (the package releases the GIL); one CPU engine shared at
    mixed batch sizes gives each thread exactly what a serial run gives."""
    import threading

    engine = kiln.Engine.from_onnx(FASHION)
    rng = np.random.default_rng(11)
    inputs = [rng.standard_normal((batch, 1, 28, 28)).astype(np.float32) for batch in (1, 3, 8, 2, 5, 1)]
    expected = [engine.run({"input": x})["logits"].copy() for x in inputs]
    mismatches, errors = [], []

    def worker(t: int) -> None:
        try:
            for r in range(12):
                i = (t * 5 + r) % len(inputs)
                got = engine.run({"input": inputs[i]})["logits"]
                if not np.array_equal(got, expected[i]):
                    mismatches.append((t, r, i))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]
    assert not mismatches, f"{len(mismatches)} of 72 concurrent runs differ from serial runs: {mismatches[:5]}"


def test_large_inputs_reuse_memory_without_touching_earlier_outputs(tmp_path):
    """The binding reads a CPU engine's input arrays in place. Outputs computed from an input (an
    Identity of it, a chain of Negs) share no memory with it, and later runs, serial or from
    several threads at once, neither change earlier outputs nor see each other's inputs."""
    import threading

    from onnx import TensorProto, helper

    shape = [4, 3, 128, 128]  # 786 KB a row: 3 MB an input
    # Neg 21 times: runs long enough that other threads copy their inputs while one runs.
    chain = [helper.make_node("Neg", ["x" if k == 0 else f"n{k}"], [f"n{k + 1}" if k < 20 else "neg"]) for k in range(21)]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["same"])] + chain,
                              "alias", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("same", TensorProto.FLOAT, shape),
                               helper.make_tensor_value_info("neg", TensorProto.FLOAT, shape)])
    path = str(tmp_path / "alias.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    engine = kiln.Builder(device="cpu").build(path)
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    kept = [engine.run({"x": x}) for x in inputs]  # every output alive at once
    for x, out in zip(inputs, kept):
        assert not np.shares_memory(out["same"], x) and not np.shares_memory(out["neg"], x)
    for _ in range(3):
        for x in inputs[::-1]:
            out = engine.run({"x": x})
            np.testing.assert_array_equal(out["same"], x)
            np.testing.assert_array_equal(out["neg"], -x)
    for x, out in zip(inputs, kept):
        np.testing.assert_array_equal(out["same"], x)
        np.testing.assert_array_equal(out["neg"], -x)
    del kept
    errors = []

    def worker(t: int) -> None:
        try:
            for r in range(20):
                x = inputs[(t + r) % len(inputs)]
                out = engine.run({"x": x})
                if not (np.array_equal(out["same"], x) and np.array_equal(out["neg"], -x)):
                    errors.append((t, r))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:5]


def test_an_output_that_is_an_input_owns_its_memory(tmp_path):
    """A CPU engine reads its input arrays in place; a graph output that is a graph input (no node
    between) comes back as a copy, so changing the array after the run does not change it."""
    from onnx import TensorProto, helper

    shape = [2, 3, 4]
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["neg"])], "passthrough",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
                               helper.make_tensor_value_info("neg", TensorProto.FLOAT, shape)])
    path = str(tmp_path / "passthrough.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    engine = kiln.Builder(device="cpu").build(path)
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    want = x.copy()
    out = engine.run({"x": x})
    assert not np.shares_memory(out["x"], x)
    x += 1.0
    np.testing.assert_array_equal(out["x"], want)
    np.testing.assert_array_equal(out["neg"], -want)


def test_scalar_and_strided_inputs_keep_their_shapes(tmp_path):
    """0-d arrays (a scale or a zero point given as a runtime input) reach the engine as scalars,
    numpy scalars too, and a strided view is copied in row-major order: the
    answers are ONNX Runtime's."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Mul", ["x", "s"], ["xs"]), helper.make_node("Add", ["xs", "b"], ["y"])],
                              "scalars", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
                                          helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
                                          helper.make_tensor_value_info("b", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])
    path = str(tmp_path / "scalars.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    engine = kiln.Builder(device="cpu").build(path)
    wide = np.arange(24, dtype=np.float32).reshape(3, 8)
    x = wide[:, ::2]  # not contiguous
    for s, b in ((np.array(1.5, dtype=np.float32), np.array(-2.0, dtype=np.float32)), (np.float32(0.25), np.float32(3.0))):
        want = ort_run(path, {"x": np.ascontiguousarray(x), "s": np.asarray(s), "b": np.asarray(b)})[0]
        np.testing.assert_array_equal(engine.run({"x": x, "s": s, "b": b})["y"], want)


def test_cpu_threads_can_be_set_and_every_count_computes_the_same():
    """kiln.set_cpu_threads sets the CPU engine's threads for the process: a count of 1, 2 and 3
    gives the same outputs bit for bit (each output element is summed in one fixed order,
    whichever thread computes it); a negative count is refused; 0 goes back to every CPU."""
    engine = kiln.Engine.from_onnx(FASHION)
    x = np.random.default_rng(12).standard_normal((16, 1, 28, 28)).astype(np.float32)
    outputs = []
    try:
        for threads in (1, 2, 3):
            kiln.set_cpu_threads(threads)
            assert kiln.cpu_threads() == threads
            outputs.append(engine.run({"input": x})["logits"].copy())
        with pytest.raises(kiln.InvalidArgumentError, match="CPU threads"):
            kiln.set_cpu_threads(-1)
    finally:
        kiln.set_cpu_threads(0)
    assert kiln.cpu_threads() == len(os.sched_getaffinity(0))
    for other in outputs[1:]:
        np.testing.assert_array_equal(other, outputs[0])


def test_bad_inputs_are_kiln_errors_that_say_what(tmp_path):
    engine = kiln.Engine.from_onnx(FASHION)
    with pytest.raises(kiln.Error, match="float32.*float64|float64"):
        engine.run({"input": np.zeros((1, 1, 28, 28), np.float64)})
    with pytest.raises(kiln.Error, match="input"):
        engine.run({})
    with pytest.raises(kiln.Error, match="no_such.onnx"):
        kiln.Engine.from_onnx(str(tmp_path / "no_such.onnx"))
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(open(FASHION, "rb").read()[:1000])
    with pytest.raises(kiln.Error, match="truncated.onnx"):
        kiln.Engine.from_onnx(str(truncated))
    with pytest.raises(kiln.Error, match="precision 'fp4'"):
        kiln.Builder(precision="fp4")
    with pytest.raises(kiln.Error, match="calibrate"):
        kiln.Builder(precision="int8").build(FASHION)
    # int8 and fp8 on the GPU: quantized where it times faster than fp16, unless quantize_all asks
    # for every layer.
    assert kiln.Builder(precision="int8").options.quantized_where_faster
    assert not kiln.Builder(precision="fp8", quantize_all=True).options.quantized_where_faster
    assert issubclass(kiln.Error, RuntimeError)


def test_profiles_from_python_are_checked(tmp_path):
    """Optimization profiles reach the C++ API (ShapeRange, or (min, opt, max) tuples); the CPU
    engine refuses them (it runs any shape), and its files and engines list none."""
    r = kiln.ShapeRange([1, 1, 28, 28], [8, 1, 28, 28], [16, 1, 28, 28])
    assert (r.min, r.opt, r.max) == ([1, 1, 28, 28], [8, 1, 28, 28], [16, 1, 28, 28]) and "max=[16x1x28x28]" in repr(r)
    builder = kiln.Builder(device="cpu", profiles=[{"input": ([1, 1, 28, 28], [8, 1, 28, 28], [16, 1, 28, 28])}])
    assert builder.options.profiles[0]["input"].opt == [8, 1, 28, 28]
    with pytest.raises(kiln.Error, match="optimization profiles are for GPU engines"):
        builder.build(FASHION)
    engine = kiln.Engine.from_onnx(FASHION)
    assert engine.profiles == []
    saved = str(tmp_path / "cpu.engine")
    engine.save(saved)
    assert kiln.Engine.load(saved).profiles == [] and kiln.Engine.load(saved).inputs[0].shape == [-1, 1, 28, 28]
    if not kiln.has_cuda:
        return
    # A GPU build's profile is checked before any GPU is used: a bad one fails the same way here.
    bad = kiln.Builder(precision="fp16", device="cuda", profiles=[{"input": ([4, 1, 28, 28], [2, 1, 28, 28], [8, 1, 28, 28])}])
    with pytest.raises(kiln.Error, match="min <= opt <= max"):
        bad.build(FASHION)


def test_int8_calibration_from_a_dataloader_on_fashion_mnist():
    import torch

    images, labels = train_fashion_mnist.load_split("train")
    train = torch.utils.data.TensorDataset(torch.from_numpy(train_fashion_mnist.normalize(images[:256])),
                                           torch.from_numpy(labels[:256].astype(np.int64)))
    loader = torch.utils.data.DataLoader(train, batch_size=64)
    builder = kiln.Builder(precision="int8")
    scales = builder.calibrate(FASHION, loader, progress=False)
    assert len(scales) > 10 and all(s > 0 for s in scales.values())
    int8 = builder.build(FASHION)
    assert int8.info()["precision"] == "int8"
    assert any(layer["op"] == "QConv" for layer in int8.info()["layers"])
    test_images, test_labels = train_fashion_mnist.load_split("t10k")
    x = train_fashion_mnist.normalize(test_images[:500])
    float_out = kiln.Engine.from_onnx(FASHION).run({"input": x})["logits"]
    int8_out = int8.run({"input": x})["logits"]
    agreement = np.mean(float_out.argmax(1) == int8_out.argmax(1))
    accuracy = np.mean(int8_out.argmax(1) == test_labels[:500])
    assert agreement >= 0.97, agreement
    assert accuracy >= 0.85, accuracy
    # An empty iterable is an error, not scales of nothing.
    with pytest.raises(kiln.Error, match="no calibration batches"):
        kiln.calibrate(FASHION, [], progress=False)


def test_simplify_writes_onnx_that_onnxruntime_runs_alike(tmp_path):
    src, out = str(tmp_path / "squeezenet.onnx"), str(tmp_path / "simplified.onnx")
    spec = export_model.load_model("squeezenet1_1", size=64)
    export_model.export(spec, src, "torchscript", 13)
    before, after = kiln.simplify(src, out)
    assert after < before  # the exporter's shape arithmetic folds away
    x = spec.make_inputs(3, 1)[0]
    np.testing.assert_allclose(ort_run(out, {"input": x})[0], ort_run(src, {"input": x})[0], rtol=1e-5, atol=1e-5)
    import onnx

    model = onnx.load(out)
    onnx.checker.check_model(model)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # the batch stays dynamic


def test_kiln_export_command_with_simplify(kiln_bin, tmp_path):
    out = tmp_path / "resnet18.onnx"
    p = subprocess.run([kiln_bin, "export", "resnet18", "--size", "32", "--simplify", "-o", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "simplified with kiln's folding passes" in p.stdout and "ONNX Runtime vs PyTorch" in p.stdout
    assert out.exists()
    # A tool that is not there is a clear error, not a traceback.
    p = subprocess.run([kiln_bin, "export", "no_such_model", "-o", str(tmp_path / "x.onnx")], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode != 0 and "no_such_model" in p.stderr and "Traceback" not in p.stderr


def test_compare_on_the_cpu_writes_the_documented_schema(kiln_bin, tmp_path):
    out = tmp_path / "results.json"
    p = subprocess.run([kiln_bin, "compare", "resnet18", "--device", "cpu", "--size", "32", "--batches", "1,2",
                        "--runs", "3", "--warmup", "1", "--calib-images", "8", "--kiln", "fp32,fp16,int8,bf16",
                        "--work", str(tmp_path / "work"), "-o", str(out)], capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "pytorch eager-fp32: batch 2 (2/2)" in p.stdout  # progress
    r = json.loads(out.read_text())
    assert r["schema"] == "kiln.compare/1"
    assert r["device"]["kind"] == "cpu" and r["model"]["input_shape"] == [-1, 3, 32, 32]
    measured = {(e["runtime"], e["variant"], e["batch"]) for e in r["results"] if "latency_ms" in e}
    for runtime, variant in (("pytorch", "eager-fp32"), ("pytorch", "compile"), ("kiln", "fp32"), ("kiln", "int8"),
                             ("kiln", "bf16")):
        for b in (1, 2):
            assert (runtime, variant, b) in measured, (runtime, variant, b, r["results"])
    for e in r["results"]:
        if "latency_ms" in e:
            assert 0 < e["latency_ms"]["min"] <= e["latency_ms"]["median"] <= e["latency_ms"]["p99"]
            assert e["throughput"] == pytest.approx(e["batch"] * 1000 / e["latency_ms"]["median"])
        else:
            assert e["error"]  # fp16 on the CPU says why it is not there
    acc = {(e["runtime"], e["variant"]): e for e in r["accuracy"]["entries"]}
    assert acc[("kiln", "fp32")]["max_abs_diff"] < 1e-3 and acc[("kiln", "fp32")]["top1_agreement"] == 1.0
    assert acc[("kiln", "int8")]["cosine"] > 0.9
    assert acc[("kiln", "bf16")]["cosine"] > 0.98


def test_compare_takes_a_transformer_by_name(kiln_bin, tmp_path):
    """A transformers architecture by name (hf:TYPE with a small configuration): two int64 inputs
    of --seq-len tokens, hidden states out; kiln fp32 matches PyTorch, top-1 agreement is null
    for an output that is not class scores, and INT8 calibrates on both inputs."""
    out = tmp_path / "results.json"
    name = "hf:bert:num_hidden_layers=2,hidden_size=32,num_attention_heads=4,intermediate_size=64,vocab_size=97"
    p = subprocess.run([kiln_bin, "compare", name, "--device", "cpu", "--seq-len", "12", "--batches", "1,3",
                        "--torch", "eager-fp32", "--kiln", "fp32,int8", "--runs", "3", "--warmup", "1",
                        "--work", str(tmp_path / "work"), "-o", str(out)], capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["model"]["inputs"] == [{"name": "input_ids", "shape": [-1, 12]}, {"name": "attention_mask", "shape": [-1, 12]}]
    measured = {(e["runtime"], e["variant"], e["batch"]) for e in r["results"] if "latency_ms" in e}
    assert measured == {(rt, v, b) for rt, v in (("pytorch", "eager-fp32"), ("kiln", "fp32"), ("kiln", "int8")) for b in (1, 3)}
    acc = {e["variant"]: e for e in r["accuracy"]["entries"] if e["runtime"] == "kiln"}
    assert acc["fp32"]["top1_agreement"] is None
    assert acc["fp32"]["relative_l2"] < 1e-5 and acc["fp32"]["cosine"] > 0.99999
    assert 0 < acc["int8"]["relative_l2"] < 0.05 and acc["int8"]["cosine"] > 0.999


def test_errors_are_subclasses_by_kind_with_kilns_fields(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    with pytest.raises(kiln.IoError) as e:
        kiln.Engine.from_onnx(str(tmp_path / "missing.onnx"))
    assert e.value.kind == "io" and e.value.file.endswith("missing.onnx") and isinstance(e.value, kiln.Error)

    engine = kiln.Engine.from_onnx(FASHION)
    with pytest.raises(kiln.InvalidArgumentError) as e:
        engine.run({"input": np.zeros((1, 1, 28, 27), np.float32)})
    assert isinstance(e.value, ValueError) and "input" in e.value.message and e.value.kind == "invalid_argument"

    node = helper.make_node("Frobnicate", ["x"], ["y"], name="the_odd_one", domain="example.org")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.org", 1)])
    onnx.save(model, str(tmp_path / "odd.onnx"))
    with pytest.raises(kiln.UnsupportedError, match="the_odd_one") as e:
        kiln.Engine.from_onnx(str(tmp_path / "odd.onnx"))
    assert e.value.kind == "unsupported" and e.value.hint

    node = helper.make_node("Add", ["x", "z"], ["y"], name="the_add")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                            helper.make_tensor_value_info("z", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "add.onnx"))
    with pytest.raises(kiln.InvalidModelError) as e:
        kiln.Engine.from_onnx(str(tmp_path / "add.onnx"))
    assert (e.value.node, e.value.op_type, e.value.file) == ("the_add", "Add", str(tmp_path / "add.onnx"))

    with pytest.raises(kiln.InvalidModelError) as e:
        kiln.Engine.deserialize(b"not an engine")
    assert e.value.kind == "invalid_model"


def test_engines_from_bytes_and_model_protos_and_serialized(tmp_path):
    import onnx

    x = np.random.default_rng(5).standard_normal((3, 1, 28, 28)).astype(np.float32)
    want = kiln.Engine.from_onnx(FASHION).run({"input": x})["logits"]
    with open(FASHION, "rb") as f:
        data = f.read()
    for model in (data, onnx.load(FASHION)):
        np.testing.assert_array_equal(kiln.Engine.from_onnx(model).run({"input": x})["logits"], want)

    engine = kiln.Engine.from_onnx(FASHION)
    again = kiln.Engine.deserialize(engine.serialize())
    np.testing.assert_array_equal(again.run({"input": x})["logits"], want)
    # A CPU engine file has no GPU to go to: the GPU number is not read.
    np.testing.assert_array_equal(kiln.Engine.deserialize(engine.serialize(), gpu=3).run({"input": x})["logits"], want)

    external = onnx.load(FASHION)
    onnx.save(external, str(tmp_path / "ext.onnx"), save_as_external_data=True, size_threshold=0)
    with pytest.raises(kiln.InvalidArgumentError, match="external"):
        kiln.Engine.from_onnx(onnx.load(str(tmp_path / "ext.onnx"), load_external_data=False))
    with pytest.raises(kiln.InvalidArgumentError, match="not int"):
        kiln.Engine.from_onnx(42)


def test_inference_session_answers_as_onnxruntimes_does():
    ort_session = ort.InferenceSession(FASHION, providers=["CPUExecutionProvider"])
    session = kiln.InferenceSession(FASHION, providers=["CPUExecutionProvider"])
    assert session.get_providers() == ["CPUExecutionProvider"]
    for ours, theirs in ((session.get_inputs(), ort_session.get_inputs()), (session.get_outputs(), ort_session.get_outputs())):
        assert [(a.name, a.type, len(a.shape)) for a in ours] == [(b.name, b.type, len(b.shape)) for b in theirs]
        for a, b in zip(ours, theirs):
            assert [d for d in a.shape if isinstance(d, int)] == [d for d in b.shape if isinstance(d, int)]
    x = np.random.default_rng(9).standard_normal((4, 1, 28, 28)).astype(np.float32)
    (want,) = ort_session.run(None, {"input": x})
    (got,) = session.run(None, {"input": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    (named,) = session.run(["logits"], {"input": x})
    np.testing.assert_array_equal(named, got)
    with pytest.raises(kiln.InvalidArgumentError, match="no output 'probs'"):
        session.run(["probs"], {"input": x})


def test_builder_takes_a_qdq_model_without_calibration(kiln_bin, tmp_path):
    qdq = tmp_path / "fashion_qdq.onnx"
    r = subprocess.run([kiln_bin, "quantize", FASHION, "--calib", "fashion-mnist", "--calib-batches", "4",
                        "-o", str(qdq)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    engine = kiln.Builder(precision="int8").build(str(qdq))
    assert engine.info()["precision"] == "int8"
    x = np.random.default_rng(3).standard_normal((16, 1, 28, 28)).astype(np.float32)
    want = kiln.Engine.from_onnx(FASHION).run({"input": x})["logits"]
    got = engine.run({"input": x})["logits"]
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.75
    with pytest.raises(kiln.InvalidArgumentError, match="needs calibrated activation scales"):
        kiln.Builder(precision="int8").build(FASHION)  # a float model: calibrate() first


def _stub_signatures(tree) -> dict[str, dict[str, list[str] | None]]:
    """{class name or "": {member: parameter names (None: not a function)}} of a .pyi module."""
    import ast

    def members(body) -> dict[str, list[str] | None]:
        out: dict[str, list[str] | None] = {}
        for node in body:
            if isinstance(node, ast.FunctionDef):
                # Positional-only parameters are the binding's unnamed ones, which pybind11 calls argN.
                positional = [a.arg for a in node.args.posonlyargs if a.arg != "self"]
                named = [a.arg for a in node.args.args + node.args.kwonlyargs if a.arg != "self"]
                out[node.name] = [f"arg{i}" for i in range(len(positional))] + named
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out[node.target.id] = None
            elif isinstance(node, ast.ClassDef):
                out[node.name] = None
        return out

    found = {"": members(tree.body)}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            found[node.name] = members(node.body)
    return found


def _runtime_parameters(function) -> list[str] | None:
    """Parameter names, self left out: a Python function's, or those of pybind11's signature line
    ("name(a: int, b: str = ...) -> ...")."""
    import inspect
    import re

    if inspect.isfunction(function):
        return [name for name in inspect.signature(function).parameters if name != "self"]
    doc = (getattr(function, "__doc__", None) or "").strip()
    m = re.match(r"\w+\((.*?)\)\s*->", doc.splitlines()[0] if doc else "")
    if not m:
        return None
    names = [p.split(":")[0].strip() for p in re.split(r",\s*(?![^\[]*\])", m.group(1)) if p.strip()]
    return [n for n in names if n not in ("self", "*", "/")]


def test_type_stubs_describe_the_extension_module():
    """python/kiln/_kiln.pyi (shipped with py.typed) names exactly what kiln._kiln has, with the
    same parameter names: a binding added, renamed or given new arguments without its stub fails."""
    import ast
    import inspect

    from kiln import _kiln

    package = os.path.dirname(kiln.__file__)
    assert os.path.exists(os.path.join(package, "py.typed"))
    with open(os.path.join(package, "_kiln.pyi")) as f:
        stubs = _stub_signatures(ast.parse(f.read()))

    runtime = {n for n in dir(_kiln) if not n.startswith("_")} | {"__version__"}
    if not _kiln.has_native_grpc:  # a build without gRPC's C++ library has no native front
        stubs[""].pop("GrpcFront")
        stubs[""].pop("Unavailable")
    assert set(stubs[""]) == runtime, ("stub only:", set(stubs[""]) - runtime, "module only:", runtime - set(stubs[""]))
    for name in runtime:
        obj = getattr(_kiln, name)
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            have = {m for m in vars(obj) if not m.startswith("_")}
            if (obj.__init__.__doc__ or "").startswith("__init__("):  # a constructor of the binding's
                have.add("__init__")
            stubbed = {m for m in stubs[name] if not m.startswith("_") or m == "__init__"}
            assert stubbed == have, (name, "stub only:", stubbed - have, "module only:", have - stubbed)
            for member in have:
                params = _runtime_parameters(getattr(obj, member))
                if params is not None and stubs[name][member] is not None:
                    assert stubs[name][member] == params, (f"{name}.{member}", stubs[name][member], params)
        elif callable(obj) and not inspect.isclass(obj):
            assert stubs[""][name] == _runtime_parameters(obj), (name, stubs[""][name], _runtime_parameters(obj))
