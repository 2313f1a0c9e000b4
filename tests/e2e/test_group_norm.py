"""Channel-group normalizations (src/passes/fuse_group_norm.cc): torch.nn.GroupNorm and
InstanceNorm2d as the exporters write them (TorchScript at opset 17 and dynamo at 18: GroupNorm as
Reshape, InstanceNormalization, Reshape, Mul, Add; dynamo at 21: GroupNormalization), each with the
activation after it, leave `kiln inspect --optimize` with one kiln::FusedGroupNorm per
normalization and none of the nodes it replaced, and `kiln check` still matches ONNX Runtime at
1e-4 on seeded inputs, at a batch other than the exported one. A forged engine file whose groups
do not divide the channels is refused with the reason."""
from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest

FORMS = {"torchscript-17": (False, 17), "dynamo-18": (True, 18), "dynamo-21": (True, 21)}


def _module():
    import torch

    class Blocks(torch.nn.Module):
        """GroupNorm + SiLU (a diffusion model's block), InstanceNorm + ReLU (a style network's),
        GroupNorm without affine + GELU, GroupNorm + LeakyReLU on a 1-D signal."""

        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(6, 32, 3, padding=1)
            self.gn = torch.nn.GroupNorm(8, 32)
            self.inorm = torch.nn.InstanceNorm2d(32, affine=True)
            self.plain = torch.nn.GroupNorm(4, 32, affine=False)
            self.gn1d = torch.nn.GroupNorm(2, 32)

        def forward(self, x):
            y = torch.nn.functional.silu(self.gn(self.conv(x)))
            y = torch.relu(self.inorm(y))
            y = torch.nn.functional.gelu(self.plain(y)) + y
            z = torch.nn.functional.leaky_relu(self.gn1d(y.flatten(2)), 0.1)
            return z

    torch.manual_seed(0)
    module = Blocks().eval()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return module


def _export(form: str, tmp_path) -> str:
    import torch

    dynamo, opset = FORMS[form]
    path = str(tmp_path / f"blocks_{form}.onnx")
    x = torch.randn(2, 6, 9, 13)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(_module(), (x,), path, dynamo=True, opset_version=opset,
                              dynamic_shapes={"x": {0: torch.export.Dim("batch")}}, input_names=["x"])
        else:
            torch.onnx.export(_module(), (x,), path, dynamo=False, opset_version=opset, input_names=["x"],
                              dynamic_axes={"x": {0: "batch"}})
    return path


@pytest.mark.parametrize("form", list(FORMS))
def test_exported_group_norms_fuse_and_match_onnxruntime(form, run_kiln, tmp_path, check_against_onnxruntime):
    path = _export(form, tmp_path)
    exported = [n.op_type for n in onnx.load(path).graph.node]
    assert {"InstanceNormalization", "GroupNormalization"} & set(exported), exported
    r = run_kiln("inspect", path, "--optimize", "--json", "-")
    assert r.returncode == 0, r.describe()
    layers = json.loads(r.stdout)["layers"]
    ops = [layer["op"] for layer in layers]
    assert ops.count("FusedGroupNorm") == 4, ops
    left = {"InstanceNormalization", "GroupNormalization", "Sigmoid", "Relu", "Erf", "Gelu", "LeakyRelu"} & set(ops)
    assert not left, ops
    x = np.random.default_rng(3).standard_normal((3, 6, 9, 13)).astype(np.float32) * 2 + 1
    check_against_onnxruntime(path, {onnx.load(path).graph.input[0].name: x})


def test_forged_group_count_is_refused(run_kiln, tmp_path):
    from test_engine_files import pack, unpack

    path = _export("dynamo-21", tmp_path)
    engine = tmp_path / "blocks.engine"
    r = run_kiln("build", path, "--device", "cpu", "-o", engine)
    assert r.returncode == 0, r.describe()
    header, graph, weights = unpack(engine.read_bytes())
    model = onnx.ModelProto()
    model.ParseFromString(graph)
    node = next(n for n in model.graph.node if n.op_type == "FusedGroupNorm")
    next(a for a in node.attribute if a.name == "num_groups").i = 5
    bad = tmp_path / "forged.engine"
    bad.write_bytes(pack(header, model.SerializeToString(), weights))
    r = run_kiln("run", bad, "--random")
    assert r.returncode == 1 and "do not split into 5 groups" in r.stderr, r.describe()
