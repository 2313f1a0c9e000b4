"""Property test: random graphs of elementwise, broadcast, activation, normalization and reduction
ops, after a product or alone, built into GPU engines and compared with the unoptimized CPU
engine on random inputs. Whatever the builder fuses or folds (product epilogues, the layer scale,
LayerNorm rows, views), the float32 engine must stay within 1e-5 of the reference and the float16
engine within float16's rounding (relative L2 error 5e-3).

Each seed draws a graph: a value pool starting from the input (or a Conv/MatMul of it), then steps
that each apply one op to values of the pool, with constants broadcast per channel, per row or as
scalars; operands are kept in ranges where the op is well conditioned (divisors and logarithm
arguments at least 1, exponentials of bounded values), so that a difference is the engine's and
not the op's. A failing seed names itself, and its model is left in pytest's tmp_path."""
from __future__ import annotations

import os
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from test_gpu_models import rel_l2, run_kiln

UNARY = ("Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Erf", "HardSwish", "HardSigmoid", "Softplus", "Elu", "LeakyRelu",
         "Gelu", "Exp(Tanh)", "Log(Abs+1)", "Sqrt(Abs+1)", "Clip", "Silu", "Square")
BINARY = ("Add", "Sub", "Mul", "Div(Abs+1)", "Max", "Min")
NORMS = ("LayerNormalization", "ReduceMeanCentre", "Softmax", "InstanceNormalization", "RMS")


class Graph:
    def __init__(self, rng, shape):
        self.rng, self.shape = rng, shape
        self.nodes, self.inits, self.count = [], [], 0

    def name(self, stem):
        self.count += 1
        return f"{stem}{self.count}"

    def const(self, array):
        n = self.name("k")
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), n))
        return n

    def node(self, op, inputs, **attrs):
        out = self.name(op.lower()[:6])
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def broadcast_constant(self):
        """A constant of the value's shape broadcast one of three ways: per channel (NCHW) or per
        column (rows), per row, or a scalar."""
        kind = self.rng.integers(3)
        if kind == 0:
            shape = [1, self.shape[1], 1, 1] if len(self.shape) == 4 else [1, 1, self.shape[-1]]
        elif kind == 1:
            shape = [1] * (len(self.shape) - 1) + [self.shape[-1]]
        else:
            shape = []
        return self.const(self.rng.uniform(-1.5, 1.5, shape))

    def unary(self, op, x):
        if op == "Exp(Tanh)":
            return self.node("Exp", [self.node("Tanh", [x])])
        if op == "Log(Abs+1)":
            return self.node("Log", [self.node("Add", [self.node("Abs", [x]), self.const(1.0)])])
        if op == "Sqrt(Abs+1)":
            return self.node("Sqrt", [self.node("Add", [self.node("Abs", [x]), self.const(1.0)])])
        if op == "Clip":
            return self.node("Clip", [x, self.const(-0.75), self.const(1.25)])
        if op == "Silu":
            return self.node("Mul", [x, self.node("Sigmoid", [x])])
        if op == "Square":
            return self.node("Mul", [x, x])
        if op == "Gelu":  # the erf form torch.onnx writes
            inner = self.node("Erf", [self.node("Div", [x, self.const(np.sqrt(2.0))])])
            return self.node("Mul", [self.node("Mul", [x, self.node("Add", [inner, self.const(1.0)])]), self.const(0.5)])
        if op == "LeakyRelu":
            return self.node("LeakyRelu", [x], alpha=0.1)
        return self.node(op, [x])

    def binary(self, op, a, b):
        if op == "Div(Abs+1)":
            return self.node("Div", [a, self.node("Add", [self.node("Abs", [b]), self.const(1.0)])])
        return self.node(op, [a, b])

    def norm(self, op, x):
        last = self.shape[-1]
        if op == "LayerNormalization":
            return self.node("LayerNormalization", [x, self.const(self.rng.uniform(0.5, 1.5, [last])),
                                                    self.const(self.rng.uniform(-0.5, 0.5, [last]))], axis=-1, epsilon=1e-5)
        if op == "ReduceMeanCentre":
            mean = self.node("ReduceMean", [x, self.const_axes([-1])], keepdims=1)
            return self.node("Sub", [x, mean])
        if op == "Softmax":
            return self.node("Softmax", [x], axis=-1)
        if op == "RMS":  # x / sqrt(mean(x^2) + eps), as exported from PyTorch
            ms = self.node("ReduceMean", [self.node("Mul", [x, x]), self.const_axes([-1])], keepdims=1)
            return self.node("Div", [x, self.node("Sqrt", [self.node("Add", [ms, self.const(1e-5)])])])
        # InstanceNormalization: NCHW per channel; rows: over the last axis of each (batch, row)
        channels = self.shape[1]
        return self.node("InstanceNormalization", [x, self.const(self.rng.uniform(0.5, 1.5, [channels])),
                                                   self.const(self.rng.uniform(-0.5, 0.5, [channels]))], epsilon=1e-5)

    def const_axes(self, axes):
        n = self.name("axes")
        self.inits.append(numpy_helper.from_array(np.array(axes, np.int64), n))
        return n


def random_graph(seed: int, shape: list[int], path: str) -> None:
    rng = np.random.default_rng(seed)
    g = Graph(rng, shape)
    start = "x"
    product = rng.integers(3)
    if product == 1 and len(shape) == 4:  # a 3x3 Conv keeping the shape: its epilogue takes the chain's head
        c = shape[1]
        w = g.const(rng.standard_normal([c, c, 3, 3]) / np.sqrt(9 * c))
        start = g.node("Conv", ["x", w, g.const(rng.uniform(-0.2, 0.2, [c]))], pads=[1, 1, 1, 1])
    elif product == 1:  # MatMul by constant weights and a bias Add: a product with an epilogue
        e = shape[-1]
        start = g.node("Add", [g.node("MatMul", ["x", g.const(rng.standard_normal([e, e]) / np.sqrt(e))]),
                               g.const(rng.uniform(-0.2, 0.2, [e]))])
    pool = [start]
    for _ in range(int(rng.integers(5, 11))):
        kind = rng.choice(["unary", "binary", "binary", "norm"])
        x = pool[int(rng.integers(len(pool)))]
        if kind == "unary":
            out = g.unary(str(rng.choice(UNARY)), x)
        elif kind == "binary":
            other = pool[int(rng.integers(len(pool)))] if rng.random() < 0.5 else g.broadcast_constant()
            a, b = (x, other) if rng.random() < 0.5 else (other, x)
            out = g.binary(str(rng.choice(BINARY)), a, b)
        else:
            ops = NORMS if len(shape) == 4 else tuple(op for op in NORMS if op != "InstanceNormalization")
            out = g.norm(str(rng.choice(ops)), x)
        pool.append(out)
    # The last value, plus the sum of everything else so that no branch is dead.
    total = pool[-1]
    for v in pool[1:-1]:
        total = g.node("Add", [total, v])
    g.nodes.append(helper.make_node("Identity", [total], ["y"]))
    graph = helper.make_graph(g.nodes, f"random_chain_{seed}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)


SHAPES = {"nchw": [2, 16, 6, 7], "rows": [2, 5, 40]}


# float32 carries the property (12 graphs per layout); float16 samples it (4 per layout).
CASES = [(precision, layout, seed) for layout in sorted(SHAPES) for precision, seeds in (("fp32", 12), ("fp16", 4))
         for seed in range(seeds)]


@pytest.mark.parametrize("precision,layout,seed", CASES, ids=[f"{p}-{l}-{s}" for p, l, s in CASES])
def test_random_chain_matches_cpu(precision, layout, seed, kiln_bin, tmp_path):
    shape = SHAPES[layout]
    path, engine = str(tmp_path / "chain.onnx"), str(tmp_path / "chain.engine")
    random_graph(seed * 7 + (layout == "rows"), shape, path)
    # Every candidate logged: no elementwise group's kernel (compiled or generated) may differ
    # from the interpreter's output, nor a generated kernel fail to compile.
    r = subprocess.run([kiln_bin, "build", path, "--device", "cuda", f"--{precision}", "-o", engine],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "KILN_TACTIC_LOG": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    for refusal in ("differs from the interpreter", "no generated kernel"):
        assert refusal not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    x = np.random.default_rng(100 + seed).standard_normal(shape).astype(np.float32)
    want = run_kiln(kiln_bin, path, [x], ["x"], str(tmp_path / "cpu"), "--device", "cpu", "--no-optimize")["y"]
    got = run_kiln(kiln_bin, engine, [x], ["x"], str(tmp_path / "gpu"))["y"]
    assert got.shape == want.shape == tuple(shape)
    assert np.isfinite(want).all()
    if precision == "fp32":
        scale = max(1.0, float(np.abs(want).max()))
        err = float(np.abs(got.astype(np.float64) - want).max()) / scale
        print(f"{precision} {layout} seed {seed}: largest difference {err:.3g} of the output's scale {scale:.3g}")
        assert err <= 1e-5, f"seed {seed}: largest difference {err:.3g} of the output's scale"
    else:
        err = rel_l2(got, want)
        print(f"{precision} {layout} seed {seed}: relative L2 error {err:.3g}")
        assert err <= 5e-3, f"seed {seed}: relative L2 error {err:.3g}"
