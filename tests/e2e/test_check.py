"""`kiln check`: kiln against ONNX Runtime on the same inputs, output by output, and on a failure
the first layer that diverges."""
from __future__ import annotations

import json
import os

import numpy as np

from test_errors import assert_clean_error

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FASHION = os.path.join(REPO, "models", "fashion_mnist_resnet.onnx")


def test_float_engine_passes_against_onnxruntime(run_kiln, tmp_path):
    report = tmp_path / "report.json"
    r = run_kiln("check", FASHION, "--batch", "4", "--random", "2", "--json", report)
    assert r.returncode == 0, r.describe()
    assert "PASSED" in r.stdout
    data = json.loads(report.read_text())
    assert data["ok"] and len(data["sets"]) == 2 and data["atol"] == 1e-4
    logits = data["sets"][0]["outputs"]["logits"]
    assert logits["shape"] == [4, 10] and logits["mismatched"] == 0 and logits["cosine"] > 0.999999
    assert logits["top1_agreement"] == 1.0


def test_bf16_engine_passes_at_its_own_tolerance(run_kiln, tmp_path):
    """The CPU engine of bfloat16 products against ONNX Runtime's float32: within bfloat16's default
    tolerance (5e-2), outside float32's, which an explicit --atol/--rtol brings back."""
    report = tmp_path / "report.json"
    r = run_kiln("check", FASHION, "--bf16", "--batch", "4", "--random", "2", "--json", report)
    assert r.returncode == 0, r.describe()
    data = json.loads(report.read_text())
    assert data["ok"] and data["atol"] == 5e-2
    assert data["sets"][0]["outputs"]["logits"]["cosine"] > 0.999
    with open("/proc/cpuinfo") as f:
        if "avx512_bf16" in f.read().split():  # the products are bfloat16 here, not float32
            r = run_kiln("check", FASHION, "--bf16", "--batch", "4", "--atol", "1e-6", "--rtol", "1e-6", "--no-bisect")
            assert r.returncode == 1 and "FAILED" in r.stdout, r.describe()


def test_given_inputs_and_the_cpu_reference(run_kiln, tmp_path):
    x = np.random.default_rng(3).standard_normal((2, 1, 28, 28)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = run_kiln("check", FASHION, "--inputs", f"input={tmp_path / 'x.npy'}", "--reference", "cpu")
    assert r.returncode == 0, r.describe()
    assert "against kiln's CPU engine" in r.stdout and "logits [2, 10]" in r.stdout


def test_a_divergence_fails_and_names_the_first_layer(run_kiln, tmp_path):
    """INT8 against float32 with a float32 tolerance: the first quantized layer is where it starts."""
    np.save(tmp_path / "calib.npy", np.random.default_rng(0).standard_normal((16, 1, 28, 28)).astype(np.float32))
    report = tmp_path / "report.json"
    r = run_kiln("check", FASHION, "--batch", "4", "--int8", "--calib", tmp_path / "calib.npy", "--atol", "1e-3",
                 "--rtol", "1e-3", "--json", report)
    assert r.returncode == 1, r.describe()
    assert "FAIL  logits" in r.stdout and "first divergence" in r.stdout and "FAILED" in r.stdout
    first = json.loads(report.read_text())["sets"][0]["first_divergence"]
    # The stem (Conv, BatchNorm, ReLU: one INT8 layer in kiln) computes the first value that differs.
    assert first["value"].startswith("/stem/") and first["compared_before"] == 0, first
    assert first["mismatched"] > 0 and first["cosine"] > 0.99


def test_usage_errors(run_kiln, tmp_path):
    assert_clean_error(run_kiln("check", FASHION, "--no-such-option"), "kiln check", "--no-such-option")
    assert_clean_error(run_kiln("check", FASHION, "--inputs", "nope=x.npy"), "no input 'nope'")


def test_swin_window_attention_runs_and_matches_onnxruntime(run_kiln, model_cache):
    """Swin-T (torchvision, random weights): its shifted-window attention writes with ScatterND,
    which the CPU engine refused before; the whole model now matches ONNX Runtime."""
    path = os.path.join(model_cache, "swin_t_224.onnx")
    if not os.path.exists(path):
        r = run_kiln("export", "swin_t", "--size", "224", "-o", path)
        assert r.returncode == 0, r.describe()
    r = run_kiln("check", path, "--batch", "1")
    assert r.returncode == 0, r.describe()
    assert "ok    output [1, 1000]" in r.stdout


def test_an_opset_9_export_imports_and_matches_onnxruntime(run_kiln, model_cache):
    """MobileNet-V2 exported at opset 9: ReLU6 is a Clip whose bounds are attributes there, which
    the importer turns into the inputs the IR takes."""
    path = os.path.join(model_cache, "mobilenet_v2_64_opset9.onnx")
    if not os.path.exists(path):
        r = run_kiln("export", "mobilenet_v2", "--size", "64", "--opset", "9", "--exporter", "torchscript", "-o", path)
        assert r.returncode == 0, r.describe()
    r = run_kiln("check", path, "--batch", "2")
    assert r.returncode == 0, r.describe()
