"""Automatic GPU/CPU partitioning: a GPU build never fails for want of a GPU layer. Nodes without
one run on the CPU engine inside the GPU engine, the build names them (the command line's log, a
Python warning, `kiln build`'s summary) with what they cost, `kiln inspect` shows the partition,
and --strict (allow_cpu_fallback=False) refuses such a build, naming each node. The partitioned
engine matches the CPU engine, also with several contexts running it at once on threads (each
context has its own staging memory and CPU kernel for those nodes). And Swin-T (torchvision,
exported by `kiln export`: shifted windows, relative position bias) builds on GPU layers alone
and matches the CPU engine. torchvision's detection models run their backbones on the GPU and box
selection on the CPU engine, at 128 x 128 and at their own image sizes, where they match ONNX
Runtime."""
from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from test_gpu_contexts import mismatch, on_threads


def partitioned_model(path: str) -> str:
    """y = Conv(LRN(Conv(x))) + MeanVarianceNormalization(x): LRN and MeanVarianceNormalization
    have no GPU layer (the LRN reads a GPU layer's output, the MVN the engine's input), the convs
    and the Add have. Float32, x 4x8x24x24. (Should either op gain a GPU layer, pick another from
    docs/operators.md's ops without one.)"""
    rng = np.random.default_rng(7)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 16, 3, 3)).astype(np.float32) * 0.2, "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("LRN", ["c1"], ["s"], name="lrn", size=3),
        helper.make_node("Conv", ["s", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("MeanVarianceNormalization", ["x"], ["h"], name="mvn"),
        helper.make_node("Add", ["h", "c2"], ["y"], name="add"),
    ]
    graph = helper.make_graph(nodes, "partitioned", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8, 24, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8, 24, 24])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return partitioned_model(str(tmp_path_factory.mktemp("partition") / "partitioned.onnx"))


def inputs(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((4, 8, 24, 24)).astype(np.float32)


def test_default_build_runs_nodes_without_gpu_layer_on_the_cpu_and_says_so(model):
    with pytest.warns(UserWarning, match=r"2 node\(s\) have no GPU layer and run on the CPU engine") as warned:
        engine = kiln.Builder(device="cuda").build(model)
    said = " ".join(str(w.message) for w in warned)
    assert "lrn (LRN)" in said and "mvn (MeanVarianceNormalization)" in said, said
    on_cpu = {l["name"]: l["tactic"] for l in engine.info()["layers"] if l["cpu_fallback"]}
    assert on_cpu == {"lrn": "cpu-fallback", "mvn": "cpu-fallback"}
    assert any(l["op"] == "Conv" and not l["cpu_fallback"] for l in engine.info()["layers"])
    reference = kiln.Engine.from_onnx(model, kiln.Builder(device="cpu").options)
    for seed in (1, 2):
        x = inputs(seed)
        got, want = engine.run({"x": x})["y"], reference.run({"x": x})["y"]
        assert np.allclose(got, want, rtol=1e-3, atol=1e-3), np.abs(got - want).max()


def test_strict_build_refuses_and_names_each_node(model):
    with pytest.raises(kiln.Error, match=r"2 node\(s\) cannot run on the GPU") as refused:
        kiln.Builder(device="cuda", allow_cpu_fallback=False).build(model)
    assert "lrn (LRN): kiln has no CUDA layer for LRN" in str(refused.value)
    assert "mvn (MeanVarianceNormalization): kiln has no CUDA layer for MeanVarianceNormalization" in str(refused.value)


def test_contexts_on_threads_each_have_their_own_cpu_staging(model):
    """Four contexts of one partitioned engine on four threads, different inputs at the same
    moment: every result equals what one context computes alone (shared staging would mix them)."""
    with pytest.warns(UserWarning):
        engine = kiln.Builder(device="cuda").build(model)
    xs = [inputs(10 + i) for i in range(6)]
    alone = engine.create_context()
    want = [alone.run({"x": x})["y"].copy() for x in xs]
    assert not np.array_equal(want[0], want[1])
    contexts = [engine.create_context() for _ in range(4)]

    def job(context, t, r):
        i = (t + r) % len(xs)  # threads run different inputs at the same moment
        return mismatch(context.run({"x": xs[i]})["y"], want[i])

    errors = on_threads(contexts, 20, job)
    assert not errors, errors[:5]


def test_command_line_names_the_partition_and_strict_refuses(kiln_bin, model, tmp_path):
    engine = str(tmp_path / "partitioned.engine")
    built = subprocess.run([kiln_bin, "build", model, "-o", engine], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    line = next((l for l in built.stderr.splitlines() if "have no GPU layer" in l), "")
    assert "2 node(s) have no GPU layer and run on the CPU engine: " in line, built.stderr
    assert "lrn (LRN)" in line and "mvn (MeanVarianceNormalization)" in line, line
    assert "between the GPU and the host" in built.stderr and "--strict" in built.stderr
    # Per run: the LRN's input and output (4x16x24x24 float32 each) and the MVN's (4x8x24x24).
    assert "copies 432.0 KiB between the GPU and the host" in built.stderr, built.stderr
    assert "2 layer(s) run on the CPU engine" in built.stdout

    shown = subprocess.run([kiln_bin, "inspect", engine], capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    shown_line = next((l for l in shown.stdout.splitlines() if l.startswith("partition: ")), "")
    assert "layer(s) on the GPU, 2 on the CPU engine: " in shown_line, shown.stdout
    assert "lrn (LRN)" in shown_line and "mvn (MeanVarianceNormalization)" in shown_line, shown_line
    as_json = subprocess.run([kiln_bin, "inspect", engine, "--json", "-"], capture_output=True, text=True, timeout=300)
    assert as_json.returncode == 0, as_json.stderr
    partition = json.loads(as_json.stdout)["partition"]
    assert sorted(partition["cpu_layers"]) == ["lrn (LRN)", "mvn (MeanVarianceNormalization)"] and partition["gpu_layers"] >= 2

    ran = subprocess.run([kiln_bin, "run", engine, "--random"], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr

    strict = subprocess.run([kiln_bin, "build", model, "--strict", "-o", str(tmp_path / "strict.engine")], capture_output=True,
                            text=True, timeout=600)
    assert strict.returncode == 1
    assert "lrn (LRN): kiln has no CUDA layer for LRN" in strict.stderr
    assert "mvn (MeanVarianceNormalization): kiln has no CUDA layer for MeanVarianceNormalization" in strict.stderr
    assert not (tmp_path / "strict.engine").exists()


def test_a_cpu_node_that_fails_at_run_time_raises_and_the_next_run_is_clean(tmp_path):
    """MaxUnpool has no GPU layer; its CPU kernel refuses an index outside the unpooled tensor
    when it runs. The partitioned engine raises that error from run() (eager and CUDA graph
    replays alike) instead of returning the poisoned outputs, and a valid run after it answers
    right."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("MaxUnpool", ["r", "at"], ["y"], name="unpool", kernel_shape=[2, 2], strides=[2, 2])]
    graph = helper.make_graph(nodes, "unpool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2, 2]),
                                                helper.make_tensor_value_info("at", TensorProto.INT64, [1, 2, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])])
    path = str(tmp_path / "unpool.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.warns(UserWarning, match=r"unpool \(MaxUnpool\)"):
        engine = kiln.Builder(device="cuda").build(path)
    x = np.random.default_rng(5).standard_normal((1, 2, 2, 2)).astype(np.float32)
    good = np.array([0, 3, 9, 14, 17, 20, 26, 31], dtype=np.int64).reshape(1, 2, 2, 2)
    want = np.zeros(32, dtype=np.float32)
    want[good.ravel()] = np.maximum(x, 0).ravel()
    want = want.reshape(1, 2, 4, 4)
    bad = good.copy()
    bad[0, 1, 1, 1] = 32
    for _ in range(3):
        assert np.array_equal(engine.run({"x": x, "at": good})["y"], want)
        with pytest.raises(kiln.Error, match=r"index 32 is outside the unpooled tensor of 32 elements"):
            engine.run({"x": x, "at": bad})


def test_swin_transformer_runs_on_gpu_layers_alone_and_matches_the_cpu_engine(kiln_bin, model_cache):
    path = os.path.join(model_cache, "swin_t_224.onnx")
    if not os.path.exists(path):
        made = subprocess.run([kiln_bin, "export", "swin_t", "--size", "224", "-o", path], capture_output=True, text=True,
                              timeout=600)
        assert made.returncode == 0, made.stderr
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)  # --strict: every node on a GPU layer
    assert not any(l["cpu_fallback"] for l in gpu.info()["layers"])
    cpu = kiln.Builder(device="cpu").build(path)
    name = gpu.inputs[0].name
    for seed in (0, 1):
        x = np.random.default_rng(seed).standard_normal((1, 3, 224, 224)).astype(np.float32)
        got, want = gpu.run({name: x}), cpu.run({name: x})
        for out, w in want.items():
            err = np.linalg.norm(got[out] - w) / max(np.linalg.norm(w), 1e-30)
            assert err < 1e-4, f"{out}: relative L2 error {err}"


# --- Shapes that depend on the data: the GPU's part, then the CPU engine's -----------------------

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
    from test_control_flow import _export_detection, _matched

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


# --- Detection models at the size they are used at ----------------------------------------------

# torchvision's detection families with their own image sizes: the R-CNNs, RetinaNet and FCOS
# resize an image to 800 pixels on its short side (a 480 x 640 image to 800 x 1066), SSD to 300 x
# 300. Score thresholds at 0 so that random weights leave boxes to select.
FULL_SIZE = {"fasterrcnn_resnet50_fpn": "box_score_thresh", "maskrcnn_resnet50_fpn": "box_score_thresh",
             "retinanet_resnet50_fpn": "score_thresh", "fcos_resnet50_fpn": "score_thresh", "ssd300_vgg16": "score_thresh"}


def _export_full_size(name: str, model_cache: str) -> str:
    path = os.path.join(model_cache, f"{name}_480x640_thresh0.onnx")
    if os.path.exists(path):
        return path
    import torch
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models.detection, name)(weights=None, weights_backbone=None, **{FULL_SIZE[name]: 0.0}).eval()
    torch.onnx.export(model, ([torch.rand(3, 480, 640)],), path + ".tmp", opset_version=17, dynamo=False,
                      input_names=["images"])
    os.replace(path + ".tmp", path)
    return path


@pytest.mark.parametrize("name", list(FULL_SIZE))
def test_detection_models_at_full_size_match_onnxruntime_on_the_gpu_and_cpu_engines(name, model_cache):
    """Each family at its own image size, a 480 x 640 image in: the GPU build (backbone on the GPU,
    box selection and what follows on the CPU engine) and the CPU engine both find ONNX Runtime's
    detections (as sets) and Mask R-CNN's masks."""
    import onnxruntime as ort
    from test_control_flow import _matched

    path = _export_full_size(name, model_cache)
    image = np.random.default_rng(0).random((3, 480, 640)).astype(np.float32)
    quiet = ort.SessionOptions()
    quiet.log_severity_level = 3  # (Mask R-CNN's Loop grows a value past its declared shape: a warning per iteration)
    session = ort.InferenceSession(path, quiet, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"images": image})))
    wb, ws, wl, wm = _detections(want)
    assert len(ws) > 0
    with pytest.warns(UserWarning, match=r"whose output shapes depend on the data, and run on the CPU engine"):
        gpu = kiln.Builder(device="cuda").build(path)
    assert sum(not l["cpu_fallback"] and l["op"] in ("Conv", "FusedConv") for l in gpu.info()["layers"]) >= 10
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
