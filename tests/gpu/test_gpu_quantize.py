"""QuantizeLinear / DequantizeLinear on the GPU against the CPU engine, bit for bit: small ONNX
graphs with constant scales and zero points (the GPU layers need constants), per tensor and
per channel, int8 and uint8, on random inputs that include exact .5 quotients (round half to
even) and values beyond the integer range (saturation)."""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from qdq_models import make_input, make_model  # tests/e2e


def run(kiln_bin, model, x_path, out_dir, *extra):
    r = subprocess.run([kiln_bin, "run", model, "--input", f"x={x_path}", "--top-k", "0", "-o", out_dir, *extra],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return {n: np.load(os.path.join(out_dir, n + ".npy")) for n in ("q", "y")}


@pytest.mark.parametrize("qtype", ["int8", "uint8"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_qdq_matches_cpu(kiln_bin, tmp_path, qtype, per_channel):
    model = str(tmp_path / "qdq.onnx")
    make_model(model, qtype, per_channel)
    x = make_input()
    x_path = str(tmp_path / "x.npy")
    np.save(x_path, x)
    want = run(kiln_bin, model, x_path, str(tmp_path / "cpu"), "--device", "cpu")
    for precision in ("fp32", "fp16"):
        got = run(kiln_bin, model, x_path, str(tmp_path / f"gpu_{precision}"), "--device", "cuda", f"--{precision}")
        assert got["q"].dtype == want["q"].dtype
        np.testing.assert_array_equal(got["q"], want["q"])
        np.testing.assert_array_equal(got["y"], want["y"])
