"""scripts/export_model.py, the export the model tests rely on, used the way a user would."""
from __future__ import annotations

import os
import subprocess
import sys

import onnx

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "export_model.py")


def run_script(*args):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=600)


def test_export_checks_against_pytorch(tmp_path):
    out = tmp_path / "squeezenet.onnx"
    p = run_script("squeezenet1_1", "--size", 64, "--opset", 13, "-o", out)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "relative L2 error" in p.stdout
    model = onnx.load(str(out))
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == 13
    # The batch dimension is symbolic, the others are fixed.
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param and not dims[0].dim_value
    assert [d.dim_value for d in dims[1:]] == [3, 64, 64]


def test_unknown_model_is_reported(tmp_path):
    p = run_script("no_such_model", "-o", tmp_path / "x.onnx")
    assert p.returncode != 0
    assert "no_such_model" in p.stderr
    assert not (tmp_path / "x.onnx").exists()
