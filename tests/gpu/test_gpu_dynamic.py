"""Dynamic shapes on the GPU: engines built with optimization profiles (--min-shapes, --opt-shapes,
--max-shapes) run every shape within a profile and compute what the CPU engine computes there,
static engines' shapes included, and a transformer takes a dynamic batch and sequence in one
profile; a shape outside every profile, a wrong rank or dtype is a clear error (a wrong dtype:
tests/gpu/test_gpu_python.py; kiln run converts .npy data); the engine file keeps the profiles and
the built graph (an INT8 file is under 30% of the float32 one); kiln inspect reports the profiles;
kiln bench sweeps one engine over batches. Inputs that set parameters (a Reduce's axes, a Resize's
sizes) are planned by value: each distinct value is a plan of its own, as a shape is."""
from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from test_gpu_models import rel_l2, run_kiln

FP16_TOLERANCE = 1e-2


def kiln(kiln_bin, *args, timeout=900):
    return subprocess.run([kiln_bin, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def ok(r):
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def run_output(kiln_bin, model, x, tmp_path, tag, *extra):
    x_path = tmp_path / f"x_{tag}.npy"
    np.save(x_path, x)
    out = tmp_path / f"out_{tag}"
    ok(kiln(kiln_bin, "run", model, "--input", f"input={x_path}", "--top-k", "0", "-o", out, *extra))
    return np.load(out / "output.npy")


def profile_flags(lo, opt, hi, size=64):
    return ["--min-shapes", f"input:{lo}x3x{size}x{size}", "--opt-shapes", f"input:{opt}x3x{size}x{size}",
            "--max-shapes", f"input:{hi}x3x{size}x{size}"]


@pytest.fixture(scope="module")
def dynamic_fp16(kiln_bin, resnet18_64, tmp_path_factory):
    path, spec = resnet18_64
    engine = tmp_path_factory.mktemp("dynamic") / "resnet18_dyn.engine"
    r = ok(kiln(kiln_bin, "build", path, "--fp16", *profile_flags(1, 8, 16), "-o", engine))
    assert "profile 0: input min 1x3x64x64 opt 8x3x64x64 max 16x3x64x64" in r.stdout, r.stdout
    return engine


def test_every_batch_in_the_profile_matches_the_cpu(kiln_bin, resnet18_64, dynamic_fp16, tmp_path):
    path, spec = resnet18_64
    for batch in (1, 3, 8, 13, 16, 5, 1):  # min, between, opt, between, max; back to shapes planned before
        x = spec.make_inputs(batch, 40 + batch)[0]
        want = run_output(kiln_bin, path, x, tmp_path, f"cpu{batch}", "--device", "cpu")
        got = run_output(kiln_bin, dynamic_fp16, x, tmp_path, f"gpu{batch}")
        assert got.shape == want.shape == (batch, 1000)
        err = rel_l2(got, want)
        print(f"batch {batch}: relative L2 error {err:.3g}")
        assert err <= FP16_TOLERANCE, f"batch {batch}: {err}"


def test_dynamic_engine_equals_static_engines_at_their_shapes(kiln_bin, resnet18_64, dynamic_fp16, tmp_path):
    """At a timed shape (min, opt, max) the dynamic engine's plan is what a static build makes:
    the same layers and the same tactics from the same timing, so the same numbers."""
    path, spec = resnet18_64
    cache = tmp_path / "timing.cache"
    for batch in (1, 8, 16):
        static = tmp_path / f"static{batch}.engine"
        ok(kiln(kiln_bin, "build", path, "--fp16", "--batch", batch, "--timing-cache", cache, "-o", static))
        x = spec.make_inputs(batch, 70 + batch)[0]
        a = run_output(kiln_bin, static, x, tmp_path, f"static{batch}")
        b = run_output(kiln_bin, dynamic_fp16, x, tmp_path, f"dyn{batch}")
        assert rel_l2(b, a) <= FP16_TOLERANCE
        layers = {}
        for name, engine in (("static", static), ("dynamic", dynamic_fp16)):
            info = json.loads(ok(kiln(kiln_bin, "inspect", engine, "--json")).stdout)
            layers[name] = [layer["op"] for layer in info["layers"]]
        assert layers["static"] == layers["dynamic"]


def test_shapes_outside_the_profile_are_clear_errors(kiln_bin, resnet18_64, dynamic_fp16, tmp_path):
    path, spec = resnet18_64
    cases = {
        "above": (np.zeros((17, 3, 64, 64), np.float32), ["no optimization profile", "above the profile's max 16"]),
        "spatial": (np.zeros((2, 3, 32, 32), np.float32), ["profile", "dimension 2"]),
        "rank": (np.zeros((2, 3, 64), np.float32), ["rank"]),
    }
    for tag, (x, words) in cases.items():
        x_path = tmp_path / f"{tag}.npy"
        np.save(x_path, x)
        r = kiln(kiln_bin, "run", dynamic_fp16, "--input", f"input={x_path}")
        assert r.returncode == 1, (tag, r.stdout, r.stderr)
        for w in words:
            assert w in r.stderr, (tag, w, r.stderr)


def test_context_past_the_memory_limit_is_refused_before_allocating(kiln_bin, dynamic_fp16, tmp_path):
    """The engine's max-shape context (activations, workspace, inputs and outputs) with its
    weights is checked against --max-memory before any of it is allocated."""
    r = kiln(kiln_bin, "run", dynamic_fp16, "--batch", "2", "--random", "--max-memory", "1M")
    assert r.returncode == 1, (r.stdout, r.stderr)
    for w in ("execution context needs", "activations", "workspace", "memory limit of 1.0 MiB", "--max-memory"):
        assert w in r.stderr, (w, r.stderr)
    r = kiln(kiln_bin, "run", dynamic_fp16, "--batch", "2", "--random", "--max-memory", "8G")
    assert r.returncode == 0, r.stderr[-3000:]


def test_malformed_profiles_are_refused(kiln_bin, resnet18_64, tmp_path):
    path, spec = resnet18_64
    cases = {
        "min above opt": (profile_flags(8, 4, 16), ["min <= opt <= max"]),
        "fixed dim": (["--min-shapes", "input:1x3x64x64", "--max-shapes", "input:4x4x64x64"], ["fixed at 3"]),
        "unknown input": (["--min-shapes", "image:1x3x64x64", "--max-shapes", "image:4x3x64x64"], ["image"]),
        "counts": (["--min-shapes", "input:1x3x64x64"], ["--max-shapes"]),
        "zero": (profile_flags(0, 4, 8), ["at least 1"]),
    }
    for tag, (flags, words) in cases.items():
        r = kiln(kiln_bin, "build", path, "--fp16", *flags, "-o", tmp_path / "x.engine")
        assert r.returncode == 1, (tag, r.stdout, r.stderr)
        for w in words:
            assert w in r.stderr, (tag, w, r.stderr)


def test_two_profiles_and_dynamic_spatial_dims(kiln_bin, resnet18_64, tmp_path):
    """ResNet-18 exported with a dynamic batch, height and width; one profile over batches at
    64x64, another over sizes 32..128."""
    import dataclasses

    import export_model

    _, spec = resnet18_64
    spec = dataclasses.replace(spec, dynamic_axes={"input": {0: "batch", 2: "h", 3: "w"}, "output": {0: "batch"}})
    path = str(tmp_path / "resnet18_hw.onnx")
    export_model.export(spec, path, "torchscript", 17)
    engine = tmp_path / "two.engine"
    ok(kiln(kiln_bin, "build", path, "--fp16",
            "--min-shapes", "input:1x3x64x64", "--opt-shapes", "input:2x3x64x64", "--max-shapes", "input:4x3x64x64",
            "--min-shapes", "input:2x3x32x32", "--opt-shapes", "input:8x3x96x96", "--max-shapes", "input:8x3x128x128",
            "-o", engine))
    info = json.loads(ok(kiln(kiln_bin, "inspect", engine, "--json")).stdout)
    assert len(info["profiles"]) == 2
    assert info["profiles"][1]["inputs"]["input"] == {"min": [2, 3, 32, 32], "opt": [8, 3, 96, 96], "max": [8, 3, 128, 128]}
    assert info["inputs"][0]["shape"] == [-1, 3, -1, -1]
    first = info["profiles"][1]["layers"][0]["shape"]
    assert first["min"][0] == 2 and first["opt"][0] == 8 and first["max"][2] > first["opt"][2]
    assert info["profiles"][1]["memory"]["activation_bytes"] > info["profiles"][0]["memory"]["activation_bytes"]
    for batch, size in ((3, 64), (2, 48), (6, 80), (8, 128)):
        x = export_model.input_maker("resnet18", size=size)(batch, seed=size)[0]
        want = run_output(kiln_bin, path, x, tmp_path, f"cpu{batch}_{size}", "--device", "cpu")
        got = run_output(kiln_bin, engine, x, tmp_path, f"gpu{batch}_{size}")
        err = rel_l2(got, want)
        print(f"batch {batch} at {size}x{size}: relative L2 error {err:.3g}")
        assert err <= FP16_TOLERANCE


def test_bench_sweeps_one_dynamic_engine(kiln_bin, dynamic_fp16, tmp_path):
    js = tmp_path / "bench.json"
    r = ok(kiln(kiln_bin, "bench", dynamic_fp16, "--batches", "1,4,8,16", "--iterations", "20", "--warmup", "3",
                "--json", js))
    results = json.loads(js.read_text())["results"]
    assert [x["batch"] for x in results] == [1, 4, 8, 16]
    assert all(x["dynamic_engine"] and x["input_shapes"]["input"][0] == x["batch"] for x in results)
    assert all(x["engine_file_bytes"] > 0 for x in results)
    r = kiln(kiln_bin, "bench", dynamic_fp16, "--batches", "32")
    assert r.returncode == 1 and "outside" in r.stderr, r.stderr


def test_int8_engine_files_with_profiles(kiln_bin, resnet18_64, tmp_path):
    """An INT8 engine with a profile: within the profile its error against float32 is the INT8 CPU
    engine's (same calibration cache; held as test_gpu_int8 holds static engines), and its file
    (int8 weights) is under 30% of the float32 one."""
    path, spec = resnet18_64
    calib = tmp_path / "calib.npy"
    np.save(calib, spec.make_inputs(16, 5)[0])
    cache = tmp_path / "r18.calib"
    files = {}
    for precision in ("fp32", "int8"):
        files[precision] = tmp_path / f"{precision}.engine"
        extra = ["--int8-all", "--calib", calib, "--calib-batch", "8", "--calib-cache", cache] if precision == "int8" else []
        ok(kiln(kiln_bin, "build", path, f"--{precision}", *profile_flags(1, 4, 8), *extra, "-o", files[precision]))
    sizes = {k: os.path.getsize(v) for k, v in files.items()}
    print("engine files:", sizes)
    assert sizes["int8"] <= 0.30 * sizes["fp32"], sizes
    for batch in (1, 6):
        x = spec.make_inputs(batch, 90 + batch)[0]
        cpu8 = run_output(kiln_bin, path, x, tmp_path, f"cpu8_{batch}", "--device", "cpu", "--int8", "--calib-cache", cache)
        fp32 = run_output(kiln_bin, path, x, tmp_path, f"cpu32_{batch}", "--device", "cpu")
        got = run_output(kiln_bin, files["int8"], x, tmp_path, f"gpu8_{batch}")
        err, cpu_err = rel_l2(got, fp32), rel_l2(cpu8, fp32)
        print(f"int8 batch {batch}: GPU int8 vs fp32 {err:.4f}, CPU int8 vs fp32 {cpu_err:.4f}")
        assert np.isfinite(got).all() and 0 < cpu_err
        assert err <= 0.25 and err <= 1.25 * cpu_err


TINY_BERT = "hf:bert:num_hidden_layers=2,hidden_size=64,num_attention_heads=4,intermediate_size=128,vocab_size=500"


def test_transformer_with_dynamic_batch_and_sequence(kiln_bin, tmp_path):
    """A BERT encoder exported with a dynamic batch and sequence (two int64 inputs): one fp16 engine
    whose profile (one flag each, naming both inputs) spans batch 1..8 and sequence 8..64 runs every
    shape in it, padded rows included, as the CPU engine does; a sequence past the profile is a
    clear error."""
    import export_model

    spec = export_model.load_model(TINY_BERT, seq_len=16, dynamic_sequence=True)
    model = tmp_path / "bert.onnx"
    export_model.export(spec, str(model))
    engine = tmp_path / "bert.engine"
    ok(kiln(kiln_bin, "build", model, "--fp16", "-o", engine,
            "--min-shapes", "input_ids:1x8", "attention_mask:1x8", "--opt-shapes", "input_ids:4x32", "attention_mask:4x32",
            "--max-shapes", "input_ids:8x64", "attention_mask:8x64"))

    def inputs(batch, seq):
        return export_model.input_maker(TINY_BERT, seq_len=seq)(batch, seq)

    for batch, seq in ((1, 8), (4, 32), (8, 64), (3, 13), (2, 50), (7, 9), (1, 64)):
        x = inputs(batch, seq)
        want = run_kiln(kiln_bin, model, x, spec.input_names, str(tmp_path / f"cpu{batch}x{seq}"), "--device", "cpu")
        got = run_kiln(kiln_bin, engine, x, spec.input_names, str(tmp_path / f"gpu{batch}x{seq}"))
        want, got = want["last_hidden_state"], got["last_hidden_state"]
        assert got.shape == want.shape == (batch, seq, 64)
        err = rel_l2(got, want)
        print(f"batch {batch}, sequence {seq}: relative L2 error {err:.3g}")
        assert err <= FP16_TOLERANCE, (batch, seq, err)
    # kiln bench runs the engine file at the shapes --shapes or --dim give, within its profile.
    for flags, want in ((["--shapes", "input_ids:2x50,attention_mask:2x50"], [2, 50]),
                        (["--dim", "sequence=24", "--batch", "3"], [3, 24])):
        js = tmp_path / "bench.json"
        ok(kiln(kiln_bin, "bench", engine, *flags, "--iterations", "5", "--warmup", "1", "--json", js))
        ran = json.loads(js.read_text())["results"][0]["input_shapes"]
        assert ran == {"input_ids": want, "attention_mask": want}, (flags, ran)
    r = kiln(kiln_bin, "bench", engine, "--shapes", "input_ids:2x80,attention_mask:2x80", "--iterations", "5")
    assert r.returncode == 1 and "above the profile's max 64" in r.stderr, r.stderr
    flags = []
    for name, value in zip(spec.input_names, inputs(2, 65)):
        np.save(tmp_path / f"{name}_past.npy", value)
        flags += ["--input", f"{name}={tmp_path / f'{name}_past.npy'}"]
    r = kiln(kiln_bin, "run", engine, *flags, "-o", tmp_path / "out_past")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "above the profile's max 64" in r.stderr, r.stderr


def _reduce_and_resize_model(path):
    """y = ReduceSum(Relu(x), axes) and r = Resize(x, sizes): both parameters are runtime inputs."""
    from onnx import TensorProto, helper
    import onnx

    nodes = [helper.make_node("Relu", ["x"], ["rx"]),
             helper.make_node("ReduceSum", ["rx", "axes"], ["y"], keepdims=0),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["r"], mode="nearest")]
    graph = helper.make_graph(nodes, "params", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8]),
                                                helper.make_tensor_value_info("axes", TensorProto.INT64, [1]),
                                                helper.make_tensor_value_info("sizes", TensorProto.INT64, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("r", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))


def test_inputs_that_set_parameters_are_planned_by_value(tmp_path):
    """A Reduce's axes and a Resize's sizes given as runtime inputs: with their values given at build
    time (input_values) the engine builds on the GPU's own layers (--strict) and matches the CPU
    engine; a run with other values (another output shape) is planned for them and matches too, on
    the engine, on a context, and on the engine saved and loaded; a context's enqueue() takes values
    from set_input_values."""
    import kiln

    model = tmp_path / "params.onnx"
    _reduce_and_resize_model(model)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False,
                       input_values={"axes": [1], "sizes": [2, 3, 16, 16]}).build(str(model))
    assert not any(l["cpu_fallback"] for l in gpu.info()["layers"])
    cpu = kiln.Builder(device="cpu").build(str(model))
    engine_path = tmp_path / "params.engine"
    gpu.save(str(engine_path))
    loaded = kiln.Engine.load(str(engine_path))
    context = gpu.create_context()
    for axes, sizes in [([1], [2, 3, 16, 16]), ([-1], [2, 3, 4, 12]), ([0], [1, 3, 8, 5]), ([1], [2, 3, 16, 16])]:
        feed = {"x": x, "axes": np.array(axes, dtype=np.int64), "sizes": np.array(sizes, dtype=np.int64)}
        want = cpu.run(feed)
        for runner in (gpu, loaded, context):
            got = runner.run(feed)
            assert got["y"].shape == want["y"].shape and got["r"].shape == tuple(sizes)
            assert np.allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5), (axes, np.abs(got["y"] - want["y"]).max())
            assert np.array_equal(got["r"], want["r"]), sizes
    with pytest.raises(kiln.Error, match="values for input 'axes' must be int64 1"):
        context.set_input_values("axes", np.array([0, 1], dtype=np.int64))
    with pytest.raises(kiln.Error, match="'x' is not planned by value"):
        context.set_input_values("x", x)


def test_kiln_run_plans_for_the_parameter_values_it_is_given(kiln_bin, tmp_path):
    """kiln run on the GPU plans for the values of the --input files that set parameters (axes,
    sizes): a --strict build succeeds and the outputs are the CPU engine's; --input-values on kiln
    build names them up front (kiln inspect shows them), one that is no input of the model is a clear error, and a --strict
    build without them says which inputs to give values for."""
    model = tmp_path / "params.onnx"
    _reduce_and_resize_model(model)
    x = np.random.default_rng(12).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "axes.npy", np.array([2], dtype=np.int64))
    np.save(tmp_path / "sizes.npy", np.array([2, 3, 5, 11], dtype=np.int64))
    outs = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / f"out_{device}"
        extra = ["--strict"] if device == "cuda" else []
        ok(kiln(kiln_bin, "run", model, "--device", device, *extra, "--input", f"x={tmp_path / 'x.npy'}",
                "--input", f"axes={tmp_path / 'axes.npy'}", "--input", f"sizes={tmp_path / 'sizes.npy'}", "-o", out))
        outs[device] = {name: np.load(out / f"{name}.npy") for name in ("y", "r")}
    assert outs["cuda"]["r"].shape == (2, 3, 5, 11)
    assert np.array_equal(outs["cuda"]["r"], outs["cpu"]["r"])
    assert np.allclose(outs["cuda"]["y"], outs["cpu"]["y"], rtol=1e-5, atol=1e-5)
    ok(kiln(kiln_bin, "build", model, "--strict", "--input-values", "axes=1", "--input-values", "sizes=2,3,16,16",
            "-o", tmp_path / "p.engine"))
    shown = ok(kiln(kiln_bin, "inspect", tmp_path / "p.engine")).stdout
    assert "planned by value" in shown and "= [2, 3, 16, 16]" in shown, shown
    r = kiln(kiln_bin, "build", model, "--input-values", "ax=1", "-o", tmp_path / "q.engine")
    assert r.returncode != 0 and "'ax', which is not an input of the model" in r.stderr, r.stderr[-2000:]
    r = kiln(kiln_bin, "build", model, "--strict", "-o", tmp_path / "s.engine")
    assert r.returncode != 0 and "input(s) axes, sizes set parameters of the model" in r.stderr, r.stderr[-2000:]
