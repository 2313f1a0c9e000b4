#!/usr/bin/env python3
"""Compares two folders of .npy outputs (e.g. `kiln run --mark-outputs all -o DIR` on the CPU and
on the GPU) and lists each tensor's relative L2 error, worst first, or in the model's order with
--model (the first tensor that goes wrong is where to look).

    python scripts/compare_outputs.py REF_DIR GOT_DIR [--model model.onnx] [--limit 1e-2]
"""
import argparse
import os
import sys

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ref")
    ap.add_argument("got")
    ap.add_argument("--model", help="ONNX model: list tensors in node order")
    ap.add_argument("--limit", type=float, default=1e-2, help="errors above this are marked")
    args = ap.parse_args()
    names = sorted(f[:-4] for f in os.listdir(args.ref) if f.endswith(".npy") and os.path.exists(os.path.join(args.got, f)))
    if args.model:
        import onnx

        m = onnx.load(args.model, load_external_data=False)
        order = {}
        for n in m.graph.node:
            for o in n.output:
                key = "".join(c if c.isalnum() or c in "_-." else "_" for c in o)
                order.setdefault(key, len(order))
        names.sort(key=lambda n: order.get(n, 1 << 30))
    bad = 0
    for name in names:
        a = np.load(os.path.join(args.ref, name + ".npy")).astype(np.float64)
        b = np.load(os.path.join(args.got, name + ".npy")).astype(np.float64)
        if a.shape != b.shape:
            print(f"SHAPE {name}: {a.shape} vs {b.shape}")
            bad += 1
            continue
        err = np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30)
        flag = "BAD " if not err <= args.limit else "    "
        bad += flag == "BAD "
        print(f"{flag}{err:10.3e}  {name}  {list(a.shape)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
