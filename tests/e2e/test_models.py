"""Models exported from PyTorch run in kiln's CPU engine (`kiln run`) and match ONNX Runtime.

Each model of models.txt is exported twice, with the TorchScript exporter (opset 17) and with the
dynamo exporter (its default opset), both with a dynamic batch; each export runs at batch 1 and
at batch 2. kiln's outputs must be within 1e-4 relative L2 error of ONNX Runtime's (CPU).

When kiln fails, the test fails with kiln's own error message, which names the node and op.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import export_model
from e2e_models import ExportError, exported_model, load_model_list

TOLERANCE = 1e-4  # relative L2 error, kiln vs ONNX Runtime

# Exports that PyTorch itself cannot make (not kiln's failures). strict xfail: when a new torch
# exports one after all, the test reports XPASS as a failure, so this list stays true.
EXPORT_FAILS = {
}


def params():
    for model in load_model_list():
        for exporter in export_model.EXPORTERS:
            marks = []
            if (model.name, exporter) in EXPORT_FAILS:
                marks.append(pytest.mark.xfail(raises=ExportError, strict=True,
                                               reason=EXPORT_FAILS[(model.name, exporter)]))
            for batch in (1, 2):
                yield pytest.param(model, exporter, batch, marks=marks, id=f"{model.name}-{exporter}-batch{batch}")


@pytest.mark.parametrize("model,exporter,batch", list(params()))
def test_model_matches_onnxruntime(model, exporter, batch, model_cache, run_kiln, tmp_path):
    path = exported_model(model_cache, model, exporter)
    make = export_model.input_maker(model.name, size=model.size)
    inputs = make(batch)

    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    input_names = [i.name for i in sess.get_inputs()]
    output_names = [o.name for o in sess.get_outputs()]
    feeds = dict(zip(input_names, inputs))
    expected = sess.run(None, feeds)
    for name, want in zip(output_names, expected):
        # A constant reference output (a zero-initialised head, say) would let any kiln output
        # that is merely the right constant pass: the test would prove nothing.
        assert want.size > 1 and np.ptp(want) > 0, f"degenerate reference: output '{name}' of ONNX Runtime is constant"

    args = ["run", path, "--output-dir", tmp_path / "out"]
    for name, value in feeds.items():
        file = tmp_path / f"input_{len(args)}.npy"
        np.save(file, value)
        args += ["--input", f"{name}={file}"]
    result = run_kiln(*args)
    if result.returncode != 0:
        first = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr.strip()[:300])
        first = first.replace(path + ": ", "")  # the path is in the test's name already
        pytest.fail(f"kiln failed on {model.name} ({exporter} export, batch {batch}): {first}\n\n{result.describe()}",
                    pytrace=False)

    errors = []
    for name, want in zip(output_names, expected):
        file = tmp_path / "out" / f"{name}.npy"
        if not file.exists():
            errors.append(f"output '{name}': kiln wrote no {file.name} (wrote {sorted(os.listdir(tmp_path / 'out'))})")
            continue
        got = np.load(file)
        if got.shape != want.shape:
            errors.append(f"output '{name}': shape {list(got.shape)}, ONNX Runtime gives {list(want.shape)}")
            continue
        if got.dtype != want.dtype:
            errors.append(f"output '{name}': dtype {got.dtype}, ONNX Runtime gives {want.dtype}")
            continue
        if not np.all(np.isfinite(got)):
            errors.append(f"output '{name}': {np.count_nonzero(~np.isfinite(got))} values are NaN or infinite")
            continue
        err = export_model.relative_l2(got, want)
        if not err <= TOLERANCE:
            worst = np.unravel_index(np.argmax(np.abs(got.astype(np.float64) - want)), want.shape)
            errors.append(f"output '{name}': relative L2 error {err:.3e} > {TOLERANCE:g}; worst at "
                          f"{[int(i) for i in worst]}: kiln {got[worst].item()}, ONNX Runtime {want[worst].item()}")
    if errors:
        pytest.fail(f"{model.name} ({exporter} export, batch {batch}): " + "; ".join(errors), pytrace=False)
