"""Engine files of the CPU engine: kiln build --device cpu writes them, run / eval / bench / inspect
read them and give what the ONNX model gives; a file that is truncated, corrupted, foreign,
from another kiln version or for a GPU this machine lacks is a clear error (exit 1, the file
named), never a crash. The format is src/engine/engine_file.h's (magic, version, header JSON,
model, FNV-1a checksum); pack() below writes it as kiln does, to forge the bad cases."""
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


def unpack(data: bytes) -> tuple[dict, bytes]:
    assert data[:8] == b"KILNENG1"
    (header_len,) = struct.unpack_from("<Q", data, 12)
    header = json.loads(data[20:20 + header_len])
    (model_len,) = struct.unpack_from("<Q", data, 20 + header_len)
    model = data[28 + header_len:28 + header_len + model_len]
    return header, model


def fnv1a(data: bytes) -> int:
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def pack(header: dict, model: bytes, version: int = 1) -> bytes:
    h = json.dumps(header).encode()
    body = b"KILNENG1" + struct.pack("<I", version) + struct.pack("<Q", len(h)) + h + struct.pack("<Q", len(model)) + model
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
    r = kiln(kiln_bin, "eval", engines["int8"], "--dataset", "fashion-mnist", "--limit", "500", "--reference", MODEL)
    assert r.returncode == 0 and "int8 on cpu" in r.stdout, r.stdout + r.stderr
    r = kiln(kiln_bin, "bench", engines["fp32"], "--iterations", "3", "--warmup", "1")
    assert r.returncode == 0 and "cpu fp32" in r.stdout, r.stdout + r.stderr


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


def test_bad_engine_files_are_clear_errors(kiln_bin, engines, tmp_path):
    data = open(engines["fp32"], "rb").read()
    header, model = unpack(data)
    assert header["backend"] == "cpu" and model == open(MODEL, "rb").read()
    repacked = tmp_path / "repacked.engine"
    repacked.write_bytes(pack(header, model))
    r = kiln(kiln_bin, "run", repacked, "--random")
    assert r.returncode == 0, r.stderr  # the forger writes files kiln reads: the cases below fail for their own reason

    cases = {
        "truncated.engine": (data[: len(data) // 2], ["truncated"]),
        "corrupted.engine": (data[:5000] + bytes([data[5000] ^ 0x40]) + data[5001:], ["checksum"]),
        "newer_format.engine": (pack(header, model, version=99), ["format"]),
        "other_kiln.engine": (pack({**header, "kiln_version": "9.9.9"}, model), ["9.9.9", "rebuild"]),
        "unknown_backend.engine": (pack({**header, "backend": "tpu"}, model), ["tpu"]),
        "bad_precision.engine": (pack({**header, "options": {**header["options"], "precision": "fp4"}}, model), ["fp4"]),
        "no_options.engine": (pack({k: v for k, v in header.items() if k != "options"}, model), ["options"]),
        "bad_model.engine": (pack(header, model[:300]), []),
        "empty.engine": (b"KILNENG1", ["truncated"]),
    }
    for name, (content, expected) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        bad(kiln_bin, path, *expected)
    # A GPU engine on a machine without a GPU (CI), or one built for another GPU.
    gpu = {**header, "backend": "cuda", "device": {"gpu": "NVIDIA H100", "compute_capability": "9.0", "cudnn": 1,
                                                    "cublaslt": 1, "cuda_runtime": 1},
           "options": {**header["options"], "input_shapes": {"input": [1, 1, 28, 28]}}}
    path = tmp_path / "gpu.engine"
    path.write_bytes(pack(gpu, model))
    r = kiln(kiln_bin, "run", path, "--random")
    assert r.returncode == 1 and str(path) in r.stderr, r.stderr
