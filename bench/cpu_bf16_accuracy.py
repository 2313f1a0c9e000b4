#!/usr/bin/env python3
"""How far bfloat16 products move a network's output: kiln's CPU engine of bfloat16 products
(`kiln build --device cpu --bf16`) against PyTorch's CPU autocast to bfloat16, both measured
against PyTorch's float32 output on the same inputs.

    .venv/bin/python bench/cpu_bf16_accuracy.py --models resnet50,mobilenet_v2 --out FILE.json

Models are torchvision's architectures with seeded random weights and batch-norm statistics
measured on random images, exported as bench/cpu_compare.py exports them (the same networks its
rows time). Writes {"results": [{"model", "kiln_bf16_relative_l2", "torch_autocast_bf16_relative_l2",
"kiln_bf16_cosine", ...}]} with the command, the kiln commit, PyTorch's version and the date.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu_compare  # noqa: E402  (export: the same seeded networks)
import cpu_resnet50  # noqa: E402  (kiln_commit, machine)


def seeded_module(name):
    """cpu_compare.export's network: seed 0, batch-norm statistics from two batches of random images."""
    import torch
    import torchvision

    torch.manual_seed(0)
    module = getattr(torchvision.models, name)(weights=None)
    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.momentum = None
    module.train()
    with torch.no_grad():
        for _ in range(2):
            module(torch.randn(16, 3, 224, 224))
    return module.eval()


def relative_l2(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kiln-python", default=os.path.join(HERE, "..", "build", "python"))
    ap.add_argument("--models", default="resnet50,mobilenet_v2")
    ap.add_argument("--inputs", type=int, default=4, help="seeded random images, one run each")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "kiln_cpu_compare"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.kiln_python))
    import kiln
    import torch

    os.makedirs(args.work, exist_ok=True)
    results = []
    for name in args.models.split(","):
        onnx_path = os.path.join(args.work, f"{name}.onnx")
        if not os.path.exists(onnx_path):
            cpu_compare.export(name, onnx_path)
        options = kiln.BuildOptions()
        options.device = "cpu"
        options.precision = "bf16"
        engine = kiln.Engine.from_onnx(onnx_path, options)
        module = seeded_module(name)
        row = {"model": name, "inputs": args.inputs, "kiln_bf16_relative_l2": [], "torch_autocast_bf16_relative_l2": [],
               "kiln_bf16_cosine": [], "top1_same_kiln_bf16": 0, "top1_same_torch_autocast_bf16": 0}
        for seed in range(args.inputs):
            x = np.random.default_rng(seed).standard_normal((1, 3, 224, 224), dtype=np.float32)
            with torch.no_grad():
                ref = module(torch.from_numpy(x)).numpy()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    auto = module(torch.from_numpy(x)).float().numpy()
            got = next(iter(engine.run({"input": x}).values()))
            row["kiln_bf16_relative_l2"].append(relative_l2(got, ref))
            row["torch_autocast_bf16_relative_l2"].append(relative_l2(auto, ref))
            row["kiln_bf16_cosine"].append(float(np.dot(got.ravel(), ref.ravel()) / np.linalg.norm(got) / np.linalg.norm(ref)))
            row["top1_same_kiln_bf16"] += int(got.argmax() == ref.argmax())
            row["top1_same_torch_autocast_bf16"] += int(auto.argmax() == ref.argmax())
            print(f"{name} input {seed}: relative L2 to float32: kiln bf16 {row['kiln_bf16_relative_l2'][-1]:.3e}, "
                  f"torch autocast bf16 {row['torch_autocast_bf16_relative_l2'][-1]:.3e}", flush=True)
        results.append(row)
    report = {
        "benchmark": "output of bfloat16 products against PyTorch float32 on the same inputs; random weights",
        "command": " ".join([os.path.relpath(sys.executable)] + sys.argv),
        "kiln_commit": cpu_resnet50.kiln_commit(HERE),
        "torch": torch.__version__,
        "machine": cpu_resnet50.machine(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
