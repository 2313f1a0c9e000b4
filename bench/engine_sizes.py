#!/usr/bin/env python3
"""Engine file sizes: float32 against INT8, on the CPU engine (no GPU needed; a GPU engine file
of these models holds the same graph and weights: docs/engine-format.md).

    .venv/bin/python bench/engine_sizes.py --out bench/results/engine_sizes.json [--models resnet50,resnet18]

For each torchvision model (random weights, 3x224x224, scripts/export_model.py): `kiln build
MODEL --device cpu` and `kiln build MODEL --device cpu --int8 --calib calib.npy --calib-batch 4`
(8 random calibration images of the export's input maker), and the two files' sizes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))


def kiln_bin() -> str:
    return os.environ.get("KILN_BIN", os.path.join(ROOT, "build", "kiln"))


def run(cmd: list[str]) -> str:
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{cmd[1]} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout + r.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="resnet50")
    args = ap.parse_args()
    import numpy as np

    import export_model

    results = {"date": time.strftime("%Y-%m-%d"), "kiln": run([kiln_bin(), "--version"]).strip(),
               "command": " ".join(sys.argv), "models": {}}
    with tempfile.TemporaryDirectory() as work:
        for name in args.models.split(","):
            model = os.path.join(work, f"{name}.onnx")
            run([sys.executable, os.path.join(ROOT, "scripts", "export_model.py"), name, "--size", "224", "-o", model])
            calib = os.path.join(work, f"{name}-calib.npy")
            np.save(calib, export_model.input_maker(name, size=224)(8, seed=5)[0])
            files = {p: os.path.join(work, f"{name}-{p}.engine") for p in ("fp32", "int8")}
            run([kiln_bin(), "build", model, "--device", "cpu", "-o", files["fp32"]])
            log = run([kiln_bin(), "build", model, "--device", "cpu", "--int8", "--calib", calib, "--calib-batch", "4",
                       "-o", files["int8"]])
            sizes = {p: os.path.getsize(f) for p, f in files.items()}
            entry = {"onnx_bytes": os.path.getsize(model), "fp32_engine_bytes": sizes["fp32"],
                     "int8_engine_bytes": sizes["int8"], "int8_over_fp32": sizes["int8"] / sizes["fp32"],
                     "int8_build_log": [l for l in log.splitlines() if "int8:" in l]}
            results["models"][name] = entry
            print(f"{name}: fp32 {sizes['fp32'] / 1e6:.1f} MB, int8 {sizes['int8'] / 1e6:.1f} MB "
                  f"({100 * entry['int8_over_fp32']:.1f}%)", flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
