"""QuantizeLinear / DequantizeLinear on kiln's CPU engine against ONNX Runtime, bit for bit
(round half to even, saturation, per tensor and per channel, int8 and uint8)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from qdq_models import make_input, make_model


@pytest.mark.parametrize("qtype", ["int8", "uint8"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_qdq_matches_onnxruntime(run_kiln, tmp_path, qtype, per_channel):
    model = str(tmp_path / "qdq.onnx")
    make_model(model, qtype, per_channel)
    x = make_input()
    np.save(tmp_path / "x.npy", x)
    result = run_kiln("run", model, "--input", f"x={tmp_path / 'x.npy'}", "--top-k", "0", "--output-dir", tmp_path / "out")
    assert result.returncode == 0, result.describe()
    want_q, want_y = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got_q = np.load(tmp_path / "out" / "q.npy")
    assert got_q.dtype == want_q.dtype
    np.testing.assert_array_equal(got_q, want_q)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), want_y)
