"""scripts/gpu_gate.py run refuses before any suite starts when what the suites need is missing on
the GPU machine (each miss would otherwise cost a whole suite's device time), naming the fix."""
from __future__ import annotations

import gzip
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import gpu_gate  # noqa: E402


def test_a_package_that_does_not_import_is_named_with_its_fix(tmp_path):
    reasons = gpu_gate.unready_reasons(["python"], dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert len(reasons) == 1, reasons
    assert "kiln package does not import" in reasons[0] and "build_gpu_python.sh" in reasons[0]


def test_conformance_alone_needs_no_package(tmp_path):
    assert gpu_gate.unready_reasons(["conformance"], dict(os.environ, PYTHONPATH=str(tmp_path))) == []


def test_the_models_suite_needs_the_fashion_mnist_test_split(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_gate, "fashion_mnist_folders", lambda env: [str(tmp_path)])
    env = dict(os.environ)  # the build's package on PYTHONPATH (the CTest sets it)
    reasons = gpu_gate.unready_reasons(["models"], env)
    assert len(reasons) == 1 and "Fashion-MNIST" in reasons[0] and "carry .data" in reasons[0], reasons
    for name in gpu_gate.FASHION_MNIST_FILES[:1]:
        with gzip.open(tmp_path / name, "wb") as f:
            f.write(b"\0")
    assert len(gpu_gate.unready_reasons(["models"], env)) == 1  # one file of two is not the split
    for name in gpu_gate.FASHION_MNIST_FILES:
        with gzip.open(tmp_path / name, "wb") as f:
            f.write(b"\0")
    assert gpu_gate.unready_reasons(["models"], env) == []
