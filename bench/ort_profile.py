#!/usr/bin/env python3
"""ONNX Runtime's CPU provider, node by node: the per-layer counterpart of
`kiln bench MODEL --device cpu --exportProfile FILE`.

    .venv/bin/python bench/ort_profile.py MODEL.onnx --threads 2 --batch 1 --out FILE.json

Runs the model --runs times on seeded random inputs (float32, integer inputs 0 or 1; the first dimension of each input
set to --batch) with ONNX Runtime's profiler on (all graph optimizations, --threads intra-op
threads) and writes, for every node ONNX Runtime ran (after its fusions: a fused node carries its
last output's name), the median of its kernel times over the runs after --warmup, in ms,
slowest first.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import tempfile

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=13)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort_profile")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feed = {}
    for i in session.get_inputs():
        shape = [args.batch if k == 0 else (d if isinstance(d, int) else 1) for k, d in enumerate(i.shape)]
        if i.type in ("tensor(int64)", "tensor(int32)"):  # token ids, masks: 0 or 1 (valid for both)
            feed[i.name] = rng.integers(0, 2, shape).astype(np.int64 if i.type == "tensor(int64)" else np.int32)
        else:
            feed[i.name] = rng.random(shape, dtype=np.float32)
    for _ in range(args.runs):
        session.run(None, feed)
    trace = session.end_profiling()
    with open(trace) as f:
        events = json.load(f)
    os.remove(trace)
    times = collections.defaultdict(list)
    ops = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            times[name].append(e["dur"] / 1000.0)
            ops[name] = e["args"].get("op_name")
    nodes = []
    for name, t in times.items():
        kept = sorted(t[args.warmup:] or t)
        nodes.append({"name": name, "op": ops[name], "median_ms": kept[len(kept) // 2]})
    nodes.sort(key=lambda n: -n["median_ms"])
    result = {
        "command": "bench/ort_profile.py " + " ".join(
            [os.path.basename(args.model), "--threads", str(args.threads), "--batch", str(args.batch), "--runs",
             str(args.runs), "--warmup", str(args.warmup)]),
        "onnxruntime": ort.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "threads": args.threads,
        "batch": args.batch,
        "total_ms": sum(n["median_ms"] for n in nodes),
        "nodes": nodes,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{len(nodes)} nodes, {result['total_ms']:.2f} ms in all; wrote {args.out}")


if __name__ == "__main__":
    main()
