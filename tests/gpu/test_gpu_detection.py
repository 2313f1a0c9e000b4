"""torchvision's detection models on the GPU engine: a GPU build runs every node up to box
selection (NonZero, NonMaxSuppression, data-dependent Ifs) on the GPU and the rest on the CPU
engine (docs/design/control-flow.md, "GPU builds: a CPU tail"). At 128 x 128 each family matches
the CPU engine, also through an engine file, Faster R-CNN in fp16 and under `kiln bench`; at their
own image sizes (a 480 x 640 image, 800 x 1066 inside; SSD 300 x 300) the GPU build and the CPU
engine both find ONNX Runtime's detections and Mask R-CNN's masks."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

import kiln


def _detections(outputs: dict) -> tuple:
    """(boxes [n, 4], scores [n], labels [n], masks or None) by what each output holds."""
    boxes = next(v for v in outputs.values() if v.ndim == 2)
    scores = next(v for v in outputs.values() if v.ndim == 1 and v.dtype == np.float32)
    labels = next(v for v in outputs.values() if v.dtype == np.int64)
    masks = next((v for v in outputs.values() if v.ndim == 4), None)
    return boxes, scores, labels, masks


@pytest.mark.parametrize("name", ["fasterrcnn_mobilenet_v3_large_320_fpn", "retinanet_resnet50_fpn",
                                  "ssdlite320_mobilenet_v3_large", "maskrcnn_resnet50_fpn", "fcos_resnet50_fpn"])
def test_detection_models_run_their_backbones_on_the_gpu_and_box_selection_on_the_cpu(name, model_cache, tmp_path):
    """torchvision's detection models select boxes with NonMaxSuppression and data-dependent Ifs:
    a GPU build runs every node up to there on the GPU and the rest on the CPU engine, says so,
    keeps the split through an engine file, and its detections are the CPU engine's (as sets:
    near-tied scores of random weights may come in another order)."""
    from test_control_flow import _export_detection, _matched

    path = _export_detection(name, model_cache)
    with pytest.warns(UserWarning, match=r"whose output shapes depend on the data, and run on the CPU engine"):
        gpu = kiln.Builder(device="cuda").build(path)
    info = gpu.info()
    assert info["data_dependent_nodes"], info["data_dependent_nodes"]
    on_gpu = [l for l in info["layers"] if not l["cpu_fallback"]]
    tail = [l for l in info["layers"] if l["tactic"] == "cpu (after data-dependent shapes)"]
    assert tail and sum(l["op"] in ("Conv", "FusedConv") for l in on_gpu) >= 10, (len(on_gpu), len(tail))
    cpu = kiln.Builder(device="cpu").build(path)
    saved = str(tmp_path / "detect.engine")
    gpu.save(saved)
    loaded = kiln.Engine.load(saved)
    assert loaded.info()["data_dependent_nodes"] == info["data_dependent_nodes"]
    context = loaded.create_context()
    for seed in (0, 1):
        image = np.random.default_rng(seed).random((3, 128, 128)).astype(np.float32)
        want = cpu.run({"images": image})
        for got in (gpu.run({"images": image}), context.run({"images": image})):
            assert sorted(got) == sorted(want)
            assert all(got[n].dtype == want[n].dtype and got[n].shape[1:] == want[n].shape[1:] for n in want)
            gb, gs, gl, gm = _detections(got)
            wb, ws, wl, wm = _detections(want)
            assert len(ws) > 0
            assert _matched(wb, ws, wl, gb, gs, gl) >= 0.9 and _matched(gb, gs, gl, wb, ws, wl) >= 0.9, (len(ws), len(gs))
    with pytest.raises(kiln.Error, match=r"enqueue\(\) runs only the GPU's part"):
        context.enqueue(0)
    with pytest.raises(kiln.Error, match=r"known only after a run"):
        context.output_shape(loaded.outputs[0].name)


def test_detection_model_in_fp16_and_under_kiln_bench(kiln_bin, model_cache, tmp_path):
    """An fp16 build of Faster R-CNN: the GPU's part in float16, its detections like the CPU
    engine's in float32; `kiln bench` times Engine::run for such an engine and --strict refuses it."""
    from test_control_flow import _export_detection

    path = _export_detection("fasterrcnn_mobilenet_v3_large_320_fpn", model_cache)
    with pytest.warns(UserWarning):
        gpu = kiln.Builder(device="cuda", precision="fp16").build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    image = np.random.default_rng(3).random((3, 128, 128)).astype(np.float32)
    gb, gs, gl, _ = _detections(gpu.run({"images": image}))
    wb, ws, wl, _ = _detections(cpu.run({"images": image}))
    assert np.isfinite(gb).all() and np.isfinite(gs).all()
    # Random weights score hundreds of boxes alike (ties to 1e-7), so which of them survive box
    # selection is float noise: float16 keeps as many detections, at the same scores and classes.
    assert len(gs) == len(ws) > 0
    assert abs(gs.max() - ws.max()) < 2e-2 * ws.max() and abs(np.median(gs) - np.median(ws)) < 2e-2 * ws.max()
    assert set(gl.tolist()) <= set(range(91)) and np.abs(gb).max() < 4 * 128, (gl, gb)

    result = str(tmp_path / "bench.json")
    bench = subprocess.run([kiln_bin, "bench", path, "--fp16", "--iterations", "20", "--json", result], capture_output=True,
                           text=True, timeout=600)
    assert bench.returncode == 0, bench.stderr
    assert "timing Engine::run by the wall clock" in bench.stderr
    row = json.load(open(result))["results"][0]
    assert row["mode"] == "run" and row["device"] == "cuda" and row["latency_ms"]["median"] > 0
    refused = subprocess.run([kiln_bin, "bench", path, "--throughput"], capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "--throughput, --streams and --profile" in refused.stderr
    strict = subprocess.run([kiln_bin, "build", path, "--strict", "-o", str(tmp_path / "strict.engine")], capture_output=True,
                            text=True, timeout=600)
    assert strict.returncode == 1 and "depends on the data" in strict.stderr, strict.stderr[-2000:]



def _on_gpu_rows(engine) -> list:
    """The ops of the layers of `engine`'s CPU tail that run on the GPU as row stages."""
    return [l["op"] for l in engine.info()["layers"] if l["tactic"].startswith("gpu (rows of") and not l["cpu_fallback"]]


def test_per_region_heads_run_on_the_gpu_unless_the_build_keeps_them_on_the_cpu(kiln_bin, model_cache, tmp_path):
    """Faster R-CNN's box head follows box selection, so it is in the CPU tail; it computes each
    region on its own, so it runs on the GPU after all, up to 128 regions at a time, also in an engine
    file loaded again; gpu_row_stages=False (`--no-gpu-row-stages`) keeps it on the CPU engine.
    Each finds the CPU engine's detections."""
    from test_control_flow import _export_detection, _matched

    path = _export_detection("fasterrcnn_mobilenet_v3_large_320_fpn", model_cache)
    with pytest.warns(UserWarning):
        staged = kiln.Builder(device="cuda").build(path)
    with pytest.warns(UserWarning):
        whole = kiln.Builder(device="cuda", gpu_row_stages=False).build(path)
    assert sum(op in ("Gemm", "FusedGemm") for op in _on_gpu_rows(staged)) >= 4, _on_gpu_rows(staged)
    assert not _on_gpu_rows(whole)
    saved = str(tmp_path / "staged.engine")
    staged.save(saved)
    loaded = kiln.Engine.load(saved)
    assert _on_gpu_rows(loaded) == _on_gpu_rows(staged)
    cpu = kiln.Builder(device="cpu").build(path)
    image = np.random.default_rng(5).random((3, 128, 128)).astype(np.float32)
    wb, ws, wl, _ = _detections(cpu.run({"images": image}))
    assert len(ws) > 0
    for engine in (staged, whole, loaded):
        gb, gs, gl, _ = _detections(engine.run({"images": image}))
        assert _matched(wb, ws, wl, gb, gs, gl) >= 0.9 and _matched(gb, gs, gl, wb, ws, wl) >= 0.9, (len(ws), len(gs))
    kept = subprocess.run([kiln_bin, "build", path, "--device", "cuda", "--no-gpu-row-stages", "-o", str(tmp_path / "whole.engine")],
                          capture_output=True, text=True, timeout=600)
    assert kept.returncode == 0, kept.stderr[-2000:]
    assert "on its own and run on the GPU after all" not in kept.stderr
    assert not _on_gpu_rows(kiln.Engine.load(str(tmp_path / "whole.engine")))


# --- Detection models at the size they are used at ----------------------------------------------

# torchvision's detection families with their own image sizes: the R-CNNs, RetinaNet and FCOS
# resize an image to 800 pixels on its short side (a 480 x 640 image to 800 x 1066), SSD to 300 x
# 300. Score thresholds at 0 so that random weights leave boxes to select.
FULL_SIZE = {"fasterrcnn_resnet50_fpn": "box_score_thresh", "maskrcnn_resnet50_fpn": "box_score_thresh",
             "retinanet_resnet50_fpn": "score_thresh", "fcos_resnet50_fpn": "score_thresh", "ssd300_vgg16": "score_thresh"}


@pytest.mark.parametrize("name", list(FULL_SIZE))
def test_detection_models_at_full_size_match_onnxruntime_on_the_gpu_and_cpu_engines(name, model_cache):
    """Each family at its own image size, a 480 x 640 image in: the GPU build (backbone on the GPU,
    box selection and what follows on the CPU engine, the per-region heads back on the GPU) and
    the CPU engine both find ONNX Runtime's detections (as sets) and Mask R-CNN's masks."""
    import onnxruntime as ort
    from test_control_flow import _export_detection, _matched

    path = _export_detection(name, model_cache, {FULL_SIZE[name]: 0.0}, full_size=True)
    image = np.random.default_rng(0).random((3, 480, 640)).astype(np.float32)
    quiet = ort.SessionOptions()
    quiet.log_severity_level = 3  # (Mask R-CNN's Loop grows a value past its declared shape: a warning per iteration)
    session = ort.InferenceSession(path, quiet, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"images": image})))
    wb, ws, wl, wm = _detections(want)
    assert len(ws) > 0
    with pytest.warns(UserWarning, match=r"whose output shapes depend on the data, and run on the CPU engine"):
        gpu = kiln.Builder(device="cuda").build(path)
    layers = gpu.info()["layers"]
    assert sum(not l["cpu_fallback"] and l["op"] in ("Conv", "FusedConv") for l in layers) >= 10
    # The per-region heads after box selection run on the GPU as row stages: the R-CNNs' box
    # heads (two hidden layers, class scores, box deltas), Mask R-CNN's mask head (four
    # convolutions, the upsampling ConvTranspose, the logits).
    staged = [l["op"] for l in layers if l["tactic"].startswith("gpu (rows of") and not l["cpu_fallback"]]
    if "rcnn" in name:
        assert sum(op in ("Gemm", "FusedGemm") for op in staged) >= 4, staged
    if name.startswith("maskrcnn"):
        assert sum(op in ("Conv", "FusedConv") for op in staged) >= 5 and "ConvTranspose" in staged, staged
    cpu = kiln.Builder(device="cpu").build(path)
    for engine in ("gpu", "cpu"):
        got = (gpu if engine == "gpu" else cpu).run({"images": image})
        assert sorted(got) == sorted(want), engine
        assert all(got[n].dtype == want[n].dtype and got[n].shape[1:] == want[n].shape[1:] for n in want), engine
        gb, gs, gl, gm = _detections(got)
        found, kept = _matched(wb, ws, wl, gb, gs, gl), _matched(gb, gs, gl, wb, ws, wl)
        assert found >= 0.9 and kept >= 0.9, (engine, found, kept, len(ws), len(gs))
        if wm is not None:
            # Where both list the same detection at the same place, its mask is the same.
            same = [np.nonzero((wl == label) & (np.abs(ws - s) < 1e-4) & (np.abs(wb - b).max(axis=1) < 0.05))[0]
                    for b, s, label in zip(gb, gs, gl)]
            pairs = [(i, m[0]) for i, m in enumerate(same) if len(m)]
            assert len(pairs) >= 0.9 * len(gs), (engine, len(pairs), len(gs))
            diff = np.stack([np.abs(gm[i] - wm[j]) for i, j in pairs])
            assert diff.max() < 0.02 and diff.mean() < 1e-4, (engine, diff.max(), diff.mean())
