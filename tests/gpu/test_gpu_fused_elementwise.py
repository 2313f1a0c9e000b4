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


def dense_blocks(m, blocks=3, batch=2):
    """DenseNet-style blocks one after another: one fused group each."""
    x = m.input("x", [batch, 16, 8, 8])
    for k in range(blocks):
        m.node("Concat", [m.conv(x, 16, 8, f"c{k}a"), m.conv(x, 16, 8, f"c{k}b")], f"joined{k}", axis=1)
        m.node("Mul", [f"joined{k}", m.const(f"scale{k}", m.rng.uniform(0.5, 1.5, [1, 16, 1, 1]))], f"scaled{k}")
        m.node("Add", [f"scaled{k}", m.const(f"shift{k}", m.rng.uniform(-0.5, 0.5, [1, 16, 1, 1]))], f"shifted{k}")
        x = m.node("Relu", [f"shifted{k}"], "y" if k == blocks - 1 else f"block{k}")
    return [batch, 16, 8, 8]


def test_generated_kernels_compile_beside_the_build_and_rebuild_from_the_cache(kiln_bin, tmp_path):
    """A build compiles its groups' generated kernels on worker threads and times them once every
    node is lowered; a rebuild with the timing cache compiles none and takes the same tactics and
    cubins, and both engines compute what the CPU engine does."""
    m = Model(seed=3)
    out_shape = dense_blocks(m)
    path, cache = str(tmp_path / "blocks.onnx"), str(tmp_path / "timing.cache")
    m.save(path, out_shape)
    engines, logs = [str(tmp_path / "first.engine"), str(tmp_path / "second.engine")], []
    for engine in engines:
        r = subprocess.run([kiln_bin, "build", path, "--device", "cuda", "--fp16", "--timing-cache", cache, "-o", engine],
                           capture_output=True, text=True, timeout=300, env={**os.environ, "KILN_TACTIC_LOG": "1"})
        assert r.returncode == 0, r.stderr[-3000:]
        logs.append(r.stdout + r.stderr)
    first, second = logs
    assert "differs from the interpreter" not in first and "no generated kernel" not in first, first[-3000:]
    # The three groups are alike (one source, compiled once; one tactic key): all wait for the
    # compile, the first times its 3 generated kernels beside the interpreter's, and the others
    # take its choice.
    assert "timing the generated kernels of 3 layer(s)" in first, first[-3000:]
    assert first.count("timed once its generated kernels compile") == 3, first[-3000:]
    assert len([line for line in first.splitlines() if "fused_elementwise/generated" in line and line.endswith(" ms")]) == 3
    # The rebuild takes every tactic and cubin from the cache: nothing compiles, nothing is timed.
    assert "timing the generated kernels" not in second and "fused_elementwise/" not in second.replace("kernel:fused_elementwise/", ""), \
        second[-3000:]

    def fused_tactics(engine):
        info = subprocess.run([kiln_bin, "inspect", engine, "--json", "-"], capture_output=True, text=True, timeout=120)
        assert info.returncode == 0, info.stderr[-3000:]
        return [layer["tactic"] for layer in json.loads(info.stdout)["layers"] if layer["op"] == "FusedElementwise"]

    tactics = fused_tactics(engines[0])
    assert len(tactics) == 3 and len(set(tactics)) == 1 and fused_tactics(engines[1]) == tactics, tactics
    cubins = [sorted(k for k in engine_tactics(e) if k.startswith("fused_elementwise_cubin|")) for e in engines]
    assert cubins[0] == cubins[1] and len(cubins[0]) == (1 if "/generated" in tactics[0] else 0), cubins

    rng = np.random.default_rng(11)
    inputs = [rng.standard_normal(s).astype(np.float32) for _, s in m.inputs]
    names = [n for n, _ in m.inputs]
    want = run_kiln(kiln_bin, path, inputs, names, str(tmp_path / "cpu"), "--device", "cpu", "--no-optimize")["y"]
    for k, engine in enumerate(engines):
        got = run_kiln(kiln_bin, engine, inputs, names, str(tmp_path / f"gpu{k}"))["y"]
        assert got.shape == want.shape == tuple(out_shape)
        err = rel_l2(got, want)
        print(f"{os.path.basename(engine)}: {tactics}, relative L2 error {err:.3g}")
        assert err <= 5e-3


def test_groups_of_a_dynamic_engine_match_the_cpu_at_every_batch(kiln_bin, tmp_path):
    """An engine with a batch profile builds a plan per timed shape: the groups at the shapes after
    the first start from the tactic they took there (a generated kernel, compiled again for the
    new sizes, which are literals in its source) and must still compute what the CPU engine does."""
    m = Model(seed=5)
    dense_blocks(m, batch="N")
    path, engine = str(tmp_path / "blocks.onnx"), str(tmp_path / "blocks.engine")
    m.save(path, ["N", 16, 8, 8])
    r = subprocess.run([kiln_bin, "build", path, "--device", "cuda", "--fp16", "--minShapes", "x:1x16x8x8", "--optShapes",
                        "x:4x16x8x8", "--maxShapes", "x:8x16x8x8", "-o", engine],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "KILN_TACTIC_LOG": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    assert "differs from the interpreter" not in log and "no generated kernel" not in log, log[-3000:]
    rng = np.random.default_rng(13)
    for batch in (1, 3, 8):
        inputs = [rng.standard_normal([batch, 16, 8, 8]).astype(np.float32)]
        want = run_kiln(kiln_bin, path, inputs, ["x"], str(tmp_path / f"cpu{batch}"), "--device", "cpu", "--no-optimize")["y"]
        got = run_kiln(kiln_bin, engine, inputs, ["x"], str(tmp_path / f"gpu{batch}"))["y"]
        assert got.shape == want.shape == (batch, 16, 8, 8)
        err = rel_l2(got, want)
        print(f"batch {batch}: relative L2 error {err:.3g}")
        assert err <= 5e-3
