"""INT8 engines on the GPU (kiln::QConv on cuDNN's INT8 engines) against the CPU engine's exact
integer reference, with the same calibration cache on both sides.

Both engines quantize the same convolutions with the same scales and sum int8 products exactly;
they differ only in the float epilogue's rounding (the GPU folds the scales into fewer
multiplies and rounds with cuDNN's conversion), which flips an int8 value by one step now and
then, and in the float16 storage of the GPU's float layers. So the GPU must match the CPU's
INT8 output far more closely than INT8 matches float32: relative L2 at most 2e-2 (measured
figures are printed), and top-1 the same on 98% of inputs; and both must be close to float32.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import export_model
from e2e_models import E2eModel, exported_model
from test_gpu_models import rel_l2, run_kiln

GPU_VS_CPU_INT8 = 2e-2
INT8_VS_FP32 = 0.2  # random-weight networks: ~10% measured on the CPU (tests/e2e/test_quantize_model.py)


@pytest.mark.parametrize("name,size", [("resnet18", 64), ("resnet50", 224)])
def test_int8_gpu_matches_cpu_reference(name, size, kiln_bin, model_cache, tmp_path):
    model = E2eModel(name, size)
    path = exported_model(model_cache, model, "torchscript")
    make = export_model.input_maker(name, size=size)
    calib = str(tmp_path / "calib.npy")
    np.save(calib, make(16, seed=21)[0])
    cache = str(tmp_path / f"{name}.calib")
    batch = 32 if size < 224 else 8
    x = make(batch, seed=22)
    common = ["--int8", "--calib", calib, "--calib-cache", cache]
    cpu = run_kiln(kiln_bin, path, x, ["input"], str(tmp_path / "cpu"), "--device", "cpu", *common)
    gpu = run_kiln(kiln_bin, path, x, ["input"], str(tmp_path / "gpu"), "--device", "cuda", *common)
    fp32 = run_kiln(kiln_bin, path, x, ["input"], str(tmp_path / "fp32"), "--device", "cpu")
    for out in cpu:
        err = rel_l2(gpu[out], cpu[out])
        to_fp32 = rel_l2(gpu[out], fp32[out])
        agree = float(np.mean(gpu[out].argmax(1) == cpu[out].argmax(1)))
        print(f"{name} {out}: GPU int8 vs CPU int8 {err:.4f}, GPU int8 vs fp32 {to_fp32:.4f}, "
              f"CPU int8 vs fp32 {rel_l2(cpu[out], fp32[out]):.4f}, top-1 agreement {agree:.3f}")
        assert np.isfinite(gpu[out]).all()
        assert err <= GPU_VS_CPU_INT8
        assert to_fp32 <= INT8_VS_FP32
        assert agree >= 0.98
