"""Engine files of the CPU engine: kiln build --device cpu writes them, run / eval / bench / inspect
read them and give what the ONNX model gives; a file that is truncated, corrupted, foreign,
from another kiln version or for a GPU this machine lacks is a clear error (exit 1, the file
named), never a crash. The format is docs/engine-format.md's (magic, version, header JSON, the
optimized graph as ONNX, its weights, FNV-1a checksum); pack() below writes it as kiln does, to
forge the bad cases."""
from __future__ import annotations

import json
import os
import struct
import subprocess

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(REPO, "models", "fashion_mnist_resnet.onnx")


def kiln(kiln_bin, *args, timeout=300):
    return subprocess.run([kiln_bin, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def unpack(data: bytes) -> tuple[dict, bytes, bytes]:
    assert data[:8] == b"KILNENG1" and struct.unpack_from("<I", data, 8) == (3,)
    at = 12
    sections = []
    for _ in range(3):
        (n,) = struct.unpack_from("<Q", data, at)
        sections.append(data[at + 8:at + 8 + n])
        at += 8 + n
    assert at + 8 == len(data)
    return json.loads(sections[0]), sections[1], sections[2]


def fnv1a(data: bytes) -> int:
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def pack(header: dict, graph: bytes, weights: bytes, version: int = 3) -> bytes:
    body = b"KILNENG1" + struct.pack("<I", version)
    for section in (json.dumps(header).encode(), graph, weights):
        body += struct.pack("<Q", len(section)) + section
    return body + struct.pack("<Q", fnv1a(body))


@pytest.fixture(scope="module")
def engines(kiln_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("engines")
    fp32, int8, cache = d / "fp32.engine", d / "int8.engine", d / "model.calib"
    r = kiln(kiln_bin, "build", MODEL, "--device", "cpu", "-o", fp32)
    assert r.returncode == 0, r.stderr
    r = kiln(kiln_bin, "build", MODEL, "--device", "cpu", "--int8", "--calib", "fashion-mnist", "--calib-batches", "4",
             "--calib-batch", "32", "--calib-cache", cache, "-o", int8)
    assert r.returncode == 0, r.stderr
    return {"fp32": fp32, "int8": int8, "cache": cache, "dir": d}


def outputs(kiln_bin, model, x_path, out_dir, *extra):
    r = kiln(kiln_bin, "run", model, "--input", f"input={x_path}", "--output-dir", out_dir, *extra)
    assert r.returncode == 0, r.stderr
    return np.load(os.path.join(out_dir, "logits.npy"))


def test_cpu_engine_files_run_like_the_model(kiln_bin, engines, tmp_path):
    x = np.random.default_rng(3).standard_normal((5, 1, 28, 28)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = outputs(kiln_bin, MODEL, tmp_path / "x.npy", tmp_path / "onnx")
    np.testing.assert_array_equal(outputs(kiln_bin, engines["fp32"], tmp_path / "x.npy", tmp_path / "fp32"), want)
    # The INT8 engine carries its scales: it computes what the model does with the same cache.
    want8 = outputs(kiln_bin, MODEL, tmp_path / "x.npy", tmp_path / "onnx8", "--int8", "--calib-cache", engines["cache"])
    got8 = outputs(kiln_bin, engines["int8"], tmp_path / "x.npy", tmp_path / "int8")
    np.testing.assert_array_equal(got8, want8)
    assert not np.array_equal(got8, want)  # and it is INT8
    r = kiln(kiln_bin, "eval", engines["int8"], "--dataset", "fashion-mnist", "--limit", "100", "--reference", MODEL)
    assert r.returncode == 0 and "int8 on cpu" in r.stdout, r.stdout + r.stderr
    r = kiln(kiln_bin, "bench", engines["fp32"], "--iterations", "3", "--warmup", "1")
    assert r.returncode == 0 and "cpu fp32" in r.stdout, r.stdout + r.stderr


def test_cpu_bench_profiles_every_layer(kiln_bin, engines, tmp_path):
    """`kiln bench --profile` on the CPU engine times each layer of the engine, by the wall clock,
    in its order: the JSON (and --exportProfile's file) names every layer of `kiln inspect` once,
    with a time each, adding up to about the run's latency, and the convolutions' FLOPs."""
    out = tmp_path / "bench.json"
    r = kiln(kiln_bin, "bench", engines["fp32"], "--batches", "4", "--iterations", "5", "--warmup", "1", "--profile",
             "--json", out, "--exportProfile", tmp_path / "profile.json")
    assert r.returncode == 0, r.stderr
    assert "profile (median of 10 runs, layer by layer, wall clock)" in r.stdout, r.stdout
    result = json.loads(out.read_text())["results"][0]
    profile = result["profile"]
    layers = json.loads(kiln(kiln_bin, "inspect", engines["fp32"], "--json").stdout)["layers"]
    assert [(p["name"], p["op"]) for p in profile["layers"]] == [(layer["name"], layer["op"]) for layer in layers]
    assert all(p["median_ms"] > 0 for p in profile["layers"])
    # FLOPs at the run's shapes (the engine's own layers have a symbolic batch).
    convs = [p for p in profile["layers"] if p["op"] in ("FusedConv", "ChannelsLastConv")]
    assert convs and all(p["flops"] > 0 for p in convs), convs
    # Bandwidth: the activations' bytes over the median time; no device peak on the CPU.
    assert all(p["bytes"] > 0 and p["bytes_per_s"] == pytest.approx(p["bytes"] / p["median_ms"] * 1e3) for p in convs), convs
    assert not any("bandwidth_fraction" in p for p in profile["layers"])
    assert " GB/s" in r.stdout, r.stdout
    assert profile["total_ms"] == pytest.approx(sum(p["median_ms"] for p in profile["layers"]))
    # Medians of other runs than the timed ones: the same order of magnitude as the latency.
    assert 0.2 * result["latency_ms"]["median"] < profile["total_ms"] < 5 * result["latency_ms"]["median"]
    exported = json.loads((tmp_path / "profile.json").read_text())
    assert json.dumps(exported).count('"median_ms"') == len(layers), exported


def test_inspect_an_engine_file(kiln_bin, engines):
    r = kiln(kiln_bin, "inspect", engines["int8"], "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["backend"] == "cpu" and info["precision"] == "int8" and info["kiln_version"] == "0.1.0"
    assert info["inputs"][0]["name"] == "input" and info["inputs"][0]["shape"] == [-1, 1, 28, 28]
    ops = [layer["op"] for layer in info["layers"]]
    assert "QConv" in ops and "BatchNormalization" not in ops  # the layers after the passes
    assert all({"name", "op", "tactic", "precision", "shape"} <= set(layer) for layer in info["layers"])
    qconv = next(layer for layer in info["layers"] if layer["op"] == "QConv")
    assert qconv["precision"] == "int8" and qconv["shape"][1:] == [16, 28, 28]
    assert info["int8_scales"] > 10 and "memory" in info
    text = kiln(kiln_bin, "inspect", engines["fp32"])
    assert text.returncode == 0 and "cpu engine, precision fp32" in text.stdout, text.stdout


def bad(kiln_bin, path, *expected):
    r = kiln(kiln_bin, "run", path, "--random")
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert str(path) in r.stderr, r.stderr
    for e in expected:
        assert e in r.stderr, (e, r.stderr)


def test_engine_files_hold_the_optimized_graph(kiln_bin, engines):
    """The graph section is the graph after kiln's passes (fused, channels-last and INT8 ops in domain "kiln"),
    its initializers in the weights section; INT8 weights are stored as int8, so the INT8 file is
    a fraction of the float32 one."""
    import onnx

    sizes = {}
    for kind in ("fp32", "int8"):
        data = open(engines[kind], "rb").read()
        sizes[kind] = len(data)
        header, graph, weights = unpack(data)
        model = onnx.ModelProto()
        model.ParseFromString(graph)
        ops = {(n.domain, n.op_type) for n in model.graph.node}
        assert ("", "BatchNormalization") not in ops
        # fp32: the CPU engine's layout pass makes chains of FusedConv channels-last on AVX-512 CPUs.
        fp32_convs = {("kiln", "FusedConv"), ("kiln", "ChannelsLastConv")}
        assert (("kiln", "QConv") in ops) == (kind == "int8") and (ops & fp32_convs if kind == "fp32" else ("kiln", "QConv") in ops)
        assert model.graph.initializer and all(
            t.data_location == onnx.TensorProto.EXTERNAL and dict((e.key, e.value) for e in t.external_data)["location"]
            == "kiln:weights" for t in model.graph.initializer)
        ends = [int(dict((e.key, e.value) for e in t.external_data)["offset"]) +
                int(dict((e.key, e.value) for e in t.external_data)["length"]) for t in model.graph.initializer]
        assert max(ends) == len(weights)
        assert header["inputs"][0]["name"] == "input" and header["outputs"][0]["name"] == "logits"
        # Where the layout pass made channels-last convolutions (AVX-512), their filters are stored
        # as the kernels' panels (docs/engine-format.md, "Packed weights"), as is the classifier's.
        layouts = {dict((e.key, e.value) for e in t.external_data).get("kiln_layout") for t in model.graph.initializer}
        if kind == "fp32" and ("kiln", "ChannelsLastConv") in ops:
            assert {"f32.cols32.taps", "f32.cols32.nk"} <= layouts, layouts
        # INT8 convolutions' filters as the int8 GEMM's panels, where the CPU has one (VNNI or AMX).
        if kind == "int8" and "avx512_vnni" in open("/proc/cpuinfo").read():
            assert any(layout and layout.startswith("i8.") for layout in layouts), layouts
    # The model has 0.18 M parameters in convolutions (int8 now) and a float classifier.
    assert sizes["int8"] <= 0.30 * sizes["fp32"], sizes


def test_bad_engine_files_are_clear_errors(kiln_bin, engines, tmp_path):
    data = open(engines["fp32"], "rb").read()
    header, graph, weights = unpack(data)
    assert header["backend"] == "cpu" and header["profiles"] == []
    repacked = tmp_path / "repacked.engine"
    repacked.write_bytes(pack(header, graph, weights))
    r = kiln(kiln_bin, "run", repacked, "--random")
    assert r.returncode == 0, r.stderr  # the forger writes files kiln reads: the cases below fail for their own reason

    cases = {
        "truncated.engine": (data[: len(data) // 2], ["truncated"]),
        "corrupted.engine": (data[:5000] + bytes([data[5000] ^ 0x40]) + data[5001:], ["checksum"]),
        "older_format.engine": (pack(header, graph, weights, version=1), ["format 1", "older", "rebuild"]),
        "newer_format.engine": (pack(header, graph, weights, version=99), ["format 99", "newer"]),
        "other_kiln.engine": (pack({**header, "kiln_version": "9.9.9"}, graph, weights), ["9.9.9", "rebuild"]),
        "unknown_backend.engine": (pack({**header, "backend": "tpu"}, graph, weights), ["tpu"]),
        "bad_precision.engine": (pack({**header, "options": {**header["options"], "precision": "fp4"}}, graph, weights),
                                 ["fp4"]),
        "no_options.engine": (pack({k: v for k, v in header.items() if k != "options"}, graph, weights), ["options"]),
        "bad_graph.engine": (pack(header, graph[:300], weights), ["ONNX"]),
        "short_weights.engine": (pack(header, graph, weights[: len(weights) // 2]), ["weights section"]),
        "empty.engine": (b"KILNENG1", ["truncated"]),
    }
    # Packed weights whose layout kiln does not know, or whose bytes do not fit the layout named.
    import onnx

    model = onnx.ModelProto()
    model.ParseFromString(graph)
    target = max((t for t in model.graph.initializer if len(t.dims) == 4), key=lambda t: int(np.prod(t.dims)))
    for name, layout, expected in (("unknown_layout.engine", "f32.cols99.kn", ["'" + target.name + "'", "f32.cols99.kn"]),
                                   ("packed_length.engine", "f32.cols32.nk", ["'" + target.name + "'", "bytes packed"])):
        forged = onnx.ModelProto()
        forged.CopyFrom(model)
        t = next(t for t in forged.graph.initializer if t.name == target.name)
        entries = [(e.key, e.value) for e in t.external_data if e.key != "kiln_layout"]
        if layout == "f32.cols32.nk":  # 4 bytes short of what any layout of it holds
            entries = [(k, str(int(v) - 4) if k == "length" else v) for k, v in entries]
        del t.external_data[:]
        for k, v in entries + [("kiln_layout", layout)]:
            t.external_data.add(key=k, value=v)
        cases[name] = (pack(header, forged.SerializeToString(), weights), expected)
    for name, (content, expected) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        bad(kiln_bin, path, *expected)
    # A GPU engine on a machine without a GPU (CI), or one built for another GPU.
    gpu = {**header, "backend": "cuda", "device": {"gpu": "NVIDIA H100", "compute_capability": "9.0", "cudnn": 1,
                                                    "cublaslt": 1, "cuda_runtime": 1},
           "profiles": [{"input": {"min": [1, 1, 28, 28], "opt": [8, 1, 28, 28], "max": [8, 1, 28, 28]}}]}
    path = tmp_path / "gpu.engine"
    path.write_bytes(pack(gpu, graph, weights))
    r = kiln(kiln_bin, "run", path, "--random")
    assert r.returncode == 1 and str(path) in r.stderr, r.stderr
