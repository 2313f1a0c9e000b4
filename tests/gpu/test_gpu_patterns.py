"""Small graphs of the patterns CNNs are made of, GPU engine (fp32 and fp16) against the CPU
engine: each fused conv epilogue, depthwise and grouped convs, residual adds, squeeze-and-
excitation, channel counts that are and are not multiples of 8 (the vectorized paths)."""
from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from test_gpu_models import rel_l2, run_kiln


def conv(name, x, cin, cout, k=3, group=1, rng=None, stride=1):
    w = (rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k)).astype(np.float32)
    b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
    inits = [numpy_helper.from_array(w, name + "_w"), numpy_helper.from_array(b, name + "_b")]
    node = helper.make_node("Conv", [x, name + "_w", name + "_b"], [name], group=group, pads=[k // 2] * 4,
                            strides=[stride, stride])
    return [node], inits


def activation(kind, x, out):
    if kind == "relu6":
        return [helper.make_node("Clip", [x, "zero", "six"], [out])]
    if kind == "silu":
        return [helper.make_node("Sigmoid", [x], [out + "_s"]), helper.make_node("Mul", [x, out + "_s"], [out])]
    op = {"relu": "Relu", "hardswish": "HardSwish", "sigmoid": "Sigmoid", "tanh": "Tanh"}[kind]
    return [helper.make_node(op, [x], [out])]


def build(pattern: str, channels: int, path: str):
    rng = np.random.default_rng(channels)
    c = channels
    nodes, inits = [], [numpy_helper.from_array(np.array(0, np.float32), "zero"),
                        numpy_helper.from_array(np.array(6, np.float32), "six")]
    if pattern.startswith("conv_"):
        n, i = conv("c1", "x", c, c, rng=rng)
        nodes += n + activation(pattern[5:], "c1", "y")
        inits += i
    elif pattern == "residual_identity":
        n, i = conv("c1", "x", c, c, rng=rng)
        nodes += n + [helper.make_node("Add", ["c1", "x"], ["y"])]
        inits += i
    elif pattern == "residual_relu":
        n, i = conv("c1", "x", c, c, rng=rng)
        nodes += n + [helper.make_node("Add", ["c1", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
        inits += i
    elif pattern.startswith("pointwise_"):
        # 1x1 conv (the GEMM tactic), optionally with the residual and ReLU of a bottleneck.
        n, i = conv("c1", "x", c, c, k=1, rng=rng)
        inits += i
        if pattern == "pointwise_residual_relu":
            nodes += n + [helper.make_node("Add", ["c1", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
        else:
            nodes += n + activation(pattern[10:], "c1", "y")
    elif pattern.startswith("depthwise_"):
        n, i = conv("c1", "x", c, c, group=c, rng=rng)
        nodes += n + activation(pattern[10:], "c1", "y")
        inits += i
    elif pattern == "grouped":
        n, i = conv("c1", "x", c, c, group=2 if c % 2 == 0 else 1, rng=rng)
        nodes += n + activation("relu", "c1", "y")
        inits += i
    elif pattern == "strided_1x1":
        n, i = conv("c1", "x", c, 2 * c, k=1, rng=rng, stride=2)
        nodes += n
        nodes[-1].output[0] = "y"
        inits += i
    elif pattern == "squeeze_excite":
        nodes.append(helper.make_node("GlobalAveragePool", ["x"], ["g"]))
        n1, i1 = conv("s1", "g", c, max(c // 4, 1), k=1, rng=rng)
        n2, i2 = conv("s2", "s1r", max(c // 4, 1), c, k=1, rng=rng)
        nodes += n1 + activation("relu", "s1", "s1r") + n2 + activation("sigmoid", "s2", "gate")
        nodes.append(helper.make_node("Mul", ["x", "gate"], ["y"]))
        inits += i1 + i2
    else:
        raise ValueError(pattern)
    out_c = 2 * c if pattern == "strided_1x1" else c
    out_hw = 6 if pattern == "strided_1x1" else 12
    graph = helper.make_graph(nodes, pattern, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, c, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, out_c, out_hw, out_hw])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)


PATTERNS = ["conv_relu", "conv_relu6", "conv_hardswish", "conv_silu", "conv_sigmoid", "conv_tanh",
            "residual_identity", "residual_relu", "depthwise_relu", "depthwise_relu6", "depthwise_silu", "grouped",
            "strided_1x1", "squeeze_excite", "pointwise_residual_relu", "pointwise_relu6", "pointwise_silu"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("channels", [16, 12])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_pattern(pattern, channels, precision, kiln_bin, tmp_path):
    path = str(tmp_path / "m.onnx")
    build(pattern, channels, path)
    x = np.random.default_rng(7).standard_normal((4, channels, 12, 12)).astype(np.float32)
    want = run_kiln(kiln_bin, path, [x], ["x"], str(tmp_path / "cpu"), "--device", "cpu")["y"]
    got = run_kiln(kiln_bin, path, [x], ["x"], str(tmp_path / "gpu"), "--device", "cuda", f"--{precision}")["y"]
    err = rel_l2(got, want)
    limit = 1e-4 if precision == "fp32" else 1e-2
    assert err <= limit, f"{pattern} C={channels} {precision}: relative L2 error {err:.3g}"


def leading_slice_model(batch: int, path: str):
    """x [batch, 20] -> Relu -> r; Slice(r)[:, :13] -> s (an output, and read by Sigmoid -> t)."""
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Slice", ["r", "starts", "ends", "axes"], ["s"]),
             helper.make_node("Sigmoid", ["s"], ["t"])]
    graph = helper.make_graph(nodes, "leading_slice", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 20])],
                              [helper.make_tensor_value_info("s", TensorProto.FLOAT, [batch, 13]),
                               helper.make_tensor_value_info("t", TensorProto.FLOAT, [batch, 13])],
                              [ints("starts", [0]), ints("ends", [13]), ints("axes", [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)


def engine_ops(kiln_bin, path, precision, tmp_path):
    """Builds `path` into a GPU engine file; its path and its layers' ops (the Attention layers'
    tactics are printed)."""
    engine = str(tmp_path / "m.engine")
    r = subprocess.run([kiln_bin, "build", path, "--device", "cuda", f"--{precision}", "-o", engine],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    info = json.loads(subprocess.run([kiln_bin, "inspect", engine, "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    print([(layer["op"], layer["tactic"]) for layer in info["layers"] if layer["op"].endswith("Attention")])
    return engine, [layer["op"] for layer in info["layers"]]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("batch", [1, 3])
def test_leading_slice_is_a_view(batch, precision, kiln_bin, tmp_path):
    """A Slice that keeps its input's first elements ([1, 20] -> [1, 13]) moves no bytes on the GPU:
    no Slice layer, and the output that is that view gets a copy of its own (its slot is sized for
    13 values, not 20). At batch 3 the 13 of each row are not the first 39: a Slice layer copies.
    Both against the CPU engine."""
    path = str(tmp_path / "m.onnx")
    leading_slice_model(batch, path)
    engine, ops = engine_ops(kiln_bin, path, precision, tmp_path)
    assert ("Slice" in ops) == (batch > 1), ops
    x = np.random.default_rng(batch).standard_normal((batch, 20)).astype(np.float32)
    want = run_kiln(kiln_bin, path, [x], ["x"], str(tmp_path / "cpu"), "--device", "cpu")
    got = run_kiln(kiln_bin, engine, [x], ["x"], str(tmp_path / "gpu"))
    limit = 1e-6 if precision == "fp32" else 1e-3
    for name in ("s", "t"):
        assert got[name].shape == (batch, 13)
        assert rel_l2(got[name], want[name]) <= limit, name


# --- attention: ONNX's Attention op and the pattern attention fusion turns into it ----------------

ATTENTION_FORMS = {
    # name: (three_d, q_heads, kv_heads, queries, keys, mask, attrs)
    "4d": (False, 4, 4, 37, 37, None, {}),
    "4d_padding_mask": (False, 4, 4, 37, 45, "padding", {}),
    "4d_causal": (False, 4, 4, 37, 37, None, {"is_causal": 1}),
    "4d_bool_mask": (False, 2, 2, 16, 33, "bool", {}),
    "4d_one_kv_head": (False, 4, 1, 20, 29, "full", {"scale": 0.3}),
    "3d_grouped": (True, 4, 2, 25, 31, None, {}),
    "3d_causal_window": (True, 2, 2, 40, 40, "padding", {"is_causal": 1, "left_window_size": 7}),
    # BERT's and GPT's sizes (head 64), where fp16 engines time cuDNN's fused attention against
    # the products: a padding mask, a causal 200 (not a multiple of 64), grouped heads in 3-D.
    "4d_bert_padding": (False, 12, 12, 128, 128, "padding", {}),
    "4d_causal_200": (False, 8, 8, 200, 200, None, {"is_causal": 1}),
    "3d_grouped_bool_mask": (True, 8, 2, 96, 96, "bool", {}),
}


def attention_op_model(form: str, path: str, batch: int = 3):
    three_d, hq, hkv, s, t, mask, attrs = ATTENTION_FORMS[form]
    head = 64 if s >= 96 else 16
    if three_d:
        shapes = {"Q": [batch, s, hq * head], "K": [batch, t, hkv * head], "V": [batch, t, hkv * head]}
        attrs = {"q_num_heads": hq, "kv_num_heads": hkv, **attrs}
    else:
        shapes = {"Q": [batch, hq, s, head], "K": [batch, hkv, t, head], "V": [batch, hkv, t, head]}
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, d) for n, d in shapes.items()]
    names = ["Q", "K", "V"]
    if mask:
        dims = {"padding": [batch, 1, 1, t], "bool": [s, t], "full": [batch, hq, s, t]}[mask]
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL if mask == "bool" else TensorProto.FLOAT, dims))
        names.append("mask")
    node = helper.make_node("Attention", names, ["Y"], **attrs)
    graph = helper.make_graph([node], "attention", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    onnx.save(model, path)
    rng = np.random.default_rng(len(form))
    feeds = [rng.standard_normal(shapes[n]).astype(np.float32) for n in ("Q", "K", "V")]
    if mask == "bool":
        m = rng.random(dims) < 0.7
        m[:, 0] = True  # every query sees a key
        feeds.append(m)
    elif mask:
        m = np.where(rng.random(dims) < 0.8, 0.0, np.finfo(np.float32).min).astype(np.float32)
        m[..., 0] = 0.0
        feeds.append(m)
    return feeds, names


def attention_pattern_model(path: str, batch: int = 2, heads: int = 3, seq: int = 23, head: int = 16):
    """The unfused form exporters write: Q.K^T (K transposed by a Transpose), a Div by sqrt(d),
    an additive padding mask, Softmax, the product with V."""
    dims = {"Q": [batch, heads, seq, head], "K": [batch, heads, seq, head], "V": [batch, heads, seq, head],
            "mask": [batch, 1, 1, seq]}
    nodes = [helper.make_node("Transpose", ["K"], ["Kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["Q", "Kt"], ["s"]),
             helper.make_node("Div", ["s", "root"], ["sd"]),
             helper.make_node("Add", ["sd", "mask"], ["sm"]),
             helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "V"], ["Y"])]
    graph = helper.make_graph(nodes, "attention_pattern",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, d) for n, d in dims.items()],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(np.sqrt(head), np.float32), "root")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    rng = np.random.default_rng(11)
    feeds = [rng.standard_normal(dims[n]).astype(np.float32) for n in ("Q", "K", "V")]
    feeds.append(np.where(rng.random(dims["mask"]) < 0.8, 0.0, -1e9).astype(np.float32))
    return feeds, ["Q", "K", "V", "mask"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("form", list(ATTENTION_FORMS) + ["fused_pattern"])
def test_attention_layer_matches_cpu(form, precision, kiln_bin, tmp_path):
    """Each form runs as one Attention layer on the GPU (no CPU fallback, no unfused products) and
    matches the CPU engine: 1e-4 relative L2 in fp32, 1e-2 in fp16, whichever tactic fp16 timed
    faster (cuDNN's fused attention or the products around kiln's softmax)."""
    path = str(tmp_path / "m.onnx")
    feeds, names = attention_pattern_model(path) if form == "fused_pattern" else attention_op_model(form, path)
    engine, ops = engine_ops(kiln_bin, path, precision, tmp_path)
    print(form, precision, ops)
    assert ops.count("Attention") == 1 and "Softmax" not in ops and "MatMul" not in ops, ops
    want = run_kiln(kiln_bin, path, feeds, names, str(tmp_path / "cpu"), "--device", "cpu")["Y"]
    got = run_kiln(kiln_bin, engine, feeds, names, str(tmp_path / "gpu"))["Y"]
    assert got.shape == want.shape
    err = rel_l2(got, want)
    assert err <= (1e-4 if precision == "fp32" else 1e-2), f"{form} {precision}: relative L2 error {err:.3g}"


# --- attention reading packed projections in place (kiln::StridedAttention) -----------------------

PACKED_FORMS = {
    # name: (packing, batch, seq, heads, head size, extra)
    "mha_seq_first": ("mha", 3, 50, 4, 64, {}),       # nn.MultiheadAttention / ViT: [S, B, 3E] and Gathers
    "mha_seq_first_small": ("mha", 2, 37, 3, 16, {}),
    "mha_batch_1": ("mha", 1, 197, 12, 64, {}),
    "split_last_axis_causal": ("split", 2, 77, 4, 64, {"is_causal": 1}),  # GPT-2: [B, S, 3E] split
    "split_last_axis_mask": ("split", 3, 64, 2, 32, {"mask": True}),
    "interleaved_heads": ("interleaved", 2, 45, 4, 64, {}),  # GPT-NeoX: [B, S, H, 3, D]
}


def packed_attention_model(form: str, path: str):
    """Q, K and V split from one projection input `qkv` by the layers exporters write, one 4-D
    Attention, Y merged back into rows: every layer between `qkv` and Y's rows only moves
    elements, so the GPU engine runs one StridedAttention layer."""
    packing, b, s, h, d, extra = PACKED_FORMS[form]
    e = h * d
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes, inits = [], []
    if packing == "mha":
        qkv_shape = [s, b, 3 * e]
        nodes += [helper.make_node("Reshape", ["qkv", "split3"], ["split"]),
                  helper.make_node("Unsqueeze", ["split", "axis0"], ["unsq"]),
                  helper.make_node("Transpose", ["unsq"], ["moved"], perm=[3, 1, 2, 0, 4]),
                  helper.make_node("Squeeze", ["moved", "axis_m2"], ["parts"])]
        inits += [ints("split3", [s, b, 3, e]), ints("axis0", [0]), ints("axis_m2", [-2]), ints("merged", [s, b * h, d]),
                  ints("heads", [b, h, s, d])]
        for i, n in enumerate("qkv"):
            inits.append(numpy_helper.from_array(np.array(i, np.int64), f"{n}_index"))
            nodes += [helper.make_node("Gather", ["parts", f"{n}_index"], [f"{n}_sbe"], axis=0),
                      helper.make_node("Reshape", [f"{n}_sbe", "merged"], [f"{n}_m"]),
                      helper.make_node("Transpose", [f"{n}_m"], [f"{n}_t"], perm=[1, 0, 2]),
                      helper.make_node("Reshape", [f"{n}_t", "heads"], [n.upper()])]
        nodes += [helper.make_node("Transpose", ["Y4"], ["Ys"], perm=[2, 0, 1, 3]),
                  helper.make_node("Reshape", ["Ys", "rows"], ["Y"])]
        inits.append(ints("rows", [s * b, e]))
    else:
        qkv_shape = [b, s, 3 * e]
        if packing == "split":
            nodes.append(helper.make_node("Split", ["qkv", "sizes"], ["q3", "k3", "v3"], axis=2))
            inits += [ints("sizes", [e, e, e]), ints("bshd", [b, s, h, d])]
            for n in "qkv":
                nodes += [helper.make_node("Reshape", [f"{n}3", "bshd"], [f"{n}_bshd"]),
                          helper.make_node("Transpose", [f"{n}_bshd"], [n.upper()], perm=[0, 2, 1, 3])]
        else:
            nodes.append(helper.make_node("Reshape", ["qkv", "bsh3d"], ["packed"]))
            inits += [ints("bsh3d", [b, s, h, 3, d])]
            for i, n in enumerate("qkv"):
                inits.append(numpy_helper.from_array(np.array(i, np.int64), f"{n}_index"))
                nodes += [helper.make_node("Gather", ["packed", f"{n}_index"], [f"{n}_bshd"], axis=3),
                          helper.make_node("Transpose", [f"{n}_bshd"], [n.upper()], perm=[0, 2, 1, 3])]
        nodes += [helper.make_node("Transpose", ["Y4"], ["Ys"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", ["Ys", "rows"], ["Y"])]
        inits.append(ints("rows", [b, s, e]))
    names = ["Q", "K", "V"]
    inputs = [helper.make_tensor_value_info("qkv", TensorProto.FLOAT, qkv_shape)]
    rng = np.random.default_rng(len(form))
    feeds = [rng.standard_normal(qkv_shape).astype(np.float32)]
    if extra.get("mask"):
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [b, 1, 1, s]))
        names.append("mask")
        m = np.where(rng.random([b, 1, 1, s]) < 0.8, 0.0, np.finfo(np.float32).min).astype(np.float32)
        m[..., 0] = 0.0
        feeds.append(m)
    attrs = {"is_causal": extra["is_causal"]} if "is_causal" in extra else {}
    nodes.append(helper.make_node("Attention", names, ["Y4"], **attrs))
    graph = helper.make_graph(nodes, "packed_attention", inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]), path)
    return feeds, ["qkv"] + (["mask"] if extra.get("mask") else [])


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("form", list(PACKED_FORMS))
def test_attention_reads_packed_projections_in_place(form, precision, kiln_bin, tmp_path):
    """Q, K and V split from one projection by Reshapes, Transposes, Gathers or a Split, and Y
    merged back, run as one StridedAttention layer with no layer copying heads, and match the
    unoptimized CPU engine (1e-4 relative L2 in fp32, 1e-2 in fp16, whichever tactic timed faster)."""
    path = str(tmp_path / "m.onnx")
    feeds, names = packed_attention_model(form, path)
    engine, ops = engine_ops(kiln_bin, path, precision, tmp_path)
    print(form, precision, ops)
    # fp16 engines add Reformats converting the float32 input and output.
    assert [op for op in ops if op != "Reformat"] == ["StridedAttention"], ops
    # The reference: the CPU engine without kiln's passes (ONNX's Attention on copied heads).
    want = run_kiln(kiln_bin, path, feeds, names, str(tmp_path / "cpu"), "--device", "cpu", "--no-optimize")["Y"]
    got = run_kiln(kiln_bin, engine, feeds, names, str(tmp_path / "gpu"))["Y"]
    assert got.shape == want.shape
    err = rel_l2(got, want)
    assert err <= (1e-4 if precision == "fp32" else 1e-2), f"{form} {precision}: relative L2 error {err:.3g}"


# The forms of head size 64 (what kiln's fused attention kernel takes), each tactic forced.
HEAD_64_FORMS = ["4d_bert_padding", "4d_causal_200", "3d_grouped_bool_mask", "mha_batch_1", "split_last_axis_causal",
                 "interleaved_heads"]
ATTENTION_TACTIC_NAMES = {"kernel": "kernel:flash-attention", "cudnn": "cudnn:fused-attention",
                          "products": "cublasLt+kernel:attention-softmax"}


@pytest.mark.parametrize("tactic", list(ATTENTION_TACTIC_NAMES))
@pytest.mark.parametrize("form", HEAD_64_FORMS)
def test_each_attention_tactic_matches_cpu(form, tactic, kiln_bin, tmp_path, monkeypatch):
    """Each float16 attention tactic forced (KILN_ATTENTION_TACTIC): kiln's fused attention kernel
    (padding, boolean and causal masks, grouped heads, 200 and 197 keys, views of packed
    projections), cuDNN's fused attention and the products, each against the CPU engine (1e-2
    relative L2), and the layer runs the tactic forced."""
    path = str(tmp_path / "m.onnx")
    feeds, names = packed_attention_model(form, path) if form in PACKED_FORMS else attention_op_model(form, path)
    monkeypatch.setenv("KILN_ATTENTION_TACTIC", tactic)
    engine = str(tmp_path / "m.engine")
    r = subprocess.run([kiln_bin, "build", path, "--device", "cuda", "--fp16", "-o", engine], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    info = json.loads(subprocess.run([kiln_bin, "inspect", engine, "--json"], capture_output=True, text=True, check=True).stdout)
    tactics = [layer["tactic"] for layer in info["layers"] if layer["op"].endswith("Attention")]
    assert len(tactics) == 1 and tactics[0].startswith(ATTENTION_TACTIC_NAMES[tactic]), tactics
    want = run_kiln(kiln_bin, path, feeds, names, str(tmp_path / "cpu"), "--device", "cpu", "--no-optimize")["Y"]
    got = run_kiln(kiln_bin, engine, feeds, names, str(tmp_path / "gpu"))["Y"]
    err = rel_l2(got, want)
    assert err <= 1e-2, f"{form} on {tactic}: relative L2 error {err:.3g}"


def residual_block_model(path: str, batch: int = 3, seq: int = 37, width: int = 96):
    """A transformer block's two skip connections: x + Linear(x) as MatMul, bias Add, residual
    Add; then h + Linear(h) through rows (Reshape, Gemm transB, Reshape back, residual Add)."""
    rng = np.random.default_rng(5)
    f = lambda name, shape: numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)  # noqa: E731
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["mm"]),
             helper.make_node("Add", ["mm", "b1"], ["biased"]),
             helper.make_node("Add", ["biased", "x"], ["h"]),
             helper.make_node("Reshape", ["h", "rows"], ["h_rows"]),
             helper.make_node("Gemm", ["h_rows", "w2", "b2"], ["g"], transB=1),
             helper.make_node("Reshape", ["g", "bse"], ["g3"]),
             helper.make_node("Add", ["g3", "h"], ["y"])]
    graph = helper.make_graph(nodes, "residuals", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [f("w1", [width, width]), f("b1", [width]), f("w2", [width, width]), f("b2", [width]),
                               ints("rows", [batch * seq, width]), ints("bse", [batch, seq, width])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return [rng.standard_normal([batch, seq, width]).astype(np.float32)]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_residual_adds_run_in_the_products_epilogue(precision, kiln_bin, tmp_path):
    """Both skip connections run inside cuBLASLt's epilogue (the residual as its C): no Add layer
    is left, and the output matches the unoptimized CPU engine."""
    path = str(tmp_path / "m.onnx")
    feeds = residual_block_model(path)
    engine, ops = engine_ops(kiln_bin, path, precision, tmp_path)
    print(precision, ops)
    assert "Add" not in ops and ops.count("FusedMatMul") == 1 and ops.count("FusedGemm") == 1, ops
    want = run_kiln(kiln_bin, path, feeds, ["x"], str(tmp_path / "cpu"), "--device", "cpu", "--no-optimize")["y"]
    got = run_kiln(kiln_bin, engine, feeds, ["x"], str(tmp_path / "gpu"))["y"]
    err = rel_l2(got, want)
    assert err <= (1e-4 if precision == "fp32" else 1e-2), f"{precision}: relative L2 error {err:.3g}"


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_patch_embedding_transpose_reads_the_convolution_as_stored(precision, kiln_bin, tmp_path):
    """A vision transformer's patch embedding: Conv, flatten(2), transpose(1, 2). kiln transposes
    the Conv's 4-D output instead (transpose_before_merge), which reads a channels-last output as
    it is stored: no Reformat between the Conv and the Transpose, and in float16 (channels-last
    convolutions) no Transpose either, since NHWC bytes read row-major are the transpose. Matches
    the unoptimized CPU engine."""
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array((rng.standard_normal([64, 3, 8, 8]) * 0.1).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[8, 8], strides=[8, 8]),
             helper.make_node("Reshape", ["c", "flat"], ["f"]),
             helper.make_node("Transpose", ["f"], ["y"], perm=[0, 2, 1])]
    graph = helper.make_graph(nodes, "patches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [w, numpy_helper.from_array(np.array([4, 64, 64], np.int64), "flat")])
    path = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    engine, ops = engine_ops(kiln_bin, path, precision, tmp_path)
    print(precision, ops)
    if precision == "fp16":
        # The input into channels-last, the Conv, the float16 result cast to the float32 output.
        assert ops == ["Reformat", "Conv", "Reformat"], ops
    else:
        assert "Reformat" not in ops, ops
        if "Transpose" in ops:
            assert ops.index("Transpose") == ops.index("Conv") + 1, ops
    x = rng.standard_normal([4, 3, 64, 64]).astype(np.float32)
    want = run_kiln(kiln_bin, path, [x], ["x"], str(tmp_path / "cpu"), "--device", "cpu", "--no-optimize")["y"]
    got = run_kiln(kiln_bin, engine, [x], ["x"], str(tmp_path / "gpu"))["y"]
    assert got.shape == want.shape == (4, 64, 64)
    err = rel_l2(got, want)
    assert err <= (1e-4 if precision == "fp32" else 1e-2), f"{precision}: relative L2 error {err:.3g}"


def convnext_block_model(path, channels=32, size=14, batch=2):
    """A ConvNeXt block as torch.onnx writes it, after a 1x1 Conv stem (so that the block's
    input, as inside a network, is a convolution's output): 7x7 depthwise Conv, Transpose to
    channels-last, LayerNormalization, MatMul + bias, Gelu (erf form), MatMul + bias, Transpose
    back, Mul by the layer scale, Add of the block's input."""
    rng = np.random.default_rng(3)
    c, hidden = channels, 4 * channels
    f = lambda name, shape, scale=1.0: numpy_helper.from_array(  # noqa: E731
        (rng.standard_normal(shape) * scale).astype(np.float32), name)
    inits = [f("stem_w", [c, c, 1, 1], c ** -0.5), f("stem_b", [c], 0.1), f("dw_w", [c, 1, 7, 7], 0.2), f("dw_b", [c], 0.1), f("ln_s", [c]), f("ln_b", [c], 0.1),
             f("w1", [c, hidden], c ** -0.5), f("b1", [hidden], 0.1), f("w2", [hidden, c], hidden ** -0.5),
             f("b2", [c], 0.1), f("gamma", [c, 1, 1]),
             numpy_helper.from_array(np.array(np.sqrt(0.5), np.float32), "rsqrt2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [helper.make_node("Conv", ["x", "stem_w", "stem_b"], ["h"]),
             helper.make_node("Conv", ["h", "dw_w", "dw_b"], ["dw"], group=c, pads=[3] * 4),
             helper.make_node("Transpose", ["dw"], ["t1"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t1", "ln_s", "ln_b"], ["ln"], axis=-1, epsilon=1e-6),
             helper.make_node("MatMul", ["ln", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Mul", ["a1", "rsqrt2"], ["g0"]), helper.make_node("Erf", ["g0"], ["g1"]),
             helper.make_node("Add", ["g1", "one"], ["g2"]), helper.make_node("Mul", ["a1", "g2"], ["g3"]),
             helper.make_node("Mul", ["g3", "half"], ["gelu"]),
             helper.make_node("MatMul", ["gelu", "w2"], ["m2"]), helper.make_node("Add", ["m2", "b2"], ["a2"]),
             helper.make_node("Transpose", ["a2"], ["t2"], perm=[0, 3, 1, 2]),
             helper.make_node("Mul", ["t2", "gamma"], ["scaled"]), helper.make_node("Add", ["scaled", "h"], ["y"])]
    graph = helper.make_graph(nodes, "convnext_block",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, c, size, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_convnext_block_transposes_move_no_bytes(precision, kiln_bin, tmp_path):
    """The Transposes of a ConvNeXt block between NCHW and NHWC read the channels-last
    convolution's output as it is stored and hand the block's end back channels-last: in float16
    (channels-last convolutions) neither runs as a layer and no Reformat takes their place, and
    the layer scale is folded into the second product (no Mul). The engine matches the
    unoptimized CPU engine in both precisions."""
    path = str(tmp_path / "m.onnx")
    convnext_block_model(path)
    engine, ops = engine_ops(kiln_bin, path, precision, tmp_path)
    print(precision, ops)
    if precision == "fp16":
        # Reformats only at the edges: the input into channels-last, the result to float32.
        assert "Transpose" not in ops and ops.count("Reformat") == 2 and ops[0] == ops[-1] == "Reformat", ops
    assert "Mul" not in ops, ops
    x = np.random.default_rng(5).standard_normal([2, 32, 14, 14]).astype(np.float32)
    want = run_kiln(kiln_bin, path, [x], ["x"], str(tmp_path / "cpu"), "--device", "cpu", "--no-optimize")["y"]
    got = run_kiln(kiln_bin, engine, [x], ["x"], str(tmp_path / "gpu"))["y"]
    assert got.shape == want.shape == (2, 32, 14, 14)
    err = rel_l2(got, want)
    assert err <= (1e-4 if precision == "fp32" else 1e-2), f"{precision}: relative L2 error {err:.3g}"


def conv_with_residual_model(path, x_shape, w, b, out_shape, residual, **conv_attrs):
    """Conv(x, w, b) with the attributes given, and Add of an input z of the output's shape when
    `residual`, into `path`."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **conv_attrs)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    if residual:
        nodes.append(helper.make_node("Add", ["c", "z"], ["y"]))
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, out_shape))
    else:
        nodes[0].output[0] = "y"
    graph = helper.make_graph(nodes, "conv", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def tactic_lines(kiln_bin, path, engine, marker):
    """Builds `path` into an fp16 GPU engine with every tactic candidate logged (KILN_TACTIC_LOG):
    the candidates' lines containing `marker`, none of them rejected by the build's check."""
    r = subprocess.run([kiln_bin, "build", path, "--device", "cuda", "--fp16", "-o", engine],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "KILN_TACTIC_LOG": "1"})
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if marker in line]
    print("\n".join(lines))
    assert lines, r.stderr[-3000:]
    assert all("(rejected)" not in line for line in lines), lines
    return lines


def engine_matches_cpu(kiln_bin, path, engine, feeds, out_shape, tmp_path):
    """The engine's y against the unoptimized CPU engine's on the same inputs (x, then z if given)."""
    names = ["x", "z"][:len(feeds)]
    want = run_kiln(kiln_bin, path, feeds, names, str(tmp_path / "cpu"), "--device", "cpu", "--no-optimize")["y"]
    got = run_kiln(kiln_bin, engine, feeds, names, str(tmp_path / "gpu"))["y"]
    assert got.shape == want.shape == tuple(out_shape)
    err = rel_l2(got, want)
    assert err <= 1e-2, f"relative L2 error {err:.3g}"


@pytest.mark.parametrize("channels,size,kernel,stride,residual",
                         [(3, 64, 8, 8, False), (16, 24, 2, 3, True), (8, 20, 1, 2, False)],
                         ids=["patch-embedding", "stride-past-kernel-residual", "strided-1x1"])
def test_patches_as_one_product(channels, size, kernel, stride, residual, kiln_bin, tmp_path):
    """A float16 convolution (channels-last) whose patches do not overlap (stride at least the
    kernel, no padding) is also timed as its patches gathered into rows and one cuBLASLt product. The build checks every
    candidate against a direct convolution (KILN_TACTIC_LOG shows each one's error): that
    candidate must be offered and correct, and the engine, whichever candidate won, must match
    the CPU engine."""
    rng = np.random.default_rng(channels)
    out_c = 32
    out_hw = (size - kernel) // stride + 1
    out_shape = [2, out_c, out_hw, out_hw]
    path, engine = str(tmp_path / "m.onnx"), str(tmp_path / "m.engine")
    conv_with_residual_model(path, [2, channels, size, size],
                             (rng.standard_normal([out_c, channels, kernel, kernel]) * 0.2).astype(np.float32),
                             rng.standard_normal(out_c).astype(np.float32), out_shape, residual,
                             kernel_shape=[kernel, kernel], strides=[stride, stride])
    tactic_lines(kiln_bin, path, engine, ": gemm patches+")
    feeds = [rng.standard_normal([2, channels, size, size]).astype(np.float32)]
    if residual:
        feeds.append(rng.standard_normal(out_shape).astype(np.float32))
    engine_matches_cpu(kiln_bin, path, engine, feeds, out_shape, tmp_path)


@pytest.mark.parametrize("kernel,stride,size,residual,channels",
                         [(7, 1, 17, True, 24), (7, 1, 23, False, 96), (7, 2, 19, False, 24), (5, 2, 15, True, 24),
                          (3, 1, 10, False, 48), (9, 1, 13, False, 24)],
                         ids=["7x7", "7x7-96-channels", "7x7-stride2", "5x5-stride2-residual", "3x3-48-channels",
                              "9x9-any-geometry"])
def test_depthwise_tiles_are_offered_and_exact(kernel, stride, size, residual, channels, kiln_bin, tmp_path):
    """kiln's float16 channels-last depthwise kernel is timed at every tile it has for the
    geometry: the path for any filter (1, 2 or 4 columns, 8 channels per thread), for 3x3, 5x5
    and 7x7 filters the compile-time one (4 channels per thread at 1x1 to 4x1, 2 at 2x1 to 4x4),
    and for those filters square at stride 1 the staged one (the input tile in shared memory, the
    filters there too or in registers; a block's slice of 32, 16 or 8 channels where it divides
    the channels; 8x2 or 4x2 outputs per thread). The build checks each candidate against a direct convolution (KILN_TACTIC_LOG shows
    each one's error): each expected tile must be offered and correct, and the engine, whichever
    candidate won, must match the CPU engine. Sizes that are not multiples of the tiles and a
    batch of 3 cover the edges of the last band and block."""
    rng = np.random.default_rng(kernel * 10 + stride)
    out_hw = (size + 2 * (kernel // 2) - kernel) // stride + 1
    out_shape = [3, channels, out_hw, out_hw]
    path, engine = str(tmp_path / "m.onnx"), str(tmp_path / "m.engine")
    conv_with_residual_model(path, [3, channels, size, size],
                             (rng.standard_normal([channels, 1, kernel, kernel]) * 0.2).astype(np.float32),
                             rng.standard_normal(channels).astype(np.float32), out_shape, residual,
                             group=channels, pads=[kernel // 2] * 4, strides=[stride, stride])
    lines = tactic_lines(kiln_bin, path, engine, ": kernel depthwise ")
    offered = {line.split(": kernel depthwise ")[1].split()[0] for line in lines}
    expected = {"1x1/any/c8", "2x1/any/c8", "4x1/any/c8"}
    if kernel <= 7:
        expected |= {"1x1/fixed/c4", "2x1/fixed/c4", "4x1/fixed/c4", "2x1/fixed/c2", "2x2/fixed/c2", "4x2/fixed/c2",
                     "4x4/fixed/c2"}
    if kernel <= 7 and stride == 1:
        expected |= {f"{tile}/{path}/c{slice}" for tile in ("8x2", "4x2") for path in ("staged", "staged-rf")
                     for slice in (32, 16, 8) if channels % slice == 0}
    assert offered == expected, offered
    feeds = [rng.standard_normal([3, channels, size, size]).astype(np.float32)]
    if residual:
        feeds.append(rng.standard_normal(out_shape).astype(np.float32))
    engine_matches_cpu(kiln_bin, path, engine, feeds, out_shape, tmp_path)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_query_key_value_projections_run_as_one_product(precision, kiln_bin, tmp_path):
    """BERT's self-attention: Q, K and V each projected from x by MatMul and a bias Add, heads
    split by Reshape and Transpose, a padding mask. The three projections run as one FusedMatMul
    of 3E columns whose heads the StridedAttention layer reads in place (no Split, no copies), and
    the output matches the unoptimized CPU engine."""
    batch, seq, heads, head = 2, 13, 3, 16
    width = heads * head
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(np.array([batch, seq, heads, head], np.int64), "split_heads"),
             numpy_helper.from_array(np.array([batch, seq, width], np.int64), "merge_heads"),
             numpy_helper.from_array(np.array(np.sqrt(head), np.float32), "root")]
    nodes = []
    for n in ("q", "k", "v"):
        inits += [numpy_helper.from_array((rng.standard_normal([width, width]) * 0.1).astype(np.float32), f"w_{n}"),
                  numpy_helper.from_array((rng.standard_normal([width]) * 0.1).astype(np.float32), f"b_{n}")]
        nodes += [helper.make_node("MatMul", ["x", f"w_{n}"], [f"{n}_mm"]),
                  helper.make_node("Add", [f"{n}_mm", f"b_{n}"], [f"{n}_proj"]),
                  helper.make_node("Reshape", [f"{n}_proj", "split_heads"], [f"{n}_bshd"]),
                  helper.make_node("Transpose", [f"{n}_bshd"], [n], perm=[0, 2, 3, 1] if n == "k" else [0, 2, 1, 3])]
    nodes += [helper.make_node("MatMul", ["q", "k"], ["s"]),
              helper.make_node("Div", ["s", "root"], ["sd"]),
              helper.make_node("Add", ["sd", "mask"], ["sm"]),
              helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y4"]),
              helper.make_node("Transpose", ["y4"], ["y_bshd"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["y_bshd", "merge_heads"], ["y"])]
    graph = helper.make_graph(nodes, "bert_self_attention",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, width]),
                               helper.make_tensor_value_info("mask", TensorProto.FLOAT, [batch, 1, 1, seq])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    engine, ops = engine_ops(kiln_bin, path, precision, tmp_path)
    print(precision, ops)
    assert [op for op in ops if op != "Reformat"] == ["FusedMatMul", "StridedAttention"], ops
    x = rng.standard_normal([batch, seq, width]).astype(np.float32)
    mask = np.zeros([batch, 1, 1, seq], np.float32)
    mask[1, ..., -4:] = np.finfo(np.float32).min
    want = run_kiln(kiln_bin, path, [x, mask], ["x", "mask"], str(tmp_path / "cpu"), "--device", "cpu", "--no-optimize")["y"]
    got = run_kiln(kiln_bin, engine, [x, mask], ["x", "mask"], str(tmp_path / "gpu"))["y"]
    assert got.shape == want.shape == (batch, seq, width)
    err = rel_l2(got, want)
    assert err <= (1e-4 if precision == "fp32" else 1e-2), f"{precision}: relative L2 error {err:.3g}"


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("cols,bias", [(768, True), (40, True), (2048, False), (1032, True), (12, False), (96, True),
                                       (1024, False), (8, True)],
                         ids=["768", "40", "2048-no-bias", "1032", "12", "96", "1024-no-bias", "8"])
def test_layer_norm_rows_match_cpu(cols, bias, precision, kiln_bin, tmp_path):
    """LayerNormalization over the last axis matches the CPU engine with and without B, on rows
    whose mean is far from 0 (the variance is the mean of squared deviations, not E[x^2] -
    mean^2): float16 rows of a multiple of 8 up to 1024 elements held in registers by 4 to 32
    lanes (96 is ConvNeXt's first stage), other rows a warp per row up to 1024 elements and a
    block per row beyond."""
    rng = np.random.default_rng(cols)
    inits = [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(cols)).astype(np.float32), "scale")]
    ins = ["x", "scale"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(cols).astype(np.float32), "b"))
        ins.append("b")
    nodes = [helper.make_node("LayerNormalization", ins, ["y"], axis=-1, epsilon=1e-5)]
    graph = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 37, cols])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = (rng.standard_normal([3, 37, cols]) * 2 + 5).astype(np.float32)
    engine = str(tmp_path / "m.engine")
    subprocess.run([kiln_bin, "build", path, "--device", "cuda", f"--{precision}", "-o", engine], check=True,
                   capture_output=True, timeout=300)
    info = json.loads(subprocess.run([kiln_bin, "inspect", engine, "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    tactic = next(layer["tactic"] for layer in info["layers"] if layer["op"] == "LayerNormalization")
    vectorized = precision == "fp16" and cols % 8 == 0 and cols <= 1024
    assert tactic.startswith("kernel:norm-vec") == vectorized, tactic
    want = run_kiln(kiln_bin, path, [x], ["x"], str(tmp_path / "cpu"), "--device", "cpu")["y"]
    got = run_kiln(kiln_bin, engine, [x], ["x"], str(tmp_path / "gpu"))["y"]
    err = rel_l2(got, want)
    assert err <= (1e-5 if precision == "fp32" else 3e-3), f"cols {cols} {precision}: relative L2 error {err:.3g}"


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_nd_matches_cpu_and_refuses_an_index_out_of_range(reduction, tmp_path):
    """A Swin-style ScatterND (rows of a [windows, tokens, channels] tensor replaced or combined
    through runtime indices) on the GPU layer against the CPU engine; an index past its dimension
    makes run() raise, naming ScatterND, and the next valid run answers right."""
    import kiln

    nodes = [helper.make_node("Relu", ["data"], ["d"]),
             helper.make_node("ScatterND", ["d", "indices", "updates"], ["y"], reduction=reduction)]
    graph = helper.make_graph(nodes, "scatter", [helper.make_tensor_value_info("data", TensorProto.FLOAT, [6, 10, 8]),
                                                 helper.make_tensor_value_info("indices", TensorProto.INT64, [4, 2]),
                                                 helper.make_tensor_value_info("updates", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 10, 8])])
    path = str(tmp_path / f"scatter_{reduction}.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    assert [l["tactic"] for l in gpu.info()["layers"] if l["op"] == "ScatterND"] == ["kernel:scatter-nd"]
    rng = np.random.default_rng(3)
    feed = {"data": rng.standard_normal((6, 10, 8)).astype(np.float32),
            "indices": np.array([[0, 1], [5, 9], [-1, 2], [3, 0]], dtype=np.int64),
            "updates": rng.standard_normal((4, 8)).astype(np.float32)}
    for _ in range(2):
        got, want = gpu.run(feed)["y"], cpu.run(feed)["y"]
        assert np.allclose(got, want, rtol=1e-6, atol=1e-6), np.abs(got - want).max()
        bad = dict(feed, indices=np.array([[0, 1], [6, 0], [1, 1], [2, 2]], dtype=np.int64))
        with pytest.raises(kiln.Error, match="ScatterND: an index is outside"):
            gpu.run(bad)


def test_gather_with_an_index_out_of_range_raises_instead_of_answering(tmp_path):
    """An embedding lookup (Gather of runtime token ids): valid ids give the CPU engine's rows; an
    id past the table makes run() raise, naming the node, and the next valid run answers right."""
    import kiln

    table = numpy_helper.from_array(np.random.default_rng(4).standard_normal((50, 16)).astype(np.float32), "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["y"], name="embed", axis=0)]
    graph = helper.make_graph(nodes, "embed", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 16])], [table])
    path = str(tmp_path / "embed.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    good = {"ids": np.array([[0, 1, 49, -1, 7], [3, 3, 10, -50, 2]], dtype=np.int64)}
    for _ in range(2):
        assert np.array_equal(gpu.run(good)["y"], cpu.run(good)["y"])
        with pytest.raises(kiln.Error, match="Gather 'embed': an index is outside the data's axis of 50"):
            gpu.run({"ids": np.array([[0, 1, 50, 2, 7], [3, 3, 10, 4, 2]], dtype=np.int64)})


@pytest.mark.parametrize("mode,coordinates,ratio", [("avg", "half_pixel", 0), ("avg", "output_half_pixel", 2),
                                                     ("max", "half_pixel", 2), ("max", "output_half_pixel", 0)])
def test_roi_align_matches_the_cpu_engine_bit_for_bit_and_refuses_a_batch_index_out_of_range(mode, coordinates, ratio,
                                                                                          tmp_path):
    """RoiAlign on its GPU layer against the CPU engine, which share their arithmetic
    (src/ops/roi_align_params.h): the same bits for regions inside, across and outside the
    feature map, an empty one and one of many samples per bin; under --fp16 (X arrives in
    float16 storage and RoiAlign keeps float32) within float16's rounding. A batch index past X's
    batch makes run() raise, naming the node, and the next valid run answers right."""
    import kiln

    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("RoiAlign", ["r", "rois", "batch"], ["y"], name="pool", mode=mode,
                              coordinate_transformation_mode=coordinates, output_height=5, output_width=4,
                              sampling_ratio=ratio, spatial_scale=0.25)]
    graph = helper.make_graph(nodes, "roi", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 20, 24]),
                                             helper.make_tensor_value_info("rois", TensorProto.FLOAT, [6, 4]),
                                             helper.make_tensor_value_info("batch", TensorProto.INT64, [6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 16, 5, 4])])
    path = str(tmp_path / "roi.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    half = kiln.Builder(device="cuda", precision="fp16", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    assert [l["tactic"] for l in gpu.info()["layers"] if l["op"] == "RoiAlign"] == ["kernel:roi-align"]
    rng = np.random.default_rng(11)
    rois = np.array([[4, 8, 60, 70], [-20, -10, 30, 40], [70, 60, 120, 100], [10, 10, 10, 10], [0, 0, 96, 80],
                     [33.3, 17.1, 41.9, 29.5]], dtype=np.float32)
    feed = {"x": rng.standard_normal((2, 16, 20, 24)).astype(np.float32), "rois": rois,
            "batch": np.array([0, 1, 1, 0, 1, 0], dtype=np.int64)}
    for _ in range(2):
        want = cpu.run(feed)["y"]
        assert np.array_equal(gpu.run(feed)["y"], want)
        assert rel_l2(half.run(feed)["y"], want) < 2e-3
        with pytest.raises(kiln.Error, match="RoiAlign 'pool': a batch index is outside X's batch of 2"):
            gpu.run(dict(feed, batch=np.array([0, 1, 2, 0, 1, 0], dtype=np.int64)))


@pytest.mark.parametrize("batch_axis,dtype", [(0, np.float32), (1, np.float32), (1, np.int64), (0, np.float16)])
def test_reverse_sequence_matches_the_cpu_engine_and_refuses_a_length_past_the_time_axis(batch_axis, dtype, tmp_path):
    """ReverseSequence on its GPU layer against the CPU engine, batch first or time first, for
    float and integer data; a sequence length past the time axis makes run() raise, naming the
    node, and the next valid run answers right."""
    import kiln

    elem = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64, np.float16: TensorProto.FLOAT16}[dtype]
    shape = [3, 7, 5, 2] if batch_axis == 0 else [7, 3, 5, 2]
    nodes = [helper.make_node("ReverseSequence", ["x", "lens"], ["y"], name="reverse", batch_axis=batch_axis,
                              time_axis=1 - batch_axis)]
    graph = helper.make_graph(nodes, "reverse", [helper.make_tensor_value_info("x", elem, shape),
                                                 helper.make_tensor_value_info("lens", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", elem, shape)])
    path = str(tmp_path / "reverse.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    x = (np.random.default_rng(6).standard_normal(shape) * 100).astype(dtype)
    good = np.array([7, 0, 4], dtype=np.int64)
    for _ in range(2):
        got, want = gpu.run({"x": x, "lens": good})["y"], cpu.run({"x": x, "lens": good})["y"]
        assert np.array_equal(got, want)
        with pytest.raises(kiln.Error, match=r"ReverseSequence 'reverse': a sequence_lens value is outside \[0, 7\]"):
            gpu.run({"x": x, "lens": np.array([7, 8, 1], dtype=np.int64)})


@pytest.mark.parametrize("equation,shapes,dtype", [
    ("bij,bjk->bik", [(3, 4, 5), (3, 5, 6)], np.float32),
    ("ij->ji", [(4, 7)], np.float32),
    ("ii->i", [(5, 5)], np.float64),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)], np.float32),
    ("ij,ij->", [(6, 9), (6, 9)], np.float32),
    ("bhqd,bhkd->bhqk", [(2, 3, 8, 16), (2, 3, 10, 16)], np.float32),
    ("i,j,k->ijk", [(3,), (4,), (2,)], np.int64),
    ("ij,jk", [(3, 4), (4, 2)], np.int32),
])
def test_einsum_matches_the_cpu_engine_bit_for_bit(equation, shapes, dtype, tmp_path):
    """Einsum on its GPU layer against the CPU engine, which sum the same products in the same
    order and types: equal bits for contractions, transposes, diagonals, broadcast ellipses,
    full sums, outer products and implicit outputs, in float and integer types."""
    import kiln

    elem = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.int64: TensorProto.INT64,
            np.int32: TensorProto.INT32}[dtype]
    names = [f"x{i}" for i in range(len(shapes))]
    graph = helper.make_graph([helper.make_node("Einsum", names, ["y"], name="einsum", equation=equation)], "einsum",
                              [helper.make_tensor_value_info(n, elem, list(s)) for n, s in zip(names, shapes)],
                              [helper.make_tensor_value_info("y", elem, None)])
    path = str(tmp_path / "einsum.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    assert [l["tactic"] for l in gpu.info()["layers"] if l["op"] == "Einsum"] == ["kernel:einsum-direct"]
    rng = np.random.default_rng(7)
    feed = {n: (rng.standard_normal(s) * 10).astype(dtype) for n, s in zip(names, shapes)}
    got, want = gpu.run(feed)["y"], cpu.run(feed)["y"]
    assert got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize("op,direction,layout,extras", [
    ("LSTM", "bidirectional", 0, {"peepholes": True, "clip": 2.5}),
    ("LSTM", "reverse", 1, {"input_forget": 1}),
    ("GRU", "bidirectional", 1, {"linear_before_reset": 1}),
    ("GRU", "forward", 0, {"activations": ["HardSigmoid", "Softsign"], "activation_alpha": [0.3], "activation_beta": [0.4]}),
    ("RNN", "bidirectional", 0, {"activations": ["Relu", "LeakyRelu"], "activation_alpha": [0.05]}),
])
def test_recurrent_layers_match_the_cpu_engine_and_refuse_a_length_past_the_sequence(op, direction, layout, extras,
                                                                                     tmp_path):
    """RNN, GRU and LSTM on their GPU layer against the CPU engine with every input (bias,
    sequence_lens with entries of different lengths, initial states, LSTM's peepholes) and the
    attributes that change the arithmetic (directions, batch-first layout, clip, activations,
    GRU's linear_before_reset, LSTM's input_forget): Y, Y_h and Y_c agree within float32 rounding of
    the activations, and under --fp16 (the layer keeps float32 state) within float16's rounding of
    what reaches it. A sequence length
    past seq_length makes run() raise, naming the node, and the next valid run answers right."""
    import kiln

    seq, batch, feat, hidden = 9, 3, 5, 16
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    dirs = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(8)
    weights = [numpy_helper.from_array((rng.standard_normal(shape) * 0.4).astype(np.float32), name) for name, shape in
               [("w", (dirs, gates * hidden, feat)), ("r", (dirs, gates * hidden, hidden)), ("b", (dirs, 2 * gates * hidden))]]
    inputs = ["x", "w", "r", "b", "lens", "h0"]
    state = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, feat] if layout else [seq, batch, feat]),
                    helper.make_tensor_value_info("lens", TensorProto.INT32, [batch]),
                    helper.make_tensor_value_info("h0", TensorProto.FLOAT, state)]
    outputs = ["y", "y_h"]
    attrs = {k: v for k, v in extras.items() if k != "peepholes"}
    if op == "LSTM":
        inputs.append("c0")
        graph_inputs.append(helper.make_tensor_value_info("c0", TensorProto.FLOAT, state))
        outputs.append("y_c")
        if extras.get("peepholes"):
            inputs.append("p")
            weights.append(numpy_helper.from_array((rng.standard_normal((dirs, 3 * hidden)) * 0.4).astype(np.float32), "p"))
    node = helper.make_node(op, inputs, outputs, name="cell", hidden_size=hidden, direction=direction, layout=layout, **attrs)
    graph = helper.make_graph([node], "recurrent", graph_inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], weights)
    path = str(tmp_path / "recurrent.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    half = kiln.Builder(device="cuda", precision="fp16", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    assert [l["tactic"] for l in gpu.info()["layers"] if l["op"] == op] == ["kernel:recurrent"]
    feed = {"x": rng.standard_normal([batch, seq, feat] if layout else [seq, batch, feat]).astype(np.float32),
            "lens": np.array([seq, 4, 0], dtype=np.int32), "h0": (rng.standard_normal(state) * 0.5).astype(np.float32)}
    if op == "LSTM":
        feed["c0"] = (rng.standard_normal(state) * 0.5).astype(np.float32)
    for _ in range(2):
        want = cpu.run(feed)
        for engine, tolerance in ((gpu, 1e-5), (half, 3e-3)):
            got = engine.run(feed)
            for name in outputs:
                assert got[name].shape == want[name].shape, name
                assert np.allclose(got[name], want[name], rtol=tolerance, atol=tolerance), (name, np.abs(got[name] - want[name]).max())
        with pytest.raises(kiln.Error, match=rf"{op} 'cell': a sequence_lens value is outside \[0, 9\]"):
            gpu.run(dict(feed, lens=np.array([seq, 10, 1], dtype=np.int32)))


def _byte_array(rng, shape, dtype):
    lo, hi = (-128, 128) if dtype == np.int8 else (0, 256)
    return rng.integers(lo, hi, size=shape).astype(dtype)


@pytest.mark.parametrize("a_type,b_type,zero_kind", [(np.uint8, np.int8, "row_column"), (np.int8, np.int8, "tensor"),
                                                     (np.uint8, np.uint8, "none")])
def test_matmul_integer_and_dynamic_quantize_match_the_cpu_engine(a_type, b_type, zero_kind, tmp_path):
    """ONNX Runtime's dynamic quantization as it writes it (DynamicQuantizeLinear of the
    activations, MatMulInteger by int8 weights with zero points, then a float rescale) and
    MatMulInteger alone with batch dims that broadcast and zero points per tensor or per row and
    column: the GPU's own layers give the CPU engine's integers and scales exactly."""
    import kiln

    rng = np.random.default_rng(12)
    a_elem = TensorProto.INT8 if a_type == np.int8 else TensorProto.UINT8
    b_elem = TensorProto.INT8 if b_type == np.int8 else TensorProto.UINT8
    inputs, feed, names = [], {}, ["a", "b"]
    a = _byte_array(rng, (2, 1, 6, 40), a_type)
    b = _byte_array(rng, (3, 40, 7), b_type)
    feed.update(a=a, b=b)
    inputs += [helper.make_tensor_value_info("a", a_elem, list(a.shape)), helper.make_tensor_value_info("b", b_elem, list(b.shape))]
    if zero_kind != "none":
        za = _byte_array(rng, (6,) if zero_kind == "row_column" else (), a_type)
        zb = _byte_array(rng, (7,) if zero_kind == "row_column" else (), b_type)
        feed.update(za=za, zb=zb)
        inputs += [helper.make_tensor_value_info("za", a_elem, list(za.shape)), helper.make_tensor_value_info("zb", b_elem, list(zb.shape))]
        names += ["za", "zb"]
    weights = numpy_helper.from_array(_byte_array(rng, (16, 5), np.int8), "w")
    w_zero = numpy_helper.from_array(np.array(3, dtype=np.int8), "w_zero")
    nodes = [helper.make_node("MatMulInteger", names, ["y"], name="product"),
             helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zero"], name="dynamic"),
             helper.make_node("MatMulInteger", ["xq", "w", "x_zero", "w_zero"], ["xw"], name="projection")]
    x = (rng.standard_normal((4, 16)) * 3 + 0.5).astype(np.float32)
    feed["x"] = x
    inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16]))
    outputs = [helper.make_tensor_value_info(n, t, None) for n, t in
               [("y", TensorProto.INT32), ("xq", TensorProto.UINT8), ("x_scale", TensorProto.FLOAT),
                ("x_zero", TensorProto.UINT8), ("xw", TensorProto.INT32)]]
    graph = helper.make_graph(nodes, "integer", inputs, outputs, [weights, w_zero])
    path = str(tmp_path / "integer.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    assert sorted(l["tactic"] for l in gpu.info()["layers"] if l["op"] in ("MatMulInteger", "DynamicQuantizeLinear")) == \
        ["kernel:dynamic-quantize", "kernel:integer-matmul", "kernel:integer-matmul"]
    got, want = gpu.run(feed), cpu.run(feed)
    for name in ("y", "xq", "x_scale", "x_zero", "xw"):
        assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), name


@pytest.mark.parametrize("y_type,scale_type", [(np.int8, np.float32), (np.uint8, np.float16)])
def test_qlinear_matmul_matches_the_cpu_engine(y_type, scale_type, tmp_path):
    """QLinearMatMul with float32 and float16 scales given as runtime inputs: the GPU layer
    requantizes to the CPU engine's integers exactly."""
    import kiln

    rng = np.random.default_rng(13)
    q_elem = TensorProto.INT8 if y_type == np.int8 else TensorProto.UINT8
    s_elem = TensorProto.FLOAT if scale_type == np.float32 else TensorProto.FLOAT16
    feed = {"a": _byte_array(rng, (5, 33), y_type), "a_scale": np.array(0.021, dtype=scale_type),
            "a_zero": _byte_array(rng, (), y_type), "b": _byte_array(rng, (33, 9), y_type),
            "b_scale": np.array(0.013, dtype=scale_type), "b_zero": _byte_array(rng, (), y_type),
            "y_scale": np.array(0.37, dtype=scale_type), "y_zero": _byte_array(rng, (), y_type)}
    elem = {"a": q_elem, "b": q_elem, "a_zero": q_elem, "b_zero": q_elem, "y_zero": q_elem, "a_scale": s_elem,
            "b_scale": s_elem, "y_scale": s_elem}
    order = ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero", "y_scale", "y_zero"]
    graph = helper.make_graph([helper.make_node("QLinearMatMul", order, ["y"], name="product")], "qlinear",
                              [helper.make_tensor_value_info(n, elem[n], list(feed[n].shape)) for n in order],
                              [helper.make_tensor_value_info("y", q_elem, [5, 9])])
    path = str(tmp_path / "qlinear.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    got, want = gpu.run(feed)["y"], cpu.run(feed)["y"]
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert len(np.unique(want)) > 20  # a spread of values, not all saturated


@pytest.mark.parametrize("op,group,stride,pads,w_zero_kind", [("ConvInteger", 1, 1, [1, 1, 1, 1], "channel"),
                                                               ("ConvInteger", 2, 2, [0, 1, 2, 0], "tensor"),
                                                               ("QLinearConv", 1, 2, [1, 1, 1, 1], "tensor"),
                                                               ("QLinearConv", 4, 1, [1, 0, 1, 0], "tensor")])
def test_integer_convolutions_match_the_cpu_engine(op, group, stride, pads, w_zero_kind, tmp_path):
    """ConvInteger and QLinearConv (per-channel weight zero points or scales, int32 bias, groups,
    strides, asymmetric pads) on their GPU layer: the CPU engine's integers exactly."""
    import kiln

    rng = np.random.default_rng(14)
    c, m = 8, 12
    x = _byte_array(rng, (2, c, 9, 11), np.uint8)
    w = _byte_array(rng, (m, c // group, 3, 3), np.int8)
    init = [numpy_helper.from_array(w, "w")]
    if op == "ConvInteger":
        w_zero = _byte_array(rng, (m,) if w_zero_kind == "channel" else (), np.int8)
        init += [numpy_helper.from_array(np.array(7, dtype=np.uint8), "x_zero"), numpy_helper.from_array(w_zero, "w_zero")]
        node = helper.make_node(op, ["x", "w", "x_zero", "w_zero"], ["y"], name="conv", group=group, strides=[stride, stride],
                                pads=pads, kernel_shape=[3, 3])
        y_elem = TensorProto.INT32
    else:
        init += [numpy_helper.from_array(np.array(0.02, dtype=np.float32), "x_scale"),
                 numpy_helper.from_array(np.array(9, dtype=np.uint8), "x_zero"),
                 numpy_helper.from_array((rng.random(m) * 0.01 + 0.001).astype(np.float32), "w_scale"),
                 numpy_helper.from_array(np.array(0, dtype=np.int8), "w_zero"),
                 numpy_helper.from_array(np.array(0.5, dtype=np.float32), "y_scale"),
                 numpy_helper.from_array(np.array(120, dtype=np.uint8), "y_zero"),
                 numpy_helper.from_array(rng.integers(-3000, 3000, size=m).astype(np.int32), "bias")]
        node = helper.make_node(op, ["x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "y_scale", "y_zero", "bias"], ["y"],
                                name="conv", group=group, strides=[stride, stride], pads=pads)
        y_elem = TensorProto.UINT8
    graph = helper.make_graph([node], "integer_conv", [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
                              [helper.make_tensor_value_info("y", y_elem, None)], init)
    path = str(tmp_path / "conv.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    assert [l["tactic"] for l in gpu.info()["layers"] if l["op"] == op] == ["kernel:integer-conv"]
    got, want = gpu.run({"x": x})["y"], cpu.run({"x": x})["y"]
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    if op == "QLinearConv":
        assert len(np.unique(want)) > 20


@pytest.mark.parametrize("with_past,with_bias,activation,length", [(True, True, "silu", 37), (False, False, "none", 5),
                                                                    (True, False, "swish", 1)])
def test_causal_conv_with_state_matches_the_cpu_engine(with_past, with_bias, activation, length, tmp_path):
    """CausalConvWithState (a Mamba-style decoder's causal depthwise convolution) on its GPU layer
    against the CPU engine: the output and the state it hands to the next call, with and without
    a carried state and bias, SiLU or none, for a prefill and a one-token decode step."""
    import kiln

    rng = np.random.default_rng(15)
    batch, channels, kernel = 3, 24, 4
    feed = {"x": rng.standard_normal((batch, channels, length)).astype(np.float32)}
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, channels, length])]
    init = [numpy_helper.from_array(rng.standard_normal((channels, 1, kernel)).astype(np.float32), "w")]
    names = ["x", "w", "", ""]
    if with_bias:
        init.append(numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "bias"))
        names[2] = "bias"
    if with_past:
        feed["past"] = rng.standard_normal((batch, channels, kernel - 1)).astype(np.float32)
        inputs.append(helper.make_tensor_value_info("past", TensorProto.FLOAT, [batch, channels, kernel - 1]))
        names[3] = "past"
    while names[-1] == "":
        names.pop()
    node = helper.make_node("CausalConvWithState", names, ["y", "state"], name="conv", activation=activation)
    graph = helper.make_graph([node], "causal", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                                                         helper.make_tensor_value_info("state", TensorProto.FLOAT, None)], init)
    path = str(tmp_path / "causal.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 27)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    assert [l["tactic"] for l in gpu.info()["layers"] if l["op"] == "CausalConvWithState"] == ["kernel:causal-conv"]
    got, want = gpu.run(feed), cpu.run(feed)
    for name in ("y", "state"):
        assert got[name].shape == want[name].shape and np.allclose(got[name], want[name], rtol=1e-5, atol=1e-6), name


@pytest.mark.parametrize("rule,q_heads,kv_heads,decay_per_key_dim,beta_per_head,with_past", [
    ("gated_delta", 8, 4, False, True, True), ("gated_delta", 4, 4, True, False, False), ("delta", 6, 2, False, True, True),
    ("gated", 4, 2, True, False, True), ("linear", 2, 2, False, False, False)])
def test_linear_attention_matches_the_cpu_engine(rule, q_heads, kv_heads, decay_per_key_dim, beta_per_head, with_past,
                                                 tmp_path):
    """LinearAttention (Gated DeltaNet and its relatives) on its GPU layer against the CPU engine
    for every update rule, grouped query heads, decay per head or per key dim, beta per head or
    one for all, with and without a carried state: the output and the state after the last step."""
    import kiln

    rng = np.random.default_rng(16)
    batch, length, dk, dv = 2, 11, 32, 48
    shapes = {"q": [batch, length, q_heads * dk], "k": [batch, length, kv_heads * dk], "v": [batch, length, kv_heads * dv]}
    feed = {"q": rng.standard_normal(shapes["q"]).astype(np.float32) * 0.3,
            "k": rng.standard_normal(shapes["k"]).astype(np.float32) * 0.3,
            "v": rng.standard_normal(shapes["v"]).astype(np.float32)}
    names = ["q", "k", "v", "", "", ""]
    if with_past:
        shapes["past"] = [batch, kv_heads, dk, dv]
        feed["past"] = rng.standard_normal(shapes["past"]).astype(np.float32) * 0.1
        names[3] = "past"
    if "gated" in rule:
        shapes["decay"] = [batch, length, kv_heads * dk if decay_per_key_dim else kv_heads]
        feed["decay"] = -rng.random(shapes["decay"]).astype(np.float32) * 0.2
        names[4] = "decay"
    if "delta" in rule:
        shapes["beta"] = [batch, length, kv_heads if beta_per_head else 1]
        feed["beta"] = rng.random(shapes["beta"]).astype(np.float32)
        names[5] = "beta"
    while names[-1] == "":
        names.pop()
    node = helper.make_node("LinearAttention", names, ["y", "state"], name="attention", update_rule=rule,
                            q_num_heads=q_heads, kv_num_heads=kv_heads)
    graph = helper.make_graph([node], "linear", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes[n]) for n in feed],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("state", TensorProto.FLOAT, None)])
    path = str(tmp_path / "linear.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 27)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    assert [l["tactic"] for l in gpu.info()["layers"] if l["op"] == "LinearAttention"] == ["kernel:linear-attention"]
    got, want = gpu.run(feed), cpu.run(feed)
    for name in ("y", "state"):
        assert got[name].shape == want[name].shape, name
        assert rel_l2(got[name], want[name]) < 1e-5, (name, rel_l2(got[name], want[name]))


@pytest.mark.parametrize("mode,dtype", [("linear", np.float32), ("circular", np.float16), ("circular", np.int64)])
def test_tensor_scatter_matches_the_cpu_engine_and_refuses_a_write_outside_the_cache(mode, dtype, tmp_path):
    """TensorScatter (a KV cache updated in place of a Concat) on its GPU layer against the CPU
    engine, each batch entry at its own write index; circularly, rows past the cache's end wrap
    to its start, and an index past the length wraps too. A write index that puts rows outside a linear cache (or a
    negative one) makes run() raise, naming the node, and the next valid run answers right."""
    import kiln

    elem = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.int64: TensorProto.INT64}[dtype]
    batch, heads, length, dim = 3, 2, 10, 8
    rows = 4 if mode == "linear" else 6
    cache_shape, update_shape = [batch, heads, length, dim], [batch, heads, rows, dim]
    node = helper.make_node("TensorScatter", ["cache", "update", "at"], ["y"], name="kv", mode=mode, axis=2)
    graph = helper.make_graph([node], "kv", [helper.make_tensor_value_info("cache", elem, cache_shape),
                                             helper.make_tensor_value_info("update", elem, update_shape),
                                             helper.make_tensor_value_info("at", TensorProto.INT64, [batch])],
                              [helper.make_tensor_value_info("y", elem, cache_shape)])
    path = str(tmp_path / "kv.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    rng = np.random.default_rng(17)
    feed = {"cache": (rng.standard_normal(cache_shape) * 50).astype(dtype),
            "update": (rng.standard_normal(update_shape) * 50).astype(dtype),
            "at": np.array([0, 6, 3] if mode == "linear" else [7, 0, 25], dtype=np.int64)}
    for _ in range(2):
        got, want = gpu.run(feed)["y"], cpu.run(feed)["y"]
        assert np.array_equal(got, want)
        with pytest.raises(kiln.Error, match="TensorScatter 'kv': a write index puts the update's rows outside the cache"):
            gpu.run(dict(feed, at=np.array([0, 7 if mode == "linear" else -1, 1], dtype=np.int64)))


def test_swiglu_matches_the_cpu_engine(tmp_path):
    """SwiGLU (opset 28) on its GPU layer against the CPU engine, alpha given, under fp32 and
    fp16 storage."""
    import kiln

    shape = [4, 7, 96]
    graph = helper.make_graph([helper.make_node("SwiGLU", ["a", "b"], ["y"], name="glu", alpha=1.702)], "glu",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, shape),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    path = str(tmp_path / "glu.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 28)]), path)
    cpu = kiln.Builder(device="cpu").build(path)
    rng = np.random.default_rng(18)
    feed = {"a": rng.standard_normal(shape).astype(np.float32) * 3, "b": rng.standard_normal(shape).astype(np.float32)}
    want = cpu.run(feed)["y"]
    for precision, tolerance in (("fp32", 1e-6), ("fp16", 3e-3)):
        gpu = kiln.Builder(device="cuda", precision=precision, allow_cpu_fallback=False).build(path)
        assert [l["tactic"] for l in gpu.info()["layers"] if l["op"] == "SwiGLU"] == ["kernel:swiglu"]
        assert rel_l2(gpu.run(feed)["y"], want) < tolerance, precision


@pytest.mark.parametrize("length,inverse,onesided,axis,complex_input", [(None, 0, 0, 1, True), (12, 0, 1, 1, False),
                                                                       (16, 1, 1, 2, True), (7, 1, 0, 2, True)])
def test_dft_matches_the_cpu_engine(length, inverse, onesided, axis, complex_input, tmp_path):
    """DFT on its GPU layer (direct sums in double) against the CPU engine (a radix-2 FFT for
    powers of two, else direct): forward, one-sided, inverse and the one-sided inverse's real
    output, padded and truncated lengths, along either axis; within float32 rounding."""
    import kiln

    shape = [2, 10, 9, 2 if complex_input else 1]
    init = [numpy_helper.from_array(np.array(axis, dtype=np.int64), "axis")]
    names = ["x", "", "axis"]
    if length is not None:
        init.append(numpy_helper.from_array(np.array(length, dtype=np.int64), "length"))
        names[1] = "length"
    node = helper.make_node("DFT", names, ["y"], name="dft", inverse=inverse, onesided=onesided)
    graph = helper.make_graph([node], "dft", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    path = str(tmp_path / "dft.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    assert [l["tactic"] for l in gpu.info()["layers"] if l["op"] == "DFT"] == ["kernel:dft-direct"]
    x = np.random.default_rng(19).standard_normal(shape).astype(np.float32)
    got, want = gpu.run({"x": x})["y"], cpu.run({"x": x})["y"]
    assert got.shape == want.shape and rel_l2(got, want) < 1e-6, rel_l2(got, want)


@pytest.mark.parametrize("with_window,onesided", [(True, 1), (False, 0)])
def test_stft_and_det_match_the_cpu_engine(with_window, onesided, tmp_path):
    """STFT (frames of a signal, a Hann window or none, one-sided or full) and Det (a batch of
    matrices, singular ones among them) on their GPU layers against the CPU engine: STFT within
    float32 rounding, Det (the CPU's elimination, step by step) bit for bit."""
    import kiln

    rng = np.random.default_rng(20)
    frame = 24
    init = [numpy_helper.from_array(np.array(5, dtype=np.int64), "step"),
            numpy_helper.from_array(np.array(frame, dtype=np.int64), "frame")]
    names = ["signal", "step", "", "frame"]
    if with_window:
        init.append(numpy_helper.from_array(np.hanning(frame).astype(np.float32), "window"))
        names[2] = "window"
    nodes = [helper.make_node("STFT", names, ["spectrum"], name="stft", onesided=onesided),
             helper.make_node("Det", ["m"], ["det"], name="det")]
    graph = helper.make_graph(nodes, "stft", [helper.make_tensor_value_info("signal", TensorProto.FLOAT, [3, 200, 1]),
                                              helper.make_tensor_value_info("m", TensorProto.FLOAT, [4, 3, 6, 6])],
                              [helper.make_tensor_value_info("spectrum", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("det", TensorProto.FLOAT, None)], init)
    path = str(tmp_path / "stft.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    m = rng.standard_normal((4, 3, 6, 6)).astype(np.float32)
    m[1, 2, 3] = m[1, 2, 1]  # a singular matrix
    feed = {"signal": rng.standard_normal((3, 200, 1)).astype(np.float32), "m": m}
    got, want = gpu.run(feed), cpu.run(feed)
    assert got["spectrum"].shape == want["spectrum"].shape and rel_l2(got["spectrum"], want["spectrum"]) < 1e-6
    assert np.array_equal(got["det"], want["det"])


@pytest.mark.parametrize("dims,align_corners", [(2, 0), (3, 1)])
def test_center_crop_pad_and_affine_grid_match_the_cpu_engine(dims, align_corners, tmp_path):
    """CenterCropPad (cropping one axis, padding another, odd differences) and AffineGrid (2-D and
    3-D, with and without align_corners) with constant shapes, on their GPU layers: the CPU
    engine's values bit for bit."""
    import kiln

    sizes = [5, 7, 4] if dims == 3 else [6, 9]
    init = [numpy_helper.from_array(np.array([1, 3] + sizes, dtype=np.int64), "size"),
            numpy_helper.from_array(np.array([4, 11], dtype=np.int64), "crop")]
    nodes = [helper.make_node("AffineGrid", ["theta", "size"], ["grid"], name="affine", align_corners=align_corners),
             helper.make_node("CenterCropPad", ["x", "crop"], ["cropped"], name="crop", axes=[1, 2])]
    graph = helper.make_graph(nodes, "shapes", [helper.make_tensor_value_info("theta", TensorProto.FLOAT, [1, dims, dims + 1]),
                                                helper.make_tensor_value_info("x", TensorProto.INT32, [2, 7, 8, 3])],
                              [helper.make_tensor_value_info("grid", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("cropped", TensorProto.INT32, None)], init)
    path = str(tmp_path / "shapes.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    rng = np.random.default_rng(21)
    feed = {"theta": rng.standard_normal((1, dims, dims + 1)).astype(np.float32),
            "x": rng.integers(-1000, 1000, size=(2, 7, 8, 3)).astype(np.int32)}
    got, want = gpu.run(feed), cpu.run(feed)
    for name in ("grid", "cropped"):
        assert got[name].shape == want[name].shape and np.array_equal(got[name], want[name]), name
    assert want["cropped"].shape == (2, 4, 11, 3)


def test_einsum_too_large_for_the_gpu_layer_is_refused_by_name_and_runs_partitioned(tmp_path):
    """An Einsum of more than 2^24 products per output element is not taken by the GPU layer: a
    --strict build names the node and the reason, and the default build runs it on the CPU
    engine."""
    import kiln

    n = (1 << 24) + 1
    graph = helper.make_graph([helper.make_node("Einsum", ["a", "b"], ["y"], name="dot", equation="i,i->")], "dot",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    path = str(tmp_path / "dot.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(kiln.Error, match=r"dot \(Einsum\).*more than 2\^24 products per output element"):
        kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    with pytest.warns(UserWarning, match=r"dot \(Einsum\)"):
        engine = kiln.Builder(device="cuda").build(path)
    a = np.ones(n, dtype=np.float32)
    assert engine.run({"a": a, "b": a})["y"] == np.float32(n)


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_elements_with_an_index_out_of_range_raises_instead_of_answering(reduction, tmp_path):
    """ScatterElements along axis 1 with runtime indices matches the CPU engine (the last of
    several updates to one element wins without a reduction); an index past the axis makes run()
    raise, naming the node, with and without a reduction, and the next valid run answers right."""
    import kiln

    nodes = [helper.make_node("ScatterElements", ["data", "indices", "updates"], ["y"], name="scatter", axis=1,
                              reduction=reduction)]
    graph = helper.make_graph(nodes, "scatter", [helper.make_tensor_value_info("data", TensorProto.FLOAT, [3, 7]),
                                                 helper.make_tensor_value_info("indices", TensorProto.INT64, [3, 4]),
                                                 helper.make_tensor_value_info("updates", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7])])
    path = str(tmp_path / f"scatter_elements_{reduction}.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    rng = np.random.default_rng(5)
    feed = {"data": rng.standard_normal((3, 7)).astype(np.float32),
            "indices": np.array([[0, 6, -1, 2], [3, 3, 3, 1], [5, 4, 0, -7]], dtype=np.int64),
            "updates": rng.standard_normal((3, 4)).astype(np.float32)}
    for _ in range(2):
        got, want = gpu.run(feed)["y"], cpu.run(feed)["y"]
        assert np.allclose(got, want, rtol=1e-6, atol=1e-6), np.abs(got - want).max()
        bad = dict(feed, indices=np.array([[0, 1, 2, 3], [4, 7, 0, 1], [1, 1, 1, 1]], dtype=np.int64))
        with pytest.raises(kiln.Error, match="ScatterElements 'scatter': an index is outside"):
            gpu.run(bad)


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_losses_match_cpu_and_refuse_a_target_that_is_no_class(op, reduction, tmp_path):
    """NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss over [N, C, D1, D2] scores with class
    weights and an ignore_index, on the GPU's own layers (SoftmaxCrossEntropyLoss with its
    log-probability output too) against the CPU engine, for each reduction; a target that is no
    class makes run() raise, naming the node, and the next valid run answers right."""
    import kiln

    outputs = ["loss", "log_prob"] if op == "SoftmaxCrossEntropyLoss" else ["loss"]
    scores = "x" if op == "SoftmaxCrossEntropyLoss" else "logp"
    nodes = [helper.make_node("LogSoftmax", ["x"], ["logp"], axis=1)] if op == "NegativeLogLikelihoodLoss" else []
    nodes.append(helper.make_node(op, [scores, "target", "w"], outputs, name="loss_node", reduction=reduction,
                                  ignore_index=2))
    graph = helper.make_graph(nodes, "loss", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5, 4, 2]),
                                              helper.make_tensor_value_info("target", TensorProto.INT64, [3, 4, 2]),
                                              helper.make_tensor_value_info("w", TensorProto.FLOAT, [5])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
    path = str(tmp_path / f"{op}_{reduction}.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    gpu = kiln.Builder(device="cuda", allow_cpu_fallback=False).build(path)
    cpu = kiln.Builder(device="cpu").build(path)
    assert [l["tactic"] for l in gpu.info()["layers"] if l["name"] == "loss_node"] == \
        [f"kernel:{'softmax-cross-entropy' if op == 'SoftmaxCrossEntropyLoss' else 'nll'}({reduction})"]
    rng = np.random.default_rng(6)
    feed = {"x": rng.standard_normal((3, 5, 4, 2)).astype(np.float32),
            "target": rng.integers(0, 5, (3, 4, 2)).astype(np.int64),
            "w": rng.uniform(0.5, 2.0, 5).astype(np.float32)}
    for _ in range(2):
        got, want = gpu.run(feed), cpu.run(feed)
        for name in outputs:
            assert got[name].shape == want[name].shape, name
            assert np.allclose(got[name], want[name], rtol=1e-5, atol=1e-6), (name, np.abs(got[name] - want[name]).max())
        bad = dict(feed, target=np.where(feed["target"] == 2, 7, feed["target"]))
        bad["target"][0, 0, 0] = 5
        with pytest.raises(kiln.Error, match=f"{op} 'loss_node': a target is not a class"):
            gpu.run(bad)


def group_norm_model(path: str, shape: list[int], groups: int, form: str, act: str, seed: int):
    """A channel-group normalization of x [N, C, ...] and an activation, in one of the forms
    exporters write: "group" (GroupNormalization, opset 21), "exported" (torch.onnx's GroupNorm
    below opset 21: Reshape, InstanceNormalization of ones and zeros, Reshape, Mul, Add) or
    "instance" (InstanceNormalization)."""
    rng = np.random.default_rng(seed)
    c, rank = shape[1], len(shape)
    gamma = (1 + 0.3 * rng.standard_normal(c)).astype(np.float32)
    beta = (0.5 * rng.standard_normal(c)).astype(np.float32)
    per_channel = [c] + [1] * (rank - 2)
    inits, opset = [], 17
    if form == "group":
        opset = 21
        inits += [numpy_helper.from_array(gamma, "gamma"), numpy_helper.from_array(beta, "beta")]
        nodes = [helper.make_node("GroupNormalization", ["x", "gamma", "beta"], ["n"], num_groups=groups, epsilon=1e-5)]
    elif form == "instance":
        inits += [numpy_helper.from_array(gamma, "gamma"), numpy_helper.from_array(beta, "beta")]
        nodes = [helper.make_node("InstanceNormalization", ["x", "gamma", "beta"], ["n"], epsilon=1e-5)]
    else:
        inits += [numpy_helper.from_array(np.array([0, groups, -1], np.int64), "grouped_shape"),
                  numpy_helper.from_array(np.ones(groups, np.float32), "ones"),
                  numpy_helper.from_array(np.zeros(groups, np.float32), "zeros"),
                  numpy_helper.from_array(gamma.reshape(per_channel), "gamma"),
                  numpy_helper.from_array(beta.reshape(per_channel), "beta")]
        nodes = [helper.make_node("Reshape", ["x", "grouped_shape"], ["grouped"]),
                 helper.make_node("InstanceNormalization", ["grouped", "ones", "zeros"], ["normalized"], epsilon=1e-5),
                 helper.make_node("Shape", ["x"], ["x_shape"]),
                 helper.make_node("Reshape", ["normalized", "x_shape"], ["restored"]),
                 helper.make_node("Mul", ["restored", "gamma"], ["scaled"]),
                 helper.make_node("Add", ["scaled", "beta"], ["n"])]
    if act == "none":
        nodes.append(helper.make_node("Identity", ["n"], ["y"]))
    else:
        nodes += activation(act, "n", "y")
    graph = helper.make_graph(nodes, "gn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)


GROUP_NORM_CASES = {
    # few long groups (a diffusion model's at batch 1): 16-byte accesses
    "group-32-silu-64x40x40": ([1, 64, 40, 40], 32, "group", "silu"),
    "exported-8-relu-32x96x96": ([1, 32, 96, 96], 8, "exported", "relu"),
    # channels of an odd size: one element a thread
    "exported-3-sigmoid-12x7x9": ([3, 12, 7, 9], 3, "exported", "sigmoid"),
    "group-4-tanh-8x33x35": ([2, 8, 33, 35], 4, "group", "tanh"),
    # many short rows, rank 3 and rank 5
    "instance-none-16x1023": ([2, 16, 1023], 16, "instance", "none"),
    "instance-relu-6x3x4x5": ([4, 6, 3, 4, 5], 6, "instance", "relu"),
}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case", list(GROUP_NORM_CASES))
def test_group_norm_tactics_match_cpu(case, precision, kiln_bin, tmp_path):
    """Each form of channel-group normalization becomes one FusedGroupNorm layer with its
    activation, and both of its tactics ("rows": a warp or block per group; "split": each group
    over several blocks, chunk statistics combined) match the CPU engine on inputs whose mean is
    far from 0. The timing cache names the tactic each build takes."""
    shape, groups, form, act = GROUP_NORM_CASES[case]
    path = str(tmp_path / "m.onnx")
    group_norm_model(path, shape, groups, form, act, seed=len(case))
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape) * 3 + 4).astype(np.float32)
    want = run_kiln(kiln_bin, path, [x], ["x"], str(tmp_path / "cpu"), "--device", "cpu", "--no-optimize")["y"]
    cache = str(tmp_path / "timing.cache")
    subprocess.run([kiln_bin, "build", path, "--device", "cuda", f"--{precision}", "--timing-cache", cache,
                    "-o", str(tmp_path / "first.engine")], check=True, capture_output=True, timeout=300)
    with open(cache) as f:
        lines = f.read().splitlines()
    keys = [line.split("\t")[0] for line in lines if line.startswith("group_norm|")]
    assert len(keys) == 1, lines
    for tactic, kernel in (("rows", "kernel:group-norm-"), ("split", "kernel:group-norm-split")):
        with open(cache, "w") as f:
            f.write("\n".join([line for line in lines if not line.startswith("group_norm|")] + [f"{keys[0]}\t{tactic}"]) + "\n")
        engine = str(tmp_path / f"{tactic}.engine")
        subprocess.run([kiln_bin, "build", path, "--device", "cuda", f"--{precision}", "--timing-cache", cache,
                        "-o", engine], check=True, capture_output=True, timeout=300)
        info = json.loads(subprocess.run([kiln_bin, "inspect", engine, "--json"], capture_output=True, text=True,
                                         check=True).stdout)
        layers = [layer for layer in info["layers"] if layer["op"] not in ("Reformat",)]
        assert [layer["op"] for layer in layers] == ["FusedGroupNorm"], layers
        used = layers[0]["tactic"]
        assert used.startswith(kernel) and (tactic == "split") == ("split" in used), (tactic, used)
        got = run_kiln(kiln_bin, engine, [x], ["x"], str(tmp_path / tactic))["y"]
        assert got.shape == want.shape
        err = rel_l2(got, want)
        assert err <= (1e-5 if precision == "fp32" else 3e-3), f"{case} {precision} {tactic}: relative L2 {err:.3g}"


GROUP_NORM_NHWC_CASES = {
    # (channels, groups, size, batch, activation): groups of 2 channels inside one 8-channel vector,
    # 10-channel groups (40 vectors a pixel), channels not a multiple of 8, instance norm, 7x7 maps;
    # a sample in more chunks than a warp has lanes (48x48 at batch 8); below batch 8 the layer keeps
    # NCHW (KILN_GROUP_NORM_NHWC_MIN_BATCH, a build option, 8 by default)
    "64ch-32g": (64, 32, 20, 8, "silu"),
    "320ch-32g": (320, 32, 16, 8, "silu"),
    "12ch-3g": (12, 3, 9, 8, "relu"),
    "32ch-instance": (32, 32, 12, 8, "none"),
    "256ch-8g-7x7": (256, 8, 7, 9, "sigmoid"),
    "64ch-32g-batch-1": (64, 32, 20, 1, "silu"),
    "64ch-32g-48x48": (64, 32, 48, 8, "silu"),
    "96ch-24g-40x40-batch-2": (96, 24, 40, 2, "relu"),
}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case", list(GROUP_NORM_NHWC_CASES))
def test_group_norm_between_convolutions_reads_their_layout(case, precision, kiln_bin, tmp_path):
    """Conv -> GroupNorm (+ activation) -> Conv: in fp16 the convolutions store channels-last and,
    from batch 8, the FusedGroupNorm layer reads and writes that layout itself
    ("kernel:group-norm-nhwc"), with no Reformat between the three layers (below it, the NCHW
    kernels); in both precisions the output matches the CPU engine."""
    c, groups, size, batch, act = GROUP_NORM_NHWC_CASES[case]
    rng = np.random.default_rng(c + groups)
    n1, i1 = conv("c1", "x", 8, c, rng=rng)
    n2, i2 = conv("c2", "y1", c, 8, rng=rng)
    gamma = (1 + 0.3 * rng.standard_normal(c)).astype(np.float32)
    beta = (0.5 * rng.standard_normal(c)).astype(np.float32)
    inits = i1 + i2 + [numpy_helper.from_array(gamma, "gamma"), numpy_helper.from_array(beta, "beta")]
    nodes = n1 + [helper.make_node("GroupNormalization", ["c1", "gamma", "beta"], ["n"], num_groups=groups)]
    nodes += [helper.make_node("Identity", ["n"], ["y1"])] if act == "none" else activation(act, "n", "y1")
    nodes += n2
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "conv_gn_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                    [batch, 8, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), path)
    engine = str(tmp_path / "m.engine")
    subprocess.run([kiln_bin, "build", path, "--device", "cuda", f"--{precision}", "-o", engine], check=True,
                   capture_output=True, timeout=300)
    info = json.loads(subprocess.run([kiln_bin, "inspect", engine, "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    layers = [(layer["op"], layer["tactic"]) for layer in info["layers"]]
    norm = [tactic for op, tactic in layers if op == "FusedGroupNorm"]
    assert len(norm) == 1, layers
    if precision == "fp16" and batch >= 8:
        inner = [op for op, _ in layers][[op for op, _ in layers].index("FusedGroupNorm") - 1:][:3]
        assert norm[0].startswith("kernel:group-norm-nhwc") and "Reformat" not in inner, layers
        if size * size >= 48 * 48:  # the chunks' statistics combined by a warp's lanes, more than once each
            assert int(norm[0].removeprefix("kernel:group-norm-nhwc")) > 32, layers
    else:
        assert not norm[0].startswith("kernel:group-norm-nhwc"), layers
    x = (rng.standard_normal([batch, 8, size, size]) * 2 + 3).astype(np.float32)
    want = run_kiln(kiln_bin, path, [x], ["x"], str(tmp_path / "cpu"), "--device", "cpu", "--no-optimize")["y"]
    got = run_kiln(kiln_bin, engine, [x], ["x"], str(tmp_path / "gpu"))["y"]
    err = rel_l2(got, want)
    assert err <= (1e-4 if precision == "fp32" else 1e-2), f"{case} {precision}: relative L2 {err:.3g}, layers {layers}"
