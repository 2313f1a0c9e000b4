#!/usr/bin/env python3
"""Several execution contexts of one GPU engine on threads at once, for a while: how often a run's
result differs from what one context computes alone, and how (which batch, how many elements,
which images of the batch). Prints one JSON line.

    python3 bench/context_soak.py SECONDS TAG [--no-graph] [--contexts 4] [--beside-torch]

The engine is ResNet-18 at 64x64 (random weights), fp16, batch 1 to 16 (opt 8); the threads run
batches 1, 2, 5, 8 and 16 in turn. With --beside-torch, the contexts run while a PyTorch thread
keeps the GPU busy on a stream of its own with small matrix products (one context then shows
whether other work on the GPU alone changes a result). The float-convolution tactic families follow the developer
variables of docs/env.md (KILN_NO_CUDNN_GRAPH, KILN_NO_CONV_GEMM), so that running this under
each tells which family gives different results under concurrent load. Before the threads start,
the lone context repeats every batch 200 times: a difference there is nondeterminism, not load.
Needs the Python package (build-gpu/python on the GPU machine).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import export_model  # noqa: E402

import kiln  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("seconds", type=float)
    p.add_argument("tag")
    p.add_argument("--no-graph", action="store_true", help="contexts launch layer by layer (no CUDA graphs)")
    p.add_argument("--contexts", type=int, default=4)
    p.add_argument("--beside-torch", action="store_true", help="PyTorch keeps the GPU busy on another stream meanwhile")
    args = p.parse_args()

    path = f"/tmp/context-soak-{args.tag}.onnx"
    spec = export_model.load_model("resnet18", size=64)
    export_model.export(spec, path, "torchscript", 17)
    engine = kiln.Builder(precision="fp16", device="cuda",
                          profiles=[{"input": ([1, 3, 64, 64], [8, 3, 64, 64], [16, 3, 64, 64])}]).build(path)
    families = sorted({(layer["op"], layer["tactic"].split(":")[0]) for layer in engine.info()["layers"]})
    batches = [1, 2, 5, 8, 16]
    inputs = {b: spec.make_inputs(b, 400 + b)[0] for b in batches}
    alone = engine.create_context(use_cuda_graph=not args.no_graph)
    want = {b: alone.run({"input": inputs[b]})["output"].copy() for b in batches}
    alone_differs = sum(not np.array_equal(alone.run({"input": inputs[b]})["output"], want[b])
                        for b in batches for _ in range(200))

    contexts = [engine.create_context(use_cuda_graph=not args.no_graph) for _ in range(args.contexts)]
    differing, runs = [], [0] * len(contexts)
    deadline = time.monotonic() + args.seconds

    def work(t: int) -> None:
        r = 0
        while time.monotonic() < deadline:
            b = batches[(t + r) % len(batches)]
            r += 1
            got = contexts[t].run({"input": inputs[b]})["output"]
            runs[t] += 1
            if not np.array_equal(got, want[b]):
                d = np.abs(got - want[b])
                differing.append({"thread": t, "round": r, "batch": b, "elements": int((d > 0).sum()),
                                  "max_difference": float(d.max()), "max_value": float(np.abs(want[b]).max()),
                                  "images": [int(i) for i in np.unique(np.nonzero(d > 0)[0])][:8]})

    threads = [threading.Thread(target=work, args=(t,)) for t in range(len(contexts))]
    products = [0]
    if args.beside_torch:
        import torch

        a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
        side = torch.cuda.Stream()

        def busy() -> None:
            while time.monotonic() < deadline:
                with torch.cuda.stream(side):
                    y = a
                    for _ in range(50):
                        y = torch.relu(y @ y * 0.01)
                side.synchronize()
                products[0] += 50

        threads.append(threading.Thread(target=busy))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    print(json.dumps({"tag": args.tag, "no_graph": args.no_graph, "contexts": args.contexts,
                      "beside_torch_products": products[0] if args.beside_torch else None, "families": families,
                      "env": {k: v for k, v in os.environ.items() if k.startswith("KILN_")},
                      "runs": sum(runs), "differing": len(differing), "alone_repeats_differing": alone_differs,
                      "differing_by_batch": {str(b): sum(1 for x in differing if x["batch"] == b) for b in batches},
                      "first": differing[:12]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
