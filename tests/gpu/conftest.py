"""GPU tests: kiln's GPU engine against its CPU engine, on the GPU machine (pytest tests/gpu).

KILN_BIN names the kiln binary (default build-gpu/kiln, then build/kiln); KILN_MODEL_CACHE a
folder for exported models (default tests/e2e/.models/<torch version>)."""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))


@pytest.fixture(scope="session")
def kiln_bin() -> str:
    for candidate in (os.environ.get("KILN_BIN"), os.path.join(ROOT, "build-gpu", "kiln"), os.path.join(ROOT, "build", "kiln")):
        if candidate and os.path.exists(candidate):
            return candidate
    pytest.fail("no kiln binary: set KILN_BIN or build build-gpu/")


@pytest.fixture(scope="session")
def model_cache() -> str:
    import torch

    path = os.environ.get("KILN_MODEL_CACHE") or os.path.join(ROOT, "tests", "e2e", ".models", f"torch-{torch.__version__.split('+')[0]}")
    os.makedirs(path, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def resnet18_64(tmp_path_factory):
    """ResNet-18 at 64x64 (random weights, calibrated BatchNorm), exported with a dynamic batch:
    (ONNX path, export_model.ModelSpec)."""
    import export_model

    path = str(tmp_path_factory.mktemp("resnet18") / "resnet18.onnx")
    spec = export_model.load_model("resnet18", size=64)
    export_model.export(spec, path, "torchscript", 17)
    return path, spec
