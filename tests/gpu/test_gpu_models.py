"""Every model of the end-to-end list, built for the GPU in fp32 and fp16, against the CPU engine.

fp32 (strict): relative L2 error at most 1e-4. fp16: relative L2 error at most 1e-2, and for
classifiers the same top-1 class as the CPU engine on at least 99% of random inputs.
Each run feeds fresh random inputs (seeded per test) through `kiln run --output-dir`.
"""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import export_model
from e2e_models import exported_model, load_model_list  # tests/e2e: the same exports as the CPU tests

FP32_TOLERANCE = 1e-4
FP16_TOLERANCE = 1e-2
FP16_TOP1_AGREEMENT = 0.99


def run_kiln(kiln_bin, model_path, inputs, names, out_dir, *extra):
    os.makedirs(out_dir, exist_ok=True)
    args = [kiln_bin, "run", model_path, "--top-k", "0", "-o", out_dir]
    for name, array in zip(names, inputs):
        path = os.path.join(out_dir, f"in_{len(args)}.npy")
        np.save(path, array)
        args += ["--input", f"{name}={path}"]
    r = subprocess.run(args + list(extra), capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, f"kiln {' '.join(extra)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    outs = sorted(f for f in os.listdir(out_dir) if f.endswith(".npy") and not f.startswith("in_"))
    return {f[:-4]: np.load(os.path.join(out_dir, f)) for f in outs}


def rel_l2(got, want):
    got = got.astype(np.float64)
    want = want.astype(np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def params():
    for model in load_model_list():
        for precision in ("fp32", "fp16"):
            yield pytest.param(model, precision, id=f"{model.name}-{precision}")


@pytest.mark.parametrize("model,precision", list(params()))
def test_gpu_matches_cpu(model, precision, kiln_bin, model_cache, tmp_path):
    path = exported_model(model_cache, model, "torchscript")
    import onnx

    m = onnx.load(path, load_external_data=False)
    names = [i.name for i in m.graph.input if i.name not in {init.name for init in m.graph.initializer}]
    # fp16's top-1 check needs many rows; the 224px VGG takes fewer to keep the CPU side quick.
    batch = 8 if precision == "fp32" else (25 if model.size >= 224 else 100)
    inputs = export_model.input_maker(model.name, size=model.size)(batch, seed=hash(model.name) % 1000)
    want = run_kiln(kiln_bin, path, inputs, names, str(tmp_path / "cpu"), "--device", "cpu")
    got = run_kiln(kiln_bin, path, inputs, names, str(tmp_path / "gpu"), "--device", "cuda", f"--{precision}")
    assert want.keys() == got.keys()
    for name in want:
        assert got[name].shape == want[name].shape
        assert np.isfinite(got[name]).all(), f"{name}: NaN or inf on the GPU"
        err = rel_l2(got[name], want[name])
        limit = FP32_TOLERANCE if precision == "fp32" else FP16_TOLERANCE
        assert err <= limit, f"output {name}: relative L2 error {err:.3g} > {limit:g}"
        classifier = model.name != "bert_base_2layers"  # BERT's outputs are features, not class scores
        if precision == "fp16" and classifier and want[name].ndim == 2 and want[name].shape[1] >= 2:
            agree = float(np.mean(np.argmax(got[name], 1) == np.argmax(want[name], 1)))
            assert agree >= FP16_TOP1_AGREEMENT, f"output {name}: top-1 agrees on {agree:.1%} of {batch} inputs"
