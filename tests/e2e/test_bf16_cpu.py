"""CPU engines of bfloat16 products (kiln build --device cpu --bf16): float32 storage, the
products of convolutions, MatMul and Gemm by constant weights in bfloat16 on AMX-BF16 or
AVX512-BF16 where the CPU has them. The engine file keeps the precision; inspect names the layers
that run in bfloat16; on Fashion-MNIST's test images the trained model's answers agree with
float32's; outputs differ from float32's by bfloat16's rounding and no more; GPU builds and
other precisions alongside refuse it with a clear error."""
from __future__ import annotations

import json
import os
import subprocess

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(REPO, "models", "fashion_mnist_resnet.onnx")


def kiln(kiln_bin, *args, timeout=300):
    return subprocess.run([kiln_bin, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def cpu_has_bf16() -> bool:
    with open("/proc/cpuinfo") as f:
        return "avx512_bf16" in f.read().split()


def test_bf16_engine_files_name_their_bfloat16_layers(kiln_bin, tmp_path):
    engine = tmp_path / "bf16.engine"
    r = kiln(kiln_bin, "build", MODEL, "--device", "cpu", "--bf16", "-o", engine)
    assert r.returncode == 0, r.stderr
    assert "precision bf16" in r.stdout, r.stdout
    info = json.loads(kiln(kiln_bin, "inspect", engine, "--json").stdout)  # read back from the file
    assert info["precision"] == "bf16"
    tactics = {layer["name"]: layer["tactic"] for layer in info["layers"] if layer["op"] == "ChannelsLastConv"}
    assert len(tactics) > 10, info["layers"]
    if cpu_has_bf16():
        # Every convolution but the one-channel stem (read channels-first, kept float32).
        in_bf16 = [n for n, t in tactics.items() if t.startswith("cpu bf16 ")]
        assert len(in_bf16) == len(tactics) - 1, tactics
    else:  # float32 where the CPU has no bfloat16 products
        assert set(tactics.values()) == {"cpu"}, tactics
    r = kiln(kiln_bin, "build", MODEL, "--device", "cpu", "-o", tmp_path / "fp32.engine")
    assert r.returncode == 0, r.stderr
    fp32 = json.loads(kiln(kiln_bin, "inspect", tmp_path / "fp32.engine", "--json").stdout)
    assert fp32["precision"] == "fp32"
    assert all(layer["tactic"] == "cpu" for layer in fp32["layers"]), fp32["layers"]


def test_bf16_agrees_with_float32_on_real_images(kiln_bin, tmp_path):
    r = kiln(kiln_bin, "eval", MODEL, "--device", "cpu", "--bf16", "--dataset", "fashion-mnist", "--limit", "2000",
             "--json", tmp_path / "eval.json")
    assert r.returncode == 0, r.stderr
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["precision"] == "bf16", result
    assert result["agreement_fp32"] >= 0.99, result
    assert result["top1"] >= 0.85, result


def test_bf16_outputs_are_float32_to_bfloat16_rounding(kiln_bin, tmp_path):
    x = np.random.default_rng(4).standard_normal((8, 1, 28, 28)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = {}
    for name, flags in (("fp32", []), ("bf16", ["--bf16"])):
        r = kiln(kiln_bin, "run", MODEL, "--device", "cpu", *flags, "--input", f"input={tmp_path / 'x.npy'}",
                 "--output-dir", tmp_path / name)
        assert r.returncode == 0, r.stderr
        out[name] = np.load(tmp_path / name / "logits.npy").astype(np.float64)
    rel = np.linalg.norm(out["bf16"] - out["fp32"]) / np.linalg.norm(out["fp32"])
    assert rel < 3e-2, rel
    if cpu_has_bf16():
        assert rel > 1e-5, rel  # and it did round
    assert np.array_equal(out["bf16"].argmax(1), out["fp32"].argmax(1))


def test_bf16_is_refused_where_it_does_not_apply(kiln_bin, tmp_path):
    r = kiln(kiln_bin, "build", MODEL, "--device", "cuda", "--bf16", "-o", tmp_path / "gpu.engine")
    assert r.returncode != 0 and "bf16 (bfloat16 products) is a CPU engine precision" in r.stderr, r.stderr
    assert not (tmp_path / "gpu.engine").exists()
    r = kiln(kiln_bin, "build", MODEL, "--device", "cpu", "--bf16", "--int8", "-o", tmp_path / "both.engine")
    assert r.returncode != 0 and "give one of" in r.stderr and "--bf16" in r.stderr, r.stderr
    r = kiln(kiln_bin, "build", MODEL, "--device", "cpu", "--bf16", "--calib", "fashion-mnist", "-o", tmp_path / "c.engine")
    assert r.returncode != 0 and "--calib" in r.stderr, r.stderr
