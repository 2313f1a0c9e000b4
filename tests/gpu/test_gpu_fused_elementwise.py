"""kiln::FusedElementwise on the GPU: groups of elementwise ops, with a Concat read in place, built
into float32 and float16 engines and compared with the unoptimized CPU engine on random inputs.
Each case also checks, through `kiln inspect --json`, that the group was fused as expected (its
members named) and which vector width the kernel took.

The cases cover what the kernel tells apart: concatenated parts stored channels-last (convolution
outputs) and row-major, parts whose widths do not allow 8- or 4-element vectors, inputs read as
the output is, per-channel vectors, scalars, per-sample [N,C,1,1] scales, a full-shaped input
stored in the other layout, and a tensor of a few million elements.

Every build logs its candidates (KILN_TACTIC_LOG): wherever the group allows vectors, its
generated kernels (compiled with NVRTC during the build) are timed, none differs from the
interpreter, and where the build keeps one the engine file holds its cubin."""
from __future__ import annotations

import json
import os
import struct
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from test_gpu_models import rel_l2, run_kiln


class Model:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.inputs = [], [], []

    def input(self, name, shape):
        self.inputs.append((name, shape))
        return name

    def const(self, name, array):
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def node(self, op, inputs, out, **attrs):
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{out}_node", **attrs))
        return out

    def conv(self, x, cin, cout, out):
        w = self.const(f"{out}_w", self.rng.standard_normal([cout, cin, 3, 3]) / np.sqrt(9 * cin))
        return self.node("Conv", [x, w, self.const(f"{out}_b", self.rng.uniform(-0.2, 0.2, [cout]))], out, pads=[1, 1, 1, 1])

    def save(self, path, out_shape):
        graph = helper.make_graph(self.nodes, "fused", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in self.inputs],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        onnx.checker.check_model(model, full_check=True)
        onnx.save(model, path)


def dense_block(m):
    """DenseNet's Concat -> BatchNorm (Mul, Add) -> Relu over convolution outputs and the input."""
    x = m.input("x", [2, 16, 7, 9])
    parts = [m.conv(x, 16, 8, "c1"), m.conv(x, 16, 24, "c2"), x]
    m.node("Concat", parts, "joined", axis=1)
    m.node("Mul", ["joined", m.const("scale", m.rng.uniform(0.5, 1.5, [1, 48, 1, 1]))], "scaled")
    m.node("Add", ["scaled", m.const("shift", m.rng.uniform(-0.5, 0.5, [1, 48, 1, 1]))], "shifted")
    m.node("Relu", ["shifted"], "y")
    return [2, 48, 7, 9], ["joined_node", "scaled_node", "shifted_node", "y_node"]


def odd_widths(m):
    """Parts of 3 and 5 channels: no vector of 4 or 8 elements stays within one part."""
    x = m.input("x", [2, 4, 5, 6])
    m.node("Concat", [m.conv(x, 4, 3, "c1"), m.conv(x, 4, 5, "c2")], "joined", axis=1)
    m.node("Sigmoid", ["joined"], "s")
    m.node("Mul", ["s", m.const("half", 0.5)], "y")
    return [2, 8, 5, 6], ["joined_node", "s_node", "y_node"]


def rows(m):
    """Row-major parts joined along the middle axis, and an input read as the output is."""
    a, b, r = m.input("a", [2, 3, 40]), m.input("b", [2, 5, 40]), m.input("r", [2, 8, 40])
    m.node("Concat", [a, b], "joined", axis=1)
    m.node("Tanh", ["joined"], "t")
    m.node("Add", ["t", r], "sum")
    m.node("Div", ["sum", m.const("w", m.rng.uniform(1.0, 2.0, [40]))], "y")
    return [2, 8, 40], ["joined_node", "t_node", "sum_node", "y_node"]


def broadcasts(m):
    """A convolution output times a per-sample [N,C,1,1] scale, plus a per-column row, the larger
    of it and a row-major input of the output's shape, then HardSwish."""
    x, se, other = m.input("x", [2, 16, 6, 8]), m.input("se", [2, 16, 1, 1]), m.input("other", [2, 16, 6, 8])
    c = m.conv(x, 16, 16, "c")
    m.node("Mul", [c, se], "scaled")
    m.node("Add", ["scaled", m.const("row", m.rng.uniform(-0.5, 0.5, [8]))], "shifted")
    m.node("Max", ["shifted", other], "m")
    m.node("HardSwish", ["m"], "y")
    return [2, 16, 6, 8], ["scaled_node", "shifted_node", "m_node", "y_node"]


def large(m):
    """A few million elements: the vectorized path at size."""
    x = m.input("x", [4, 32, 56, 56])
    m.node("Concat", [m.conv(x, 32, 32, "c1"), m.conv(x, 32, 32, "c2")], "joined", axis=1)
    m.node("Mul", ["joined", m.const("scale", m.rng.uniform(0.5, 1.5, [1, 64, 1, 1]))], "scaled")
    m.node("Add", ["scaled", m.const("shift", m.rng.uniform(-0.5, 0.5, [1, 64, 1, 1]))], "shifted")
    m.node("Relu", ["shifted"], "y")
    return [4, 64, 56, 56], ["joined_node", "scaled_node", "shifted_node", "y_node"]


CASES = {"dense_block": dense_block, "odd_widths": odd_widths, "rows": rows, "broadcasts": broadcasts, "large": large}


def engine_tactics(path):
    """The header's timing-cache entries of an engine file (docs/engine-format.md)."""
    with open(path, "rb") as f:
        assert f.read(8) == b"KILNENG1"
        f.read(4)
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size))["tactics"]
PARAMS = [(name, precision) for name in CASES for precision in ("fp32", "fp16")]


@pytest.mark.parametrize("name,precision", PARAMS, ids=[f"{n}-{p}" for n, p in PARAMS])
def test_fused_group_matches_cpu(name, precision, kiln_bin, tmp_path):
    m = Model(seed=len(name))
    out_shape, members = CASES[name](m)
    path, engine = str(tmp_path / f"{name}.onnx"), str(tmp_path / f"{name}.engine")
    m.save(path, out_shape)
    r = subprocess.run([kiln_bin, "build", path, "--device", "cuda", f"--{precision}", "-o", engine],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "KILN_TACTIC_LOG": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    assert "differs from the interpreter" not in log, log[-3000:]
    assert "no generated kernel" not in log, log[-3000:]
    generated = [line for line in log.splitlines() if "fused_elementwise/generated" in line and line.endswith(" ms")]
    print("\n".join(generated))
    info = subprocess.run([kiln_bin, "inspect", engine, "--json", "-"], capture_output=True, text=True, timeout=120)
    assert info.returncode == 0, info.stderr[-3000:]
    fused = [layer for layer in json.loads(info.stdout)["layers"] if layer["op"] == "FusedElementwise"]
    assert len(fused) == 1, [(layer["op"], layer["name"]) for layer in json.loads(info.stdout)["layers"]]
    assert fused[0]["members"] == members
    print(f"{name} {precision}: {fused[0]['tactic']}")
    # kernel:fused_elementwise/KERNEL/v8(...): v8 and v4 groups take vectors, v1 groups do not.
    kernel, signature = fused[0]["tactic"].split("/")[1:3]
    vectors = not signature.startswith("v1")
    assert len(generated) == (3 if vectors else 0), log[-3000:]  # 1, 2 and 4 vectors a thread
    cubins = [key for key in engine_tactics(engine) if key.startswith("fused_elementwise_cubin|")]
    assert len(cubins) == (1 if kernel.startswith("generated") else 0), (kernel, cubins)

    rng = np.random.default_rng(7)
    names = [n for n, _ in m.inputs]
    inputs = [rng.standard_normal(s).astype(np.float32) for _, s in m.inputs]
    want = run_kiln(kiln_bin, path, inputs, names, str(tmp_path / "cpu"), "--device", "cpu", "--no-optimize")["y"]
    got = run_kiln(kiln_bin, engine, inputs, names, str(tmp_path / "gpu"))["y"]
    assert got.shape == want.shape == tuple(out_shape)
    if precision == "fp32":
        scale = max(1.0, float(np.abs(want).max()))
        err = float(np.abs(got.astype(np.float64) - want).max()) / scale
        print(f"  largest difference {err:.3g} of the output's scale {scale:.3g}")
        assert err <= 1e-5
    else:
        err = rel_l2(got, want)
        print(f"  relative L2 error {err:.3g}")
        assert err <= 5e-3
