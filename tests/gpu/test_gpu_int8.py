"""INT8 engines on the GPU (kiln::QConv on kiln's INT8 kernels and cuDNN's INT8 engines) against
the CPU engine's exact integer reference, with the same calibration cache on both sides; the GPU's
calibration histograms against the CPU's; FP8 engines against the CPU's float reference.

Both engines quantize the same convolutions with the same scales and sum int8 products exactly;
kiln's kernels compute the epilogue as the CPU does (bit for bit: the *_exactly tests); cuDNN's
engines differ in the float epilogue's rounding (the GPU folds the scales into fewer multiplies
and rounds with cuDNN's conversion), and the GPU's float layers store float16, which moves some
int8 values by one step. On one block
(test_int8_block_matches_cpu) that is a relative L2 difference of float16's order. Through a
whole random-weight ResNet, which amplifies any rounding (float16 weights alone move
ResNet-50's output by 5%), those steps add up to a difference of the size of INT8's own
error; there the test holds the GPU's INT8 error against float32 to the CPU reference's INT8
error (at most 1.25x).
"""
from __future__ import annotations

import os
import re
import subprocess

import numpy as np
import pytest

import export_model
from e2e_models import E2eModel, exported_model
from test_gpu_models import rel_l2, run_kiln

BLOCK_TOLERANCE = 1e-2
# INT8 against float32 on random-weight networks, as the CPU reference measured it: ResNet-18 9%,
# ResNet-50 18%, RegNet-Y-400MF 40% (its squeeze-excite gates multiply every error; on the H100
# the GPU's was 39%). The GPU is held to the CPU's error below.
INT8_VS_FP32 = {"default": 0.25, "regnet_y_400mf": 0.5}
GPU_ERROR_FACTOR = 1.25


def block_model(path):
    """conv3x3+relu -> conv1x1 + residual + relu: y1 stays int8 between the two INT8 convs
    (read as X and as Z), y2 is the float output."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w1 = (rng.standard_normal((32, 16, 3, 3)) * 0.15).astype(np.float32)
    b1 = (rng.standard_normal(32) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((32, 32, 1, 1)) * 0.2).astype(np.float32)
    b2 = (rng.standard_normal(32) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["y1"], name="relu1"),
             helper.make_node("Conv", ["y1", "w2", "b2"], ["c2"], name="conv2"),
             helper.make_node("Add", ["c2", "y1"], ["s2"], name="add2"),
             helper.make_node("Relu", ["s2"], ["y2"], name="relu2")]
    graph = helper.make_graph(nodes, "int8_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16, 12, 12])],
                              [helper.make_tensor_value_info("y2", TensorProto.FLOAT, [8, 32, 12, 12])],
                              [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_int8_block_matches_cpu(kiln_bin, tmp_path):
    path = str(tmp_path / "block.onnx")
    block_model(path)
    rng = np.random.default_rng(4)
    calib = str(tmp_path / "calib.npy")
    np.save(calib, rng.standard_normal((32, 16, 12, 12)).astype(np.float32))
    x = [rng.standard_normal((8, 16, 12, 12)).astype(np.float32)]
    common = ["--int8", "--int8-all", "--calib", calib, "--calib-batch", "8", "--calib-cache", str(tmp_path / "block.calib")]
    cpu = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "cpu"), "--device", "cpu", *common)["y2"]
    gpu = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "gpu"), "--device", "cuda", "-v", *common)["y2"]
    fp32 = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "fp32"), "--device", "cpu")["y2"]
    err, int8_err = rel_l2(gpu, cpu), rel_l2(cpu, fp32)
    print(f"block: GPU int8 vs CPU int8 {err:.2e}; CPU int8 vs fp32 {int8_err:.2e}")
    assert 0 < int8_err < 0.05  # it was quantized, and sensibly
    assert err <= BLOCK_TOLERANCE


@pytest.mark.parametrize("name,size", [("resnet18", 64), ("resnet50", 224), ("regnet_y_400mf", 64)])
def test_int8_gpu_matches_cpu_reference(name, size, kiln_bin, model_cache, tmp_path):
    model = E2eModel(name, size)
    path = exported_model(model_cache, model, "torchscript")
    make = export_model.input_maker(name, size=size)
    calib = str(tmp_path / "calib.npy")
    np.save(calib, make(16, seed=21)[0])
    cache = str(tmp_path / f"{name}.calib")
    batch = 32 if size < 224 else 8
    x = make(batch, seed=22)
    common = ["--int8", "--int8-all", "--calib", calib, "--calib-cache", cache]
    cpu = run_kiln(kiln_bin, path, x, ["input"], str(tmp_path / "cpu"), "--device", "cpu", *common)
    gpu = run_kiln(kiln_bin, path, x, ["input"], str(tmp_path / "gpu"), "--device", "cuda", *common)
    fp32 = run_kiln(kiln_bin, path, x, ["input"], str(tmp_path / "fp32"), "--device", "cpu")
    for out in cpu:
        err = rel_l2(gpu[out], cpu[out])
        to_fp32 = rel_l2(gpu[out], fp32[out])
        agree = float(np.mean(gpu[out].argmax(1) == cpu[out].argmax(1)))  # printed; random weights: near-ties
        print(f"{name} {out}: GPU int8 vs CPU int8 {err:.4f}, GPU int8 vs fp32 {to_fp32:.4f}, "
              f"CPU int8 vs fp32 {rel_l2(cpu[out], fp32[out]):.4f}, top-1 agreement {agree:.3f}")
        assert np.isfinite(gpu[out]).all()
        assert to_fp32 <= INT8_VS_FP32.get(name, INT8_VS_FP32["default"])
        assert to_fp32 <= GPU_ERROR_FACTOR * rel_l2(cpu[out], fp32[out])


def kernel_chain_model(path):
    """INT8 layers that exercise kiln's own kernel (cuda/kernels/int8_conv.cu) in every form it has:
    3x3 over 48 channels (16-byte chunks that straddle taps; 675 output pixels, not a multiple
    of the 128-row tile), 1x1 with an int8 residual, 1x1 stride 2 to 128 channels, a dilated
    3x3 with LeakyRelu writing the float16 output."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    weights = {
        "w1": rng.standard_normal((64, 48, 3, 3)) * 0.08, "b1": rng.standard_normal(64) * 0.1,
        "w2": rng.standard_normal((64, 64, 1, 1)) * 0.15, "b2": rng.standard_normal(64) * 0.1,
        "w3": rng.standard_normal((128, 64, 1, 1)) * 0.15, "b3": rng.standard_normal(128) * 0.1,
        "w4": rng.standard_normal((128, 128, 3, 3)) * 0.04, "b4": rng.standard_normal(128) * 0.1,
    }
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["y1"], name="relu1"),
             helper.make_node("Conv", ["y1", "w2", "b2"], ["c2"], name="conv2"),
             helper.make_node("Add", ["c2", "y1"], ["s2"], name="add2"),
             helper.make_node("Relu", ["s2"], ["y2"], name="relu2"),
             helper.make_node("Conv", ["y2", "w3", "b3"], ["y3"], name="conv3", strides=[2, 2]),
             helper.make_node("Conv", ["y3", "w4", "b4"], ["c4"], name="conv4", pads=[2, 2, 2, 2], dilations=[2, 2]),
             helper.make_node("LeakyRelu", ["c4"], ["y4"], name="leaky4", alpha=0.1)]
    graph = helper.make_graph(nodes, "int8_kernel_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 48, 15, 15])],
                              [helper.make_tensor_value_info("y4", TensorProto.FLOAT, [3, 128, 8, 8])],
                              [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def exact_input_cache(kiln_bin, path, shape, tmp_path, rng):
    """A calibration cache for the model at `path` (input "x" of `shape`, calibrated on the CPU)
    with the input's scale set to 1/16, and an input made of sixteenths: exact in float16 and
    quantized to exact integers on both engines, so their int8 tensors can be compared bit for
    bit. Returns (cache path, [input])."""
    calib = str(tmp_path / "calib.npy")
    np.save(calib, rng.standard_normal((4 * shape[0], *shape[1:])).astype(np.float32))
    cache = str(tmp_path / "exact.calib")
    run_kiln(kiln_bin, path, [np.zeros(shape, np.float32)], ["x"], str(tmp_path / "calibrate"), "--device", "cpu",
             "--int8", "--calib", calib, "--calib-batch", str(shape[0]), "--calib-cache", cache)
    lines = [("x: 0.0625" if line.startswith("x: ") else line) for line in open(cache).read().splitlines()]
    assert "x: 0.0625" in lines
    open(cache, "w").write("\n".join(lines) + "\n")
    return cache, [(rng.integers(-100, 101, shape) / 16).astype(np.float32)]


def check_exact_against_cpu(kiln_bin, path, shape, tmp_path, seed, out, tactic, layers):
    """Builds the model at `path` (input "x" of `shape`, an exact input: exact_input_cache) in
    INT8 for the CPU and the GPU and checks that the GPU's float16 output `out` is the CPU's
    float32 one to within float16's rounding (the int8 tensors before it bit for bit), and that
    the GPU build runs `layers` layers on kiln's `tactic`. Returns (cpu output, gpu output,
    the cache, the input, the build log)."""
    cache, x = exact_input_cache(kiln_bin, path, shape, tmp_path, np.random.default_rng(seed))
    common = ["--int8", "--int8-all", "--calib-cache", cache]
    cpu = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "cpu"), "--device", "cpu", *common)[out]
    gpu = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "gpu"), "--device", "cuda", *common)[out]
    fp16_rounding = np.abs(cpu) * 2.0**-11 + 2.0**-24
    off = np.abs(gpu.astype(np.float64) - cpu) > fp16_rounding
    print(f"{tactic}: {int(off.sum())} of {off.size} outputs beyond float16 rounding of the CPU's")
    assert np.abs(cpu).max() > 0.1  # not a degenerate all-zero output
    assert not off.any()
    build = subprocess.run([kiln_bin, "build", path, *common, "-v", "-o", str(tmp_path / "exact.engine")],
                           capture_output=True, text=True, timeout=300)
    log = build.stdout + build.stderr
    assert build.returncode == 0, log
    assert log.count(tactic) == layers, log
    return cpu, gpu, cache, x, log


def test_int8_kernel_matches_cpu_exactly(kiln_bin, tmp_path, monkeypatch):
    """kiln's INT8 kernel computes the CPU reference's epilogue (fma, division, ties to even):
    with an input that float16 holds exactly and quantizes to whole steps, every int8 tensor
    matches the CPU engine's bit for bit, so the float16 output differs from the CPU's float32
    only by float16's rounding. cuDNN's engines (scales folded differently) are held to the
    block tolerance on the same model."""
    path = str(tmp_path / "chain.onnx")
    kernel_chain_model(path)
    cache, x = exact_input_cache(kiln_bin, path, (3, 48, 15, 15), tmp_path, np.random.default_rng(8))
    common = ["--int8", "--int8-all", "--calib-cache", cache]
    cpu = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "cpu"), "--device", "cpu", *common)["y4"]
    monkeypatch.setenv("KILN_INT8_CONV_TACTIC", "kernel")
    kernel = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "kernel"), "--device", "cuda", *common)["y4"]
    monkeypatch.setenv("KILN_INT8_CONV_TACTIC", "cudnn")
    cudnn = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "cudnn"), "--device", "cuda", *common)["y4"]
    fp16_rounding = np.abs(cpu) * 2.0**-11 + 2.0**-24
    off = np.abs(kernel.astype(np.float64) - cpu) > fp16_rounding
    print(f"kernel: {int(off.sum())} of {off.size} outputs beyond float16 rounding of the CPU's; "
          f"kernel vs CPU {rel_l2(kernel, cpu):.2e}, cuDNN vs CPU {rel_l2(cudnn, cpu):.2e}")
    assert np.abs(cpu).max() > 0.1  # not a degenerate all-zero output
    assert not off.any()
    assert rel_l2(cudnn, cpu) <= BLOCK_TOLERANCE


def split_k_model(path):
    """Layers of few output tiles and long K, as ResNet-50's layer4 has at batch 1, where kiln's
    implicit GEMM splits K over a cluster of blocks: 3x3 over 256 channels with Relu (int8 out),
    3x3 over 128 with an int8 residual and Relu, 3x3 with LeakyRelu writing float16."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(27)
    weights = {"w1": rng.standard_normal((128, 256, 3, 3)) * 0.02, "b1": rng.standard_normal(128) * 0.1,
               "w2": rng.standard_normal((128, 128, 3, 3)) * 0.03, "b2": rng.standard_normal(128) * 0.1,
               "w3": rng.standard_normal((64, 128, 3, 3)) * 0.03, "b3": rng.standard_normal(64) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["y1"], name="relu1"),
             helper.make_node("Conv", ["y1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "y1"], ["s2"], name="add2"),
             helper.make_node("Relu", ["s2"], ["y2"], name="relu2"),
             helper.make_node("Conv", ["y2", "w3", "b3"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
             helper.make_node("LeakyRelu", ["c3"], ["y3"], name="leaky3", alpha=0.1)]
    graph = helper.make_graph(nodes, "int8_split_k", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 256, 7, 7])],
                              [helper.make_tensor_value_info("y3", TensorProto.FLOAT, [2, 64, 7, 7])],
                              [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("splits", [2, 4, 8])
def test_int8_split_k_matches_cpu_exactly(splits, kiln_bin, tmp_path, monkeypatch):
    """kiln's implicit GEMM with K split over a cluster of `splits` blocks (their int32 sums added
    through distributed shared memory) gives the CPU reference's integers bit for bit, in every
    epilogue form, and runs every layer of the model."""
    path = str(tmp_path / "split_k.onnx")
    split_k_model(path)
    monkeypatch.setenv("KILN_INT8_CONV_TACTIC", "kernel")
    monkeypatch.setenv("KILN_INT8_K_SPLITS", str(splits))
    check_exact_against_cpu(kiln_bin, path, (2, 256, 7, 7), tmp_path, 29, "y3", f"kernel:int8 implicit-gemm:64/k{splits}", 3)


def fc_model(path):
    """A classifier's last layer at batch 1: 2048 -> 1000 features (run as 1008 channels, so
    the small-M kernel's last tile of 64 is partial)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(41)
    weights = {"w": rng.standard_normal((1000, 2048)) * 0.02, "b": rng.standard_normal(1000) * 0.1}
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "int8_fc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2048])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1000])],
                              [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("pdl", [False, True], ids=["launch", "pdl"])
@pytest.mark.parametrize("model,tactic,layers", [("chain", "small-m:64", 4), ("split_k", "small-m:64", 3),
                                                  ("split_k", "small-m:64/k2", 3), ("split_k", "small-m:64/k4", 3),
                                                  ("split_k", "small-m:64/k8", 1), ("fc", "small-m:64/k8", 1)])
def test_int8_small_m_matches_cpu_exactly(model, tactic, layers, pdl, kiln_bin, tmp_path, monkeypatch):
    """kiln's small-M kernel (256 bytes of K per stage; K split over a cluster, each block
    finishing its share of the tile with the others' int32 sums) gives the CPU reference's
    integers bit for bit: on the chain model (48 channels, so chunks of a stage straddle taps;
    675 pixels, not a multiple of 64; stride 2; dilation; int8 residual; float16 output), on
    the split-K model (long K; only its first layer has the 9 stages that 8 splits need) and on
    an FC of 1000 features (a partial last tile); launched plainly (KILN_PDL=0) and with
    programmatic dependent launch (the default: each layer starts before the one before it ends)."""
    path = str(tmp_path / f"{model}.onnx")
    {"chain": kernel_chain_model, "split_k": split_k_model, "fc": fc_model}[model](path)
    shape = {"chain": (3, 48, 15, 15), "split_k": (2, 256, 7, 7), "fc": (1, 2048)}[model]
    out = {"chain": "y4", "split_k": "y3", "fc": "y"}[model]
    monkeypatch.setenv("KILN_INT8_CONV_TACTIC", f"kernel:{tactic}")
    monkeypatch.setenv("KILN_PDL", "1" if pdl else "0")
    check_exact_against_cpu(kiln_bin, path, shape, tmp_path, 31, out, f"kernel:int8 {tactic}\n", layers)


def test_int8_stream_kernel_with_pdl_matches_cpu_exactly(kiln_bin, tmp_path, monkeypatch):
    """The stream kernel launched with programmatic dependent launch (the default) waits for the
    layer before it: the chain model's two 1x1 layers on it, bit for bit against the CPU."""
    path = str(tmp_path / "chain.onnx")
    kernel_chain_model(path)
    monkeypatch.setenv("KILN_INT8_CONV_TACTIC", "kernel:stream1x1:64")
    monkeypatch.setenv("KILN_PDL", "1")
    check_exact_against_cpu(kiln_bin, path, (3, 48, 15, 15), tmp_path, 37, "y4", "kernel:int8 stream1x1:64\n", 2)


def depthwise_chain_model(path):
    """Depthwise INT8 layers (cuda/kernels/int8_depthwise.cu) in the forms MobileNets and EfficientNets
    use and a few more: 3x3 with Relu, a dilated 3x3 with an int8 residual, a 5x5 stride 2 with
    LeakyRelu writing the float16 output; 32 channels (two 16-channel groups per pixel)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(17)
    weights = {"w1": rng.standard_normal((32, 1, 3, 3)) * 0.3, "b1": rng.standard_normal(32) * 0.1,
               "w2": rng.standard_normal((32, 1, 3, 3)) * 0.3, "b2": rng.standard_normal(32) * 0.1,
               "w3": rng.standard_normal((32, 1, 5, 5)) * 0.15, "b3": rng.standard_normal(32) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="dw1", group=32, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["y1"], name="relu1"),
             helper.make_node("Conv", ["y1", "w2", "b2"], ["c2"], name="dw2", group=32, pads=[2, 2, 2, 2], dilations=[2, 2]),
             helper.make_node("Add", ["c2", "y1"], ["s2"], name="add2"),
             helper.make_node("Relu", ["s2"], ["y2"], name="relu2"),
             helper.make_node("Conv", ["y2", "w3", "b3"], ["c3"], name="dw3", group=32, pads=[2, 2, 2, 2], strides=[2, 2]),
             helper.make_node("LeakyRelu", ["c3"], ["y3"], name="leaky3", alpha=0.1)]
    graph = helper.make_graph(nodes, "int8_depthwise_chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 32, 15, 15])],
                              [helper.make_tensor_value_info("y3", TensorProto.FLOAT, [3, 32, 8, 8])],
                              [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_int8_depthwise_matches_cpu_exactly(kiln_bin, tmp_path):
    """The depthwise kernel gives the CPU reference's integers bit for bit (as
    test_int8_kernel_matches_cpu_exactly checks kiln's dense kernels), and runs every layer."""
    path = str(tmp_path / "depthwise.onnx")
    depthwise_chain_model(path)
    _, gpu, _, x, _ = check_exact_against_cpu(kiln_bin, path, (3, 32, 15, 15), tmp_path, 18, "y3", "kernel:int8 depthwise", 3)
    fp16 = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "fp16"), "--device", "cuda", "--fp16")["y3"]
    print(f"depthwise: INT8 vs fp16 engine {rel_l2(gpu, fp16):.2e}")
    assert rel_l2(gpu, fp16) > 1e-3  # it did run in INT8: the float engine's output is not the integer one


def hard_activations_model(path):
    """MobileNet-V3's activations in INT8 layers: 3x3 with HardSwish (int8 out), depthwise 3x3 with
    HardSwish, 1x1 with HardSigmoid (alpha 0.2, beta 0.5) writing the float16 output. cuDNN's
    pointwise ops lack both, so kiln's kernels run them."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(41)
    weights = {"w1": rng.standard_normal((64, 48, 3, 3)) * 0.08, "b1": rng.standard_normal(64) * 0.1,
               "w2": rng.standard_normal((64, 1, 3, 3)) * 0.3, "b2": rng.standard_normal(64) * 0.1,
               "w3": rng.standard_normal((64, 64, 1, 1)) * 0.15, "b3": rng.standard_normal(64) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c1"], ["y1"], name="hswish1"),
             helper.make_node("Conv", ["y1", "w2", "b2"], ["c2"], name="dw2", group=64, pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c2"], ["y2"], name="hswish2"),
             helper.make_node("Conv", ["y2", "w3", "b3"], ["c3"], name="conv3"),
             helper.make_node("HardSigmoid", ["c3"], ["y3"], name="hsigmoid3", alpha=0.2, beta=0.5)]
    graph = helper.make_graph(nodes, "int8_hard_activations",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 48, 15, 15])],
                              [helper.make_tensor_value_info("y3", TensorProto.FLOAT, [3, 64, 15, 15])],
                              [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_int8_hard_activations_run_on_kiln_kernels(kiln_bin, tmp_path, monkeypatch):
    """HardSwish and HardSigmoid layers are INT8 on the GPU (kiln's kernels apply any activation;
    HardSigmoid's product rounded on its own, as the CPU computes it): the int8 tensors match the
    CPU engine's bit for bit and all three layers run on kiln's kernels."""
    path = str(tmp_path / "hard.onnx")
    hard_activations_model(path)
    monkeypatch.setenv("KILN_INT8_CONV_TACTIC", "kernel")
    _, gpu, _, x, _ = check_exact_against_cpu(kiln_bin, path, (3, 48, 15, 15), tmp_path, 43, "y3", "kernel:int8 ", 3)
    fp16 = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "fp16"), "--device", "cuda", "--fp16")["y3"]
    print(f"hard activations: INT8 vs fp16 engine {rel_l2(gpu, fp16):.2e}")
    assert rel_l2(gpu, fp16) > 1e-3  # it did run in INT8


def stem_model(path, kind):
    """The stem kernel (cuda/kernels/int8_stem.cu): "resnet" is ResNet's stem (3 channels, 7x7 stride 2,
    Relu, 64 outputs) then a MaxPool on int8 and a 3x3 block with the pool as residual; "gray" a
    one-channel 3x3 stem to 16 outputs with LeakyRelu writing float16 (the image sizes leave
    partial 8 x 16 output tiles)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(23)
    if kind == "resnet":
        shape, out = [3, 3, 37, 45], [3, 64, 10, 12]
        weights = {"w1": rng.standard_normal((64, 3, 7, 7)) * 0.08, "b1": rng.standard_normal(64) * 0.1,
                   "w2": rng.standard_normal((64, 64, 3, 3)) * 0.03, "b2": rng.standard_normal(64) * 0.1}
        nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="stem", pads=[3, 3, 3, 3], strides=[2, 2]),
                 helper.make_node("Relu", ["c1"], ["y1"], name="relu1"),
                 helper.make_node("MaxPool", ["y1"], ["p1"], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
                 helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
                 helper.make_node("Add", ["c2", "p1"], ["s2"], name="add2"),
                 helper.make_node("Relu", ["s2"], ["y"], name="relu2")]
    else:
        shape, out = [2, 1, 28, 27], [2, 16, 28, 27]
        weights = {"w1": rng.standard_normal((16, 1, 3, 3)) * 0.3, "b1": rng.standard_normal(16) * 0.1}
        nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="stem", pads=[1, 1, 1, 1]),
                 helper.make_node("LeakyRelu", ["c1"], ["y"], name="leaky1", alpha=0.1)]
    graph = helper.make_graph(nodes, f"int8_stem_{kind}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
                              [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return tuple(shape)


@pytest.mark.parametrize("kind", ["resnet", "gray"])
def test_int8_stem_matches_cpu_exactly(kind, kiln_bin, tmp_path):
    """The stem kernel (and the int8 MaxPool after ResNet's stem) gives the CPU reference's
    integers bit for bit."""
    path = str(tmp_path / f"stem_{kind}.onnx")
    shape = stem_model(path, kind)
    log = check_exact_against_cpu(kiln_bin, path, shape, tmp_path, 24, "y", "kernel:int8 stem", 1)[4]
    if kind == "resnet":
        assert "1 through MaxPools" in log, log


def grouped_chain_model(path):
    """Grouped INT8 layers (cuda/kernels/int8_depthwise.cu's grouped kernel) of every width it takes but
    64: groups of 4 with Relu, of 8 at stride 2, of 16 dilated, of 32 with LeakyRelu writing
    the float16 output; 64 channels."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(27)
    weights, nodes, x = {}, [], "x"
    for i, (width, extra) in enumerate([(4, {"pads": [1, 1, 1, 1]}), (8, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
                                        (16, {"pads": [2, 2, 2, 2], "dilations": [2, 2]}), (32, {"pads": [1, 1, 1, 1]})]):
        weights[f"w{i}"] = rng.standard_normal((64, width, 3, 3)) * (0.6 / np.sqrt(9 * width))
        weights[f"b{i}"] = rng.standard_normal(64) * 0.1
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], name=f"grouped{width}", group=64 // width, **extra))
        act = helper.make_node("LeakyRelu", [f"c{i}"], ["y"], alpha=0.1) if width == 32 else helper.make_node("Relu", [f"c{i}"], [f"r{i}"])
        nodes.append(act)
        x = f"r{i}"
    graph = helper.make_graph(nodes, "int8_grouped_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64, 15, 17])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64, 8, 9])],
                              [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_int8_grouped_matches_cpu_exactly(kiln_bin, tmp_path):
    """The grouped kernel gives the CPU reference's integers bit for bit, on every layer."""
    path = str(tmp_path / "grouped.onnx")
    grouped_chain_model(path)
    check_exact_against_cpu(kiln_bin, path, (2, 64, 15, 17), tmp_path, 28, "y", "kernel:int8 grouped", 4)


def mlp_model(path, exact):
    """Matrix products, which the INT8 pass runs as 1x1 convolutions (gemm_as_conv.h).
    exact: one Gemm (bias, Relu) from the input, for the bit-for-bit check; otherwise
    Gemm -> Gemm -> MatMul over a 3-D activation."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(12)
    inits = {"w1": rng.standard_normal((128, 64)) * 0.1, "b1": rng.standard_normal(128) * 0.1,
             "w2": rng.standard_normal((64, 128)) * 0.1, "b2": rng.standard_normal(64) * 0.1,
             "w3": rng.standard_normal((64, 64)) * 0.1, "shape": np.array([4, 8, 64])}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["g1"], name="fc1", transB=1),
             helper.make_node("Relu", ["g1"], ["h1"], name="relu1")]
    out, out_shape = "h1", [32, 128]
    if not exact:
        nodes += [helper.make_node("Gemm", ["h1", "w2", "b2"], ["h2"], name="fc2", transB=1),
                  helper.make_node("Reshape", ["h2", "shape"], ["h3"], name="to3d"),
                  helper.make_node("MatMul", ["h3", "w3"], ["y"], name="fc3")]
        out, out_shape = "y", [4, 8, 64]
    else:
        del inits["w2"], inits["b2"], inits["w3"], inits["shape"]
    graph = helper.make_graph(nodes, "int8_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(a.astype(np.int64 if n == "shape" else np.float32), n) for n, a in inits.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return out


@pytest.mark.parametrize("exact", [True, False], ids=["one-gemm-exact", "gemm-gemm-matmul"])
def test_int8_matrix_products_match_cpu(exact, kiln_bin, tmp_path, monkeypatch):
    path = str(tmp_path / "mlp.onnx")
    out = mlp_model(path, exact)
    rng = np.random.default_rng(13)
    calib = str(tmp_path / "calib.npy")
    np.save(calib, rng.standard_normal((128, 64)).astype(np.float32))
    cache = str(tmp_path / "mlp.calib")
    run_kiln(kiln_bin, path, [np.zeros((32, 64), np.float32)], ["x"], str(tmp_path / "calibrate"), "--device", "cpu",
             "--int8", "--calib", calib, "--calib-batch", "32", "--calib-cache", cache)
    if exact:  # as in test_int8_kernel_matches_cpu_exactly: inputs float16 holds, quantized to whole steps
        lines = [("x: 0.0625" if line.startswith("x: ") else line) for line in open(cache).read().splitlines()]
        open(cache, "w").write("\n".join(lines) + "\n")
        x = [(rng.integers(-100, 101, (32, 64)) / 16).astype(np.float32)]
    else:  # inputs like the calibration data
        x = [rng.standard_normal((32, 64)).astype(np.float32)]
    common = ["--int8", "--int8-all", "--calib-cache", cache, "-v"]
    cpu = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "cpu"), "--device", "cpu", *common)[out]
    fp32 = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "fp32"), "--device", "cpu")[out]
    monkeypatch.setenv("KILN_INT8_CONV_TACTIC", "kernel")
    kernel = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "kernel"), "--device", "cuda", *common)[out]
    monkeypatch.delenv("KILN_INT8_CONV_TACTIC")
    chosen = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "chosen"), "--device", "cuda", *common)[out]
    print(f"{out}: kernel vs CPU {rel_l2(kernel, cpu):.2e}, chosen tactic vs CPU {rel_l2(chosen, cpu):.2e}, "
          f"CPU int8 vs fp32 {rel_l2(cpu, fp32):.2e}")
    assert 0 < rel_l2(cpu, fp32) < 0.05  # quantized, and sensibly
    assert rel_l2(chosen, cpu) <= BLOCK_TOLERANCE
    if exact:
        assert not (np.abs(kernel.astype(np.float64) - cpu) > np.abs(cpu) * 2.0**-11 + 2.0**-24).any()
    else:
        assert rel_l2(kernel, cpu) <= BLOCK_TOLERANCE


def cache_scales(path) -> dict[str, float]:
    """{tensor: scale} of a kiln calibration cache (its first four lines are the header)."""
    return {k: float(v) for k, v in (line.split(": ") for line in open(path).read().splitlines()[4:])}


@pytest.mark.parametrize("algo", ["entropy", "percentile", "minmax"])
def test_gpu_calibration_histograms_match_cpu(algo, kiln_bin, tmp_path):
    """Calibration on the GPU counts its histograms on the device (calibration/abs_histogram.h). On a
    model the GPU computes exactly (ReLU, a MaxPool, an Add: no rounding), its histograms are the
    CPU's bin for bin, so the two caches hold the same scales. The batches grow by 4x, so each
    histogram's range doubles (and merges bins) along the way; half of the ReLU's values are 0."""
    import onnx
    from onnx import TensorProto, helper

    path = str(tmp_path / "exact.onnx")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["x"], ["p"], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["r", "p"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "exact", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16, 20, 20])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16, 20, 20])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    rng = np.random.default_rng(31)
    data = np.concatenate([rng.standard_normal((4, 16, 20, 20)) * 4.0**i for i in range(4)]).astype(np.float32)
    calib = str(tmp_path / "calib.npy")
    np.save(calib, data)
    scales = {}
    for device in ("cpu", "cuda"):
        cache = str(tmp_path / f"{device}.calib")
        r = subprocess.run([kiln_bin, "calibrate", path, "--calib", calib, "--batch", "4", "--calib-algo", algo,
                            "--device", device, "-o", cache], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        scales[device] = cache_scales(cache)
    print(algo, scales["cuda"])
    assert len(scales["cuda"]) >= 3  # x, the pool, the sum (the ReLU may be fused into the Add)
    assert scales["cuda"] == scales["cpu"]


@pytest.mark.parametrize("name,size", [("block", 12), ("resnet50", 224)])
def test_fp8_gpu_matches_cpu_reference(name, size, kiln_bin, model_cache, tmp_path):
    """--fp8: cuDNN's FP8 (E4M3) engines against the CPU engine's float reference of the same
    graph and scales. Float sums in another order round some E4M3 values to the neighbouring
    step, so the two agree to E4M3's rounding (a block) or to FP8's own error against float32
    (a whole random-weight ResNet), not bit for bit; the build says the layers run on FP8 graphs."""
    if name == "block":
        path = str(tmp_path / "block.onnx")
        block_model(path)
        rng = np.random.default_rng(5)
        calib = str(tmp_path / "calib.npy")
        np.save(calib, rng.standard_normal((32, 16, 12, 12)).astype(np.float32))
        x, names, out = [rng.standard_normal((8, 16, 12, 12)).astype(np.float32)], ["x"], "y2"
        common = ["--fp8", "--calib", calib, "--calib-batch", "8", "--calib-cache", str(tmp_path / "block.calib")]
    else:
        path = exported_model(model_cache, E2eModel(name, size), "torchscript")
        make = export_model.input_maker(name, size=size)
        calib = str(tmp_path / "calib.npy")
        np.save(calib, make(16, seed=21)[0])
        x, names, out = make(8, seed=22), ["input"], None
        common = ["--fp8", "--calib", calib, "--calib-cache", str(tmp_path / f"{name}.calib")]
    cpu = run_kiln(kiln_bin, path, x, names, str(tmp_path / "cpu"), "--device", "cpu", *common)
    # --fp8-all: every eligible layer in FP8 (no fp16 where FP8 times slower), as the CPU has it.
    gpu = run_kiln(kiln_bin, path, x, names, str(tmp_path / "gpu"), "--device", "cuda", "--fp8-all", *common)
    fp32 = run_kiln(kiln_bin, path, x, names, str(tmp_path / "fp32"), "--device", "cpu")
    out = out or next(iter(cpu))
    err, gpu_fp8, cpu_fp8 = rel_l2(gpu[out], cpu[out]), rel_l2(gpu[out], fp32[out]), rel_l2(cpu[out], fp32[out])
    print(f"{name} fp8: GPU vs CPU {err:.4f}; GPU vs fp32 {gpu_fp8:.4f}; CPU vs fp32 {cpu_fp8:.4f}")
    assert np.isfinite(gpu[out]).all()
    assert 0 < cpu_fp8 < (0.1 if name == "block" else 0.5)  # it was quantized, and sensibly
    assert gpu_fp8 <= GPU_ERROR_FACTOR * cpu_fp8
    if name == "block":
        assert err <= 0.05
    build = subprocess.run([kiln_bin, "build", path, *common, "--fp8-all", "-v", "-o", str(tmp_path / "fp8.engine")],
                           capture_output=True, text=True, timeout=600)
    log = build.stdout + build.stderr
    assert build.returncode == 0, log
    assert "cudnn:fp8 graph" in log, log


@pytest.mark.parametrize("tag", ["int8", "fp8"])
def test_quantized_where_faster(tag, kiln_bin, model_cache, tmp_path):
    """--int8 and --fp8 on the GPU keep a layer quantized only where it timed faster than fp16:
    the build times each quantized layer of the all-quantized engine against the fp16 engine's,
    says which it keeps, times the whole engines and keeps the fastest; the engine has exactly
    the quantized layers it chose, names the others with the timing that sent them to fp16, and
    its output is as close to fp32 as the CPU's all-quantized reference is (or closer)."""
    import json
    import re

    fmt = tag.upper()
    name, size = "resnet50", 224
    path = exported_model(model_cache, E2eModel(name, size), "torchscript")
    make = export_model.input_maker(name, size=size)
    calib = str(tmp_path / "calib.npy")
    np.save(calib, make(16, seed=21)[0])
    common = [f"--{tag}", "--calib", calib, "--calib-cache", str(tmp_path / f"{name}.calib")]
    engine = str(tmp_path / f"{tag}.engine")
    build = subprocess.run([kiln_bin, "build", path, *common, "--batch", "8", "-v", "-o", engine],
                           capture_output=True, text=True, timeout=900)
    log = build.stdout + build.stderr
    assert build.returncode == 0, log
    print("\n".join(line for line in log.splitlines() if f"{tag}:" in line or f"{tag} round" in line))
    choices = re.findall(rf"\[(\d+)/(\d+)\] {tag}: (\S+): {fmt} ([\d.]+) ms \+ ([\d.]+) ms quantize/reformat vs fp16 "
                         rf"([\d.]+) ms -> ({fmt}|fp16)", log)
    assert len(choices) == int(choices[0][1]) >= 50, log  # every convolution of ResNet-50 timed
    for _, _, layer, quantized, added, fp16, choice in choices:  # each choice follows its figures (printed rounded)
        if abs(float(quantized) + float(added) - float(fp16)) > 2e-4:
            assert (choice == fmt) == (float(quantized) + float(added) < float(fp16)), layer
    wholes = dict(re.findall(rf"{tag}: whole engine, (.+?): ([\d.]+) ms", log))
    kept = re.search(rf"{tag}: keeping the engine with (.+)", log).group(1).strip()
    assert len(wholes) >= 2 and float(wholes[kept]) == min(float(v) for v in wholes.values()), (wholes, kept)

    info = json.loads(subprocess.run([kiln_bin, "inspect", engine, "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    quantized_layers = {l["name"] for l in info["layers"] if l["op"] == "QConv"}
    # Round 1 times every quantized layer; later rounds (the mixed engine timed again) may pin more.
    expected = {f"every eligible layer in {fmt}": {c[2] for c in choices}, f"no {fmt} layer": set()}
    after = {layer for _, _, layer, *_, choice in choices if choice == fmt}
    for rnd in range(1, 4):
        expected[f"mixed (round {rnd})"] = set(after)
        after -= set(re.findall(rf"{tag} round {rnd + 1}: (\S+): .* -> fp16", log))
    # One quantized region from the input on: the first layer alone, and every layer before the
    # first that round 1 sent to fp16 (graph order, as round 1 printed them).
    order = [c[2] for c in choices]
    first_slower = next((i for i, c in enumerate(choices) if c[6] == "fp16"), len(order))
    leading = {length for length in (1, first_slower) if 1 <= length < len(order)}
    assert set(map(int, re.findall(rf"{tag}: building the engine with its first (\d+) layers", log))) == leading, log
    for length in leading:
        expected[f"the first {length} layers in {fmt}"] = set(order[:length])
    assert quantized_layers == expected[kept]
    if kept.startswith("mixed"):
        reasons = [k for k in info["int8_kept_float"] if "fp16 is faster here" in k]
        assert len(reasons) == len(choices) - len(quantized_layers), info["int8_kept_float"]
    if kept.startswith("the first"):
        reasons = [k for k in info["int8_kept_float"]
                   if "fp16 is faster here" in k or f"after the leading {fmt} region" in k]
        assert len(reasons) == len(choices) - len(quantized_layers), info["int8_kept_float"]

    x = make(8, seed=22)
    gpu = run_kiln(kiln_bin, engine, x, ["input"], str(tmp_path / "gpu"))
    cpu = run_kiln(kiln_bin, path, x, ["input"], str(tmp_path / "cpu"), "--device", "cpu", *common)
    fp32 = run_kiln(kiln_bin, path, x, ["input"], str(tmp_path / "fp32"), "--device", "cpu")
    out = next(iter(cpu))
    print(f"{kept}: {len(quantized_layers)} {fmt} layers; GPU vs fp32 {rel_l2(gpu[out], fp32[out]):.4f}, "
          f"CPU {fmt} reference vs fp32 {rel_l2(cpu[out], fp32[out]):.4f}")
    assert np.isfinite(gpu[out]).all()
    assert rel_l2(gpu[out], fp32[out]) <= GPU_ERROR_FACTOR * rel_l2(cpu[out], fp32[out])


# A tiny transformers BERT: two inputs (int64 ids and mask), products with residual epilogues.
TINY_BERT = "hf:bert:num_hidden_layers=2,hidden_size=32,num_attention_heads=4,intermediate_size=64,vocab_size=97"


def tiny_bert(tmp_path, calib_seed, model=TINY_BERT, seq_len=12):
    """`model` (TINY_BERT) exported to tmp_path, and 32 rows of calibration inputs from `calib_seed`
    in a folder of <input name>.npy files. Returns (model path, input names, input maker, folder)."""
    path = str(tmp_path / "bert.onnx")
    spec = export_model.load_model(model, seq_len=seq_len)
    export_model.export(spec, path)
    names = list(spec.input_names)
    make = export_model.input_maker(model, seq_len=seq_len)
    calib = tmp_path / "calib"
    calib.mkdir()
    for name, rows in zip(names, make(32, seed=calib_seed)):
        np.save(calib / f"{name}.npy", rows)
    return path, names, make, calib


def quantized_gpu_against_cpu(kiln_bin, path, names, x, common, tmp_path, monkeypatch, env, label):
    """`kiln run` of `path` with the build flags `common` on the CPU engine, then on the GPU with the
    developer variables `env` set: the GPU's output within 5% relative L2 of the CPU's reference of
    the same scales. Returns the log of `kiln build -v` with the same flags (and `env`)."""
    cpu = run_kiln(kiln_bin, path, x, names, str(tmp_path / "cpu"), "--device", "cpu", *common)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    gpu = run_kiln(kiln_bin, path, x, names, str(tmp_path / "gpu"), "--device", "cuda", *common)
    out = next(iter(cpu))
    err = rel_l2(gpu[out], cpu[out])
    print(f"{label}: GPU vs CPU {err:.4f}")
    assert np.isfinite(gpu[out]).all()
    assert err <= 0.05
    build = subprocess.run([kiln_bin, "build", path, *common, "-v", "-o", str(tmp_path / "quantized.engine")],
                           capture_output=True, text=True, timeout=600)
    log = build.stdout + build.stderr
    assert build.returncode == 0, log
    return log


@pytest.mark.parametrize("tag", ["int8", "fp8"])
def test_transformer_of_several_inputs_quantizes_and_matches_cpu(tag, kiln_bin, tmp_path):
    """A model of several inputs calibrates on the GPU from a folder of <input>.npy files to the
    CPU's scales (minmax: the largest |x|; the GPU's float sums differ in the last bits), and its
    every product runs quantized (the Q/K/V product, the attention output and the feed-forward
    products, residuals in the epilogue) to the CPU reference's output."""
    path, names, make, calib = tiny_bert(tmp_path, calib_seed=41)
    scales = {}
    for device in ("cpu", "cuda"):
        cache = str(tmp_path / f"{device}.calib")
        r = subprocess.run([kiln_bin, "calibrate", path, "--calib", str(calib), "--batch", "8", "--calib-algo", "minmax",
                            "--device", device, "-o", cache], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        scales[device] = cache_scales(cache)
    assert scales["cuda"].keys() == scales["cpu"].keys()
    for k, v in scales["cpu"].items():
        assert abs(scales["cuda"][k] - v) <= 1e-3 * abs(v), (k, scales["cuda"][k], v)

    x = make(8, seed=42)
    common = [f"--{tag}", f"--{tag}-all", "--calib-cache", str(tmp_path / "cpu.calib")]
    cpu = run_kiln(kiln_bin, path, x, names, str(tmp_path / "cpu"), "--device", "cpu", *common)
    gpu = run_kiln(kiln_bin, path, x, names, str(tmp_path / "gpu"), "--device", "cuda", *common)
    fp32 = run_kiln(kiln_bin, path, x, names, str(tmp_path / "fp32"), "--device", "cpu")
    fp16 = run_kiln(kiln_bin, path, x, names, str(tmp_path / "fp16"), "--device", "cuda", "--fp16")
    out = next(iter(cpu))
    err, gpu_err, cpu_err = rel_l2(gpu[out], cpu[out]), rel_l2(gpu[out], fp32[out]), rel_l2(cpu[out], fp32[out])
    fp16_err = rel_l2(fp16[out], fp32[out])
    print(f"tiny BERT {tag}: GPU vs CPU {err:.4f}; GPU vs fp32 {gpu_err:.4f}; CPU vs fp32 {cpu_err:.4f}; "
          f"GPU fp16 vs fp32 {fp16_err:.4f}")
    assert 0 < cpu_err < 0.1  # quantized, and sensibly
    # The GPU's other layers run in float16 (LayerNorm's output is quantized from it), which on
    # this small model is an error of the size of the quantization's own: the two add up.
    assert gpu_err <= GPU_ERROR_FACTOR * cpu_err + 2 * fp16_err
    assert err <= 0.05
    build = subprocess.run([kiln_bin, "build", path, *common, "-v", "-o", str(tmp_path / f"{tag}.engine")],
                           capture_output=True, text=True, timeout=600)
    log = build.stdout + build.stderr
    assert build.returncode == 0, log
    quantized = int(re.search(rf"{tag}: (\d+) convolutions in {tag.upper()}", log).group(1))
    assert quantized >= 8, log  # four products in each of the two blocks


def products_model(path, act):
    """Transformer-style products over [2, 23, 64] tokens (46 rows: not a multiple of any tile):
    x @ W1 + b1 -> `act` -> @ W2 + b2 + x (a residual in the epilogue) -> y; W1's output feeds
    only W2, so a quantized engine writes it in W2's 8-bit type."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(53)
    weights = {"w1": rng.standard_normal((64, 128)) * 0.12, "b1": rng.standard_normal(128) * 0.1,
               "w2": rng.standard_normal((128, 64)) * 0.09, "b2": rng.standard_normal(64) * 0.1}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["p1"], name="fc1"),
             helper.make_node("Add", ["p1", "b1"], ["h1"], name="bias1")]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["h1"], ["a1"], name="act1"))
    elif act == "LeakyRelu":
        nodes.append(helper.make_node("LeakyRelu", ["h1"], ["a1"], name="act1", alpha=0.1))
    else:
        nodes.append(helper.make_node("Gelu", ["h1"], ["a1"], name="act1", approximate=act))
    nodes += [helper.make_node("MatMul", ["a1", "w2"], ["p2"], name="fc2"),
              helper.make_node("Add", ["p2", "b2"], ["h2"], name="bias2"),
              helper.make_node("Add", ["h2", "x"], ["y"], name="residual")]
    graph = helper.make_graph(nodes, "fp8_products", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 23, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 23, 64])],
                              [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)


# The GEMM libraries' product tactics: KILN_INT8_CONV_TACTIC's value -> the tactic's name in `kiln
# build -v`'s log, by precision.
PRODUCT_TACTIC_NAMES = {("cublaslt", "fp8"): "cublasLt:fp8", ("cutlass", "fp8"): "cutlass:fp8", ("cutlass", "int8"): "cutlass:int8"}


def fp8_products_on_both_engines(kiln_bin, path, tmp_path, seed):
    """The products model at `path` in FP8, calibrated on random data of `seed`, run on the CPU
    engine and on the GPU (under the KILN_INT8_CONV_TACTIC the caller set): (CPU output, GPU
    output, the input, the build flags)."""
    rng = np.random.default_rng(seed)
    calib = str(tmp_path / "calib.npy")
    np.save(calib, rng.standard_normal((16, 23, 64)).astype(np.float32))
    x = [rng.standard_normal((2, 23, 64)).astype(np.float32)]
    common = ["--fp8", "--fp8-all", "--calib", calib, "--calib-batch", "2", "--calib-cache", str(tmp_path / "products.calib")]
    cpu = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "cpu"), "--device", "cpu", *common)["y"]
    gpu = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "gpu"), "--device", "cuda", *common)["y"]
    return cpu, gpu, x, common


def fp8_build_log(kiln_bin, path, tmp_path, common) -> str:
    build = subprocess.run([kiln_bin, "build", path, *common, "-v", "-o", str(tmp_path / "fp8.engine")],
                           capture_output=True, text=True, timeout=300)
    log = build.stdout + build.stderr
    assert build.returncode == 0, log
    return log


@pytest.mark.parametrize("tactic", ["cublaslt", "cutlass"])
@pytest.mark.parametrize("act", ["Relu", "tanh", "none"])
def test_fp8_products_match_cpu(act, tactic, kiln_bin, tmp_path, monkeypatch):
    """The GEMM libraries' FP8 products run a transformer's products, every product on the one
    library: cuBLASLt (per-channel weight scales as outer-vector scales; bias and ReLU / tanh-GELU
    in its epilogue, erf GELU in a finishing pass that also writes the float8e4m3fn input of the
    next product, the residual as its C) and CUTLASS (the whole epilogue, the E4M3 output
    included, fused). Against the CPU engine's FP8 reference of the same scales (E4M3 steps
    apart where float sums round differently)."""
    path = str(tmp_path / "products.onnx")
    products_model(path, act)
    monkeypatch.setenv("KILN_INT8_CONV_TACTIC", tactic)
    cpu, gpu, x, common = fp8_products_on_both_engines(kiln_bin, path, tmp_path, 59)
    fp32 = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "fp32"), "--device", "cpu")["y"]
    err, cpu_err = rel_l2(gpu, cpu), rel_l2(cpu, fp32)
    print(f"{act}: {tactic} FP8 vs CPU FP8 {err:.4f}; CPU FP8 vs fp32 {cpu_err:.4f}")
    assert np.isfinite(gpu).all()
    assert 0 < cpu_err < 0.1
    assert err <= 0.05
    assert fp8_build_log(kiln_bin, path, tmp_path, common).count(PRODUCT_TACTIC_NAMES[(tactic, "fp8")]) == 2


@pytest.mark.parametrize("tactic,tag", [("cublaslt", "fp8"), ("cutlass", "fp8"), ("cutlass", "int8")])
def test_transformer_products_on_gemm_libraries(tactic, tag, kiln_bin, tmp_path, monkeypatch):
    """The tiny BERT with every product on one GEMM library (cuBLASLt's FP8 products finish the
    erf GELU after the product; CUTLASS's fuse it, and the requantization for the second
    feed-forward product) against the CPU's reference of the same scales; the LayerNorms write
    the 8-bit copies the products read (kiln::QuantizingLayerNorm)."""
    path, names, make, calib = tiny_bert(tmp_path, calib_seed=43)
    common = [f"--{tag}", f"--{tag}-all", "--calib", str(calib), "--calib-cache", str(tmp_path / "bert.calib")]
    log = quantized_gpu_against_cpu(kiln_bin, path, names, make(8, seed=44), common, tmp_path, monkeypatch,
                                    {"KILN_INT8_CONV_TACTIC": tactic}, f"tiny BERT on {tactic} {tag}")
    quantized = int(re.search(rf"{tag}: (\d+) convolutions in {tag.upper()}", log).group(1))
    assert quantized >= 8 and log.count(PRODUCT_TACTIC_NAMES[(tactic, tag)]) == quantized, log
    # The LayerNorms before the Q/K/V and first feed-forward products write their 8-bit input.
    assert int(re.search(r"(\d+) quantized copies written by LayerNormalizations", log).group(1)) >= 2, log


# A BERT whose heads are 64 wide (kiln's fused attention kernel takes them), 77 tokens.
BERT_HEAD_64 = "hf:bert:num_hidden_layers=2,hidden_size=128,num_attention_heads=2,intermediate_size=256,vocab_size=97"


@pytest.mark.parametrize("tactic", ["kernel", "products"])
def test_attention_writes_int8_for_the_output_product(tactic, kiln_bin, tmp_path, monkeypatch):
    """An INT8 build makes each attention write the int8 input of its output projection itself
    (passes/fuse_attention_quantize.cc): kiln's fused attention kernel quantizes in its epilogue;
    the products (and cuDNN) compute float16 and quantize in the same layer. Either way against the
    CPU engine's INT8 reference of the same scales, with the padding mask of BERT's inputs."""
    path, names, make, calib = tiny_bert(tmp_path, calib_seed=45, model=BERT_HEAD_64, seq_len=77)
    common = ["--int8", "--int8-all", "--calib", str(calib), "--calib-cache", str(tmp_path / "bert.calib")]
    log = quantized_gpu_against_cpu(kiln_bin, path, names, make(4, seed=46), common, tmp_path, monkeypatch,
                                    {"KILN_ATTENTION_TACTIC": tactic}, f"BERT (heads of 64) INT8, attention on {tactic}")
    assert int(re.search(r"(\d+) attentions writing int8", log).group(1)) == 2, log
    want = {"kernel": "kernel:flash-attention", "products": "cublasLt+kernel:attention-softmax"}[tactic]
    assert len(re.findall(r"\(StridedAttention\): " + re.escape(want), log)) == 2, log


# CUTLASS's kernels of each 8-bit type (src/cuda/kernels/quantized_gemm_cutlass.cuh, kernels_of).
CUTLASS_KERNELS = ["128x256x128 cluster 2x1 cooperative", "128x128x128 cluster 2x1 cooperative",
                   "128x128x128 cluster 1x2 cooperative", "64x128x128 pingpong"]


@pytest.mark.parametrize("kernel", CUTLASS_KERNELS)
@pytest.mark.parametrize("tag", ["int8", "fp8"])
def test_each_cutlass_kernel_runs_the_products(tag, kernel, kiln_bin, tmp_path, monkeypatch):
    """Every CUTLASS kernel, forced on both products (KILN_INT8_CONV_TACTIC=cutlass:NAME), over rows
    that fill no tile: in INT8 with ReLU and an exact input the int8 value between the products is
    the CPU reference's bit for bit; in FP8 with tanh-GELU the output is within E4M3's steps of
    the CPU's FP8 reference."""
    path = str(tmp_path / "products.onnx")
    products_model(path, "Relu" if tag == "int8" else "tanh")
    monkeypatch.setenv("KILN_INT8_CONV_TACTIC", f"cutlass:{kernel}")
    if tag == "int8":
        check_exact_against_cpu(kiln_bin, path, (2, 23, 64), tmp_path, 67, "y", f"cutlass:int8 {kernel}", 2)
        return
    cpu, gpu, _, common = fp8_products_on_both_engines(kiln_bin, path, tmp_path, 71)
    err = rel_l2(gpu, cpu)
    print(f"{kernel}: FP8 vs CPU FP8 {err:.4f}")
    assert np.isfinite(gpu).all() and err <= 0.05
    assert fp8_build_log(kiln_bin, path, tmp_path, common).count(f"cutlass:fp8 {kernel}") == 2


def test_a_cutlass_kernel_of_no_such_name_is_refused_naming_the_kernels(kiln_bin, tmp_path, monkeypatch):
    """KILN_INT8_CONV_TACTIC=cutlass:NAME of a kernel the build lacks fails the build, naming the
    build's kernels, instead of timing the others."""
    path = str(tmp_path / "products.onnx")
    products_model(path, "Relu")
    cache, _ = exact_input_cache(kiln_bin, path, (2, 23, 64), tmp_path, np.random.default_rng(73))
    monkeypatch.setenv("KILN_INT8_CONV_TACTIC", "cutlass:1x1x1 nothing")
    build = subprocess.run([kiln_bin, "build", path, "--int8", "--int8-all", "--calib-cache", cache, "-o",
                            str(tmp_path / "q.engine")], capture_output=True, text=True, timeout=300)
    assert build.returncode != 0
    assert "no CUTLASS kernel named '1x1x1 nothing'" in build.stderr and CUTLASS_KERNELS[-1] in build.stderr, build.stderr


@pytest.mark.parametrize("act", ["Relu", "identity", "tanh", "none", "LeakyRelu"])
def test_int8_products_on_cutlass_match_cpu_exactly(act, kiln_bin, tmp_path, monkeypatch):
    """CUTLASS's INT8 GEMMs run a transformer's products with the whole epilogue fused: per-channel
    scales, bias, activation, the residual, and the int8 value the second product reads. With an
    input that float16 holds exactly and quantizes to whole steps (exact_input_cache), the int8
    value between the products is the CPU reference's bit for bit (one fma, ties to even), so the
    float16 output differs from the CPU's float32 only by float16's rounding. GELU, tanh's or erf's
    (act "tanh", "none"), runs in its tanh form on the hardware tanh (gelu_on_hardware_tanh in
    quantized_gemm_cutlass.cuh): a few int8 values between the products land a step from the
    CPU's, and each such step moves every output the second product sums it into, so the output
    is held to the quantization's own error instead: the GPU adds at most a quarter of it and is no
    further from float32 than the CPU. "identity": no activation between the products. LeakyRelu (exact on both
    engines) stands for the activations the epilogue runs out of line (apply_uncommon in
    quantized_gemm_cutlass.cuh)."""
    path = str(tmp_path / "products.onnx")
    if act == "identity":
        products_model(path, "Relu")
        import onnx
        model = onnx.load(path)
        relu = next(n for n in model.graph.node if n.op_type == "Relu")
        model.graph.node.remove(relu)
        for n in model.graph.node:
            n.input[:] = ["h1" if i == "a1" else i for i in n.input]
        onnx.save(model, path)
    else:
        products_model(path, act)
    cache, x = exact_input_cache(kiln_bin, path, (2, 23, 64), tmp_path, np.random.default_rng(61))
    common = ["--int8", "--int8-all", "--calib-cache", cache]
    cpu = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "cpu"), "--device", "cpu", *common)["y"]
    fp32 = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "fp32"), "--device", "cpu")["y"]
    monkeypatch.setenv("KILN_INT8_CONV_TACTIC", "cutlass")
    gpu = run_kiln(kiln_bin, path, x, ["x"], str(tmp_path / "gpu"), "--device", "cuda", *common)["y"]
    off = np.abs(gpu.astype(np.float64) - cpu) > np.abs(cpu) * 2.0**-11 + 2.0**-24
    print(f"{act}: {int(off.sum())} of {off.size} outputs beyond float16 rounding of the CPU's; "
          f"CUTLASS vs CPU {rel_l2(gpu, cpu):.2e}; CPU int8 vs fp32 {rel_l2(cpu, fp32):.2e}")
    # Quantized (the input's coarse sixteenths make its error larger than calibrated data's).
    assert np.abs(cpu).max() > 0.1 and rel_l2(cpu, fp32) > 0
    if act in ("tanh", "none"):
        assert rel_l2(gpu, cpu) < 0.25 * rel_l2(cpu, fp32)
        assert rel_l2(gpu, fp32) < 1.05 * rel_l2(cpu, fp32)
    else:
        assert not off.any()
    build = subprocess.run([kiln_bin, "build", path, *common, "-v", "-o", str(tmp_path / "int8.engine")],
                           capture_output=True, text=True, timeout=300)
    log = build.stdout + build.stderr
    assert build.returncode == 0, log
    assert log.count("cutlass:int8") == 2, log
    assert "(LeakyRelu)" not in log, log  # in the first product's epilogue, not a layer of its own
