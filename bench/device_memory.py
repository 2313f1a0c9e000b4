#!/usr/bin/env python3
"""Device memory of an engine file loaded and run, as a user sees it, against what `kiln inspect`
predicts before anything runs; for one or two kiln binaries on the same GPU.

    python3 bench/device_memory.py --out DIR [--kiln NEW[,OLD]] [--models resnet50,resnet18]
                                   [--configs fp16:1,int8:1]

For each model (torchvision, random weights, 224x224) and configuration (precision:batch), each
binary builds an engine file (`--int8 --int8-all` with one calibration cache shared by the
binaries), then `kiln inspect ENGINE --json` gives the prediction and `kiln bench ENGINE --json`,
a fresh process, measures cudaMemGetInfo's drop from before the engine is opened to after its
first runs, in three parts (opening the engine, making the context, the first runs). A binary
that predates the prediction or the parts leaves them out. Writes DIR/device_memory.json and
prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_bench  # noqa: E402  (export, run, int8_extra, machine)


def measure(kiln: str, onnx: str, precision: str, batch: int, out: str, tag: str) -> dict:
    engine = os.path.join(out, f"{tag}.engine")
    extra = ["--int8-all", *gpu_bench.int8_extra(os.path.basename(onnx)[:-5], out, 16)] if precision == "int8" else []
    gpu_bench.run([kiln, "build", onnx, f"--{precision}", *extra, "--batch", str(batch), "-o", engine, "-q"])
    inspected = os.path.join(out, f"{tag}.inspect.json")
    gpu_bench.run([kiln, "inspect", engine, "--json", inspected])
    with open(inspected) as f:
        memory = json.load(f)["memory"]
    benched = os.path.join(out, f"{tag}.bench.json")
    gpu_bench.run([kiln, "bench", engine, "--iterations", "50", "--json", benched])
    with open(benched) as f:
        result = json.load(f)["results"][0]
    row = {"weight_bytes": memory["weight_bytes"], "activation_bytes": memory["activation_bytes"],
           "workspace_bytes": memory["workspace_bytes"], "predicted_bytes": memory.get("device_memory_bytes"),
           "measured_bytes": result["gpu_memory_used_bytes"], "median_ms": result["latency_ms"]["median"]}
    for part in ("engine", "context", "first_runs"):
        if f"gpu_memory_{part}_bytes" in result:
            row[f"measured_{part}_bytes"] = result[f"gpu_memory_{part}_bytes"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--kiln", default=gpu_bench.kiln_bin(), help="one binary, or NEW,OLD")
    ap.add_argument("--models", default="resnet50,resnet18,mobilenet_v3_large")
    ap.add_argument("--configs", default="fp16:1,int8:1")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    binaries = [os.path.abspath(k) for k in args.kiln.split(",")]
    configs = [(c.split(":")[0], int(c.split(":")[1])) for c in args.configs.split(",")]
    built_from = {}
    for kiln in binaries:  # scripts/build_gpu.sh's record beside the packed binary, where there is one
        info = os.path.join(os.path.dirname(kiln), "dist" + os.path.basename(kiln)[4:], "BUILD_INFO.json")
        if os.path.exists(info):
            with open(info) as f:
                built_from[kiln] = json.load(f).get("commit")
    results = {"meta": {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "binaries": binaries,
                        "binaries_built_from": built_from,
                        "machine": gpu_bench.machine(),
                        "measured": "cudaMemGetInfo's free memory before kiln bench opens the engine file, minus after "
                                    "its warm-up runs (CUDA graph captured); 2 MiB pages"},
               "rows": []}
    for model in args.models.split(","):
        onnx = os.path.join(args.out, f"{model}.onnx")
        gpu_bench.export(model, onnx)
        for precision, batch in configs:
            for i, kiln in enumerate(binaries):
                row = {"model": model, "precision": precision, "batch": batch, "binary": kiln,
                       **measure(kiln, onnx, precision, batch, args.out, f"{model}-{precision}-b{batch}-{i}")}
                results["rows"].append(row)
                mib = lambda key: f"{row[key] / 2**20:7.1f}" if row.get(key) is not None else "      -"
                print(f"{model:<20} {precision}:{batch:<4} binary {i}: measured {mib('measured_bytes')} MiB "
                      f"({row['measured_bytes'] / 1e6:.1f} MB), predicted {mib('predicted_bytes')} MiB, "
                      f"weights {row['weight_bytes'] / 1e6:.1f} MB, parts {mib('measured_engine_bytes')} "
                      f"{mib('measured_context_bytes')} {mib('measured_first_runs_bytes')} MiB", flush=True)
    with open(os.path.join(args.out, "device_memory.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
