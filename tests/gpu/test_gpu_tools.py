"""The command line's GPU tools as a TensorRT user reaches for them.

`kiln bench`'s timing modes: the default times one run at a time; --throughput and --streams N
enqueue runs ahead on N contexts (trtexec's way) and report throughput over the wall clock, each
run's host latency split into H2D + GPU compute + D2H, and the host's enqueue time; every run's
times go to --exportTimes.

fp16 precision debugging: a model whose first product overflows float16 (a LayerNormalization
then brings it back to a small range) gives inf or NaN in an fp16 build. `--layer-precision
NAME=fp32` keeps layers in float32 in an fp16 build; `kiln debug precision --fp16` finds the
fewest that bring the output within a tolerance of the float32 engine, and the build command it
prints gives an engine that matches numpy's float64 result."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROWS, WIDTH, HIDDEN, CLASSES = 8, 32, 64, 10


def overflowing_model(path: str) -> tuple[str, dict]:
    """y = LayerNorm(x @ W1) @ W2 + b, x [8, 32]: W1 is N(0, 1) * 8000, so x @ W1 has a standard
    deviation of about 45,000 and most rows pass float16's 65,504; LayerNorm returns them to
    N(0, 1). Nodes: "big" (MatMul), "norm" (LayerNormalization), "head" (MatMul), "bias" (Add)."""
    rng = np.random.default_rng(11)
    weights = {"w1": rng.standard_normal((WIDTH, HIDDEN)).astype(np.float32) * 8000,
               "gamma": np.ones(HIDDEN, np.float32), "beta": np.zeros(HIDDEN, np.float32),
               "w2": rng.standard_normal((HIDDEN, CLASSES)).astype(np.float32) * 0.3,
               "b": rng.standard_normal(CLASSES).astype(np.float32)}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="big"),
        helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["n"], name="norm", axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["n", "w2"], ["z"], name="head"),
        helper.make_node("Add", ["z", "b"], ["y"], name="bias"),
    ]
    graph = helper.make_graph(nodes, "overflowing", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, CLASSES])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path, weights


def reference(x: np.ndarray, w: dict) -> np.ndarray:
    h = x.astype(np.float64) @ w["w1"].astype(np.float64)
    n = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
    return n @ w["w2"].astype(np.float64) + w["b"]


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory):
    return overflowing_model(str(tmp_path_factory.mktemp("tools") / "overflowing.onnx"))


def kiln(kiln_bin: str, *args, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, KILN_PYTHON=sys.executable)
    return subprocess.run([kiln_bin, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def run_engine(kiln_bin: str, engine: str, x: np.ndarray, tmp_path) -> np.ndarray:
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    r = kiln(kiln_bin, "run", engine, "--input", f"x={tmp_path / 'x.npy'}", "-o", out)
    assert r.returncode == 0, r.stderr
    return np.load(out / "y.npy")


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


def test_fp16_overflows_and_layers_pinned_to_fp32_fix_it(kiln_bin, overflowing, tmp_path):
    path, weights = overflowing
    x = np.random.default_rng(3).standard_normal((ROWS, WIDTH)).astype(np.float32)
    want = reference(x, weights)

    half = str(tmp_path / "half.engine")
    assert kiln(kiln_bin, "build", path, "--fp16", "-o", half).returncode == 0
    got = run_engine(kiln_bin, half, x, tmp_path)
    assert not np.isfinite(got).all() or relative_error(got, want) > 0.1  # float16 overflows in "big"

    pinned = str(tmp_path / "pinned.engine")
    built = kiln(kiln_bin, "build", path, "--fp16", "--layer-precision", "big=fp32", "--layerPrecisions=norm:fp32", "-o", pinned)
    assert built.returncode == 0, built.stderr
    kept_line = next((l for l in built.stdout.splitlines() if "kept float32 in this fp16 build:" in l), "")
    assert "big (MatMul)" in kept_line and "norm (LayerNormalization)" in kept_line, built.stdout
    layers = {l["name"]: l for l in json.loads(kiln(kiln_bin, "inspect", pinned, "--json", "-").stdout)["layers"]}
    assert layers["big"]["precision"] == "float32" and layers["norm"]["precision"] == "float32"
    assert layers["head"]["precision"] == "float16"
    assert relative_error(run_engine(kiln_bin, pinned, x, tmp_path), want) < 0.01

    unknown = kiln(kiln_bin, "build", path, "--fp16", "--layer-precision", "nosuch=fp32", "-o", tmp_path / "no.engine")
    assert unknown.returncode == 1 and "kiln: error:" in unknown.stderr
    assert "layer 'nosuch' is pinned to float32, and the optimized graph has no node of that name" in unknown.stderr
    assert not (tmp_path / "no.engine").exists()


def test_debug_precision_fp16_finds_the_layers_to_keep_in_float32(kiln_bin, overflowing, tmp_path):
    path, weights = overflowing
    report_path = tmp_path / "report.json"
    r = kiln(kiln_bin, "debug", "precision", path, "--fp16", "--metric", "relative-l2", "--budget", "0.01",
             "--budget-batches", "2", "--json", report_path)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(report_path.read_text())
    assert report["precision"] == "fp16" and report["metric"] == "relative-l2" and report["met"]
    # All fp16: inf or NaN in the output (null in JSON), or far off.
    assert report["all_quantized"]["relative_l2"] is None or report["all_quantized"]["relative_l2"] > 0.01
    assert report["with_float_layers"]["relative_l2"] <= 0.01
    ranked = [entry["layer"] for entry in report["ranking"]]
    assert {"big", "norm", "head"} <= set(ranked), ranked
    kept = report["float_layers"]
    assert "big" in kept and "norm" in kept and kept == ranked[:len(kept)], report
    # Progress: a line per layer scored.
    assert r.stderr.count("accuracy budget: sensitivity ") == len(ranked), r.stderr

    command = shlex.split(r.stdout.split("build it so: ", 1)[1].splitlines()[0])
    assert [a for a in command if a.endswith("=fp32")] == [f"{layer}=fp32" for layer in kept]
    engine = str(tmp_path / "debugged.engine")
    built = kiln(kiln_bin, *command[1:], "-o", engine)
    assert built.returncode == 0, built.stderr
    x = np.random.default_rng(5).standard_normal((ROWS, WIDTH)).astype(np.float32)  # inputs it was not fitted on
    assert relative_error(run_engine(kiln_bin, engine, x, tmp_path), reference(x, weights)) < 0.01


def test_bench_latency_and_throughput_modes(kiln_bin, overflowing, tmp_path):
    path, _ = overflowing
    latency_json, times_json = tmp_path / "latency.json", tmp_path / "times.json"
    r = kiln(kiln_bin, "bench", path, "--fp16", "--iterations", "30", "--warmup", "3", "--json", latency_json)
    assert r.returncode == 0, r.stderr
    assert "[latency: one run at a time]" in r.stdout, r.stdout
    doc = json.loads(latency_json.read_text())
    assert "synchronized after each" in doc["timing"]
    result = doc["results"][0]
    assert result["mode"] == "latency" and result["streams"] == 1 and result["iterations"] == 30
    assert result["throughput_per_s"] == pytest.approx(ROWS * 1000 / result["latency_ms"]["median"])
    assert result["gpu_compute_ms"]["median"] <= result["latency_ms"]["median"] + 1e-6
    assert "h2d_ms" not in result

    throughput_json = tmp_path / "throughput.json"
    r = kiln(kiln_bin, "bench", path, "--fp16", "--streams", "3", "--with-transfers", "--iterations", "60", "--warmup", "6",
             "--json", throughput_json, "--exportTimes", times_json)
    assert r.returncode == 0, r.stderr
    assert "[throughput: 3 streams, 2 runs in flight each]" in r.stdout, r.stdout
    assert "host latency median" in r.stdout and "GPU compute" in r.stdout
    doc = json.loads(throughput_json.read_text())
    assert "throughput mode: 3 context(s)" in doc["timing"]
    result = doc["results"][0]
    assert result["mode"] == "throughput" and result["streams"] == 3 and result["runs_in_flight_per_stream"] == 2
    assert result["iterations"] == 60 and result["with_transfers"]
    assert result["throughput_per_s"] == pytest.approx(ROWS * 60 / result["wall_s"])
    for part in ("h2d_ms", "d2h_ms"):
        assert result[part]["median"] > 0, part
    assert result["enqueue_ms"]["median"] > 0
    exported = json.loads(times_json.read_text())[0]
    times, compute = exported["times_ms"], exported["gpu_compute_times_ms"]
    assert len(times) == len(compute) == 60
    # Host latency is H2D + GPU compute + D2H, each from the run's own events.
    assert all(c <= t + 1e-6 for c, t in zip(compute, times))
    assert result["latency_ms"]["median"] == pytest.approx(float(np.median(times)))
    # Three contexts took memory of their own: more than one context's activations.
    assert result["gpu_memory_context_bytes"] > 0
