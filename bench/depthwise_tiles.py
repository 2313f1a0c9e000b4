#!/usr/bin/env python3
"""Every tile of kiln's float16 depthwise kernel, and cuDNN's best, on each depthwise layer of real models.

    python3 bench/depthwise_tiles.py --out DIR [--models convnext_tiny,efficientnet_b0] [--batches 1,128]

Runs on the GPU machine ($KILN_BIN or build-gpu/kiln). Each model is exported (random weights,
224x224) and built in float16 with KILN_TACTIC_LOG, which makes the build time every candidate
of every convolution and check each against a direct convolution; the log's depthwise lines
("tactic KEY: kernel depthwise 4x2/fixed/c4 0.1234 ms, relative error ...") are read back. Writes
DIR/depthwise_tiles.json: per model and batch, each depthwise layer's geometry key, every tile's
time, the fastest tile and cuDNN's fastest candidate (legacy or graph API); and a summary of how
many layers each tile wins and the sum of the winners' times. Prints a table per model and batch.
A tile that gives wrong results is marked rejected and counted as a failure (exit status 1).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_bench  # noqa: E402  (export, run, kiln_bin, machine)

LINE = re.compile(r"tactic (?P<key>\S+): (?P<what>.+?) (?P<ms>[0-9.]+) ms, relative error (?P<err>\S+)(?P<rejected> \(rejected\))?$")


def parse(log: str) -> dict[str, dict]:
    """{key: {"tiles": {name: ms}, "cudnn_ms": best, "rejected": [names]}} for layers with a depthwise candidate."""
    layers: dict[str, dict] = defaultdict(lambda: {"tiles": {}, "cudnn_ms": None, "rejected": []})
    for line in log.splitlines():
        m = LINE.search(line)
        if not m:
            continue
        entry = layers[m["key"]]
        ms = float(m["ms"])
        what = m["what"]
        if what.startswith("kernel depthwise "):
            name = what.split()[2]
            entry["tiles"][name] = ms
            if m["rejected"]:
                entry["rejected"].append(name)
        elif what.startswith(("legacy ", "graph ")) and not m["rejected"]:
            entry["cudnn_ms"] = ms if entry["cudnn_ms"] is None else min(entry["cudnn_ms"], ms)
    return {k: v for k, v in layers.items() if v["tiles"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="convnext_tiny,efficientnet_b0,mobilenet_v3_large")
    ap.add_argument("--batches", default="1,128")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    kiln = gpu_bench.kiln_bin()
    result = {"schema": "kiln.depthwise_tiles/1", "kiln": kiln, "machine": gpu_bench.machine(), "runs": []}
    failures = 0
    for model in args.models.split(","):
        onnx_path = os.path.join(args.out, f"{model}.onnx")
        gpu_bench.export(model, onnx_path)
        for batch in [int(b) for b in args.batches.split(",")]:
            engine = os.path.join(args.out, f"{model}_b{batch}.engine")
            print(f"==> {model} batch {batch}: building with every tactic logged", flush=True)
            r = gpu_bench.run([kiln, "build", onnx_path, "--fp16", "--batch", str(batch), "-o", engine],
                              env=dict(os.environ, KILN_TACTIC_LOG="1"))
            log = r.stdout + r.stderr
            with open(os.path.join(args.out, f"build_{model}_b{batch}.log"), "w") as f:
                f.write(log)
            layers = parse(log)
            wins: dict[str, int] = defaultdict(int)
            best_sum = 0.0
            cudnn_sum = 0.0
            print(f"{'layer key':60} {'best tile':16} {'ms':>8} {'cuDNN ms':>9}")
            for key, entry in layers.items():
                ok = {n: ms for n, ms in entry["tiles"].items() if n not in entry["rejected"]}
                failures += len(entry["rejected"])
                best = min(ok, key=ok.get) if ok else None
                entry["best"] = best
                if best:
                    wins[best] += 1
                    best_sum += ok[best]
                if entry["cudnn_ms"]:
                    cudnn_sum += entry["cudnn_ms"]
                cudnn = f"{entry['cudnn_ms']:9.4f}" if entry["cudnn_ms"] else "        -"
                print(f"{key[:60]:60} {best or '-':16} {ok.get(best, 0):8.4f} {cudnn}"
                      + (f"  REJECTED: {entry['rejected']}" if entry["rejected"] else ""))
            print(f"sum of the best tiles: {best_sum:.4f} ms; of cuDNN's best: {cudnn_sum:.4f} ms; wins: {dict(wins)}",
                  flush=True)
            result["runs"].append({"model": model, "batch": batch, "layers": layers, "wins": dict(wins),
                                   "best_tiles_ms": best_sum, "cudnn_best_ms": cudnn_sum})
    with open(os.path.join(args.out, "depthwise_tiles.json"), "w") as f:
        json.dump(result, f, indent=1)
    if failures:
        print(f"{failures} tile(s) rejected: wrong results", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
