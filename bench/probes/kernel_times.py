#!/usr/bin/env python3
"""Each kernel's own time inside an engine's CUDA graph, for engines built several ways (a probe).

    python3 bench/probes/kernel_times.py --out DIR [--batch 1] [--engines fp16,int8all]
                                         [--stream-timing] [--rounds 3] [--no-ncu]

At batch 1 the whole-engine latency and the per-layer profile disagree (docs/design/int8.md,
"Why per-layer timing misleads at batch 1"): the profile times each layer with its own launch,
the engine replays one CUDA graph.
This probe asks Nsight Compute for each graph node's duration (`ncu --graph-profiling node`,
gpu__time_duration, clocks and caches left alone so that weights stay in L2 as between replays)
and for the whole graph's (`--graph-profiling graph`), beside `kiln bench`'s replay latency of
the same engine. What the graph spends outside its kernels' own time is launch gaps and ramps.

Engines: fp16, int8 (where faster), int8all (every eligible layer INT8), fp8all, each optionally
with environment variables for its build and its runs (`int8all:KILN_INT8_K_SPLITS=4`,
`int8all:KILN_PDL=1`, which is read at launch); --stream-timing builds
each a second time with its tactics timed on the stream, KILN_GRAPH_TIMING=0 ("-st" in the keys;
graph timing is the builder's default). Writes DIR/kernel_times.json
(every kernel row per engine, the sums, the latencies) and prints a per-engine summary.
"""
from __future__ import annotations

import argparse
import csv
import glob
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gpu_bench  # noqa: E402  (export, run, kiln_bin, machine)


def find_ncu() -> str:
    found = shutil.which("ncu") or next(iter(sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))), None)
    if not found:
        raise SystemExit("kernel_times: Nsight Compute (ncu) is not on this machine")
    return found


def ncu_rows(ncu: str, kiln: str, engine: str, batch: int, mode: str, env: dict[str, str]) -> list[dict]:
    """Kernel (mode=node) or graph (mode=graph) durations of `kiln bench ENGINE`'s replays, with
    `env` added to the environment."""
    cmd = [ncu, "--graph-profiling", mode, "--clock-control", "none", "--cache-control", "none",
           "--metrics", "gpu__time_duration.sum", "--csv", "--print-units", "base",
           kiln, "bench", engine, "--batches", str(batch), "--warmup", "1", "--iterations", "2"]
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env={**os.environ, **env})
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:], flush=True)
        raise RuntimeError(f"ncu failed ({r.returncode})")
    text = r.stdout[r.stdout.find('"ID"'):]
    rows = []
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        rows.append({"id": int(row["ID"]), "name": row["Kernel Name"], "grid": row["Grid Size"],
                     "block": row["Block Size"], "ns": float(row["Metric Value"].replace(",", ""))})
    return rows


def last_replay(rows: list[dict]) -> list[dict]:
    """The rows of the last of the bench's replays: the longest tail that repeats just before it."""
    n = len(rows)
    for length in range(n // 2, 0, -1):
        tail, before = rows[n - length:], rows[n - 2 * length:n - length]
        if [r["name"] for r in tail] == [r["name"] for r in before]:
            return tail
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--engines", default="fp16,int8all")
    ap.add_argument("--stream-timing", action="store_true", help="also build each with KILN_GRAPH_TIMING=0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--build-flags", default="", help="extra flags for every build")
    ap.add_argument("--no-ncu", action="store_true", help="latencies only (no Nsight Compute runs)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import numpy as np

    import export_model

    kiln = gpu_bench.kiln_bin()
    ncu = None if args.no_ncu else find_ncu()
    results: dict = {"meta": {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
                              "kiln": gpu_bench.run([kiln, "--version"]).stdout.strip(),
                              "machine": gpu_bench.machine(), "ncu": ncu,
                              "method": "ncu --graph-profiling node|graph --clock-control none --cache-control none, "
                                        "gpu__time_duration.sum of the last of kiln bench's replays; latency: kiln "
                                        "bench median, engines in alternating rounds, mean of the rounds' medians"}}
    model = os.path.join(args.out, f"{args.model}-224.onnx")
    gpu_bench.export(args.model, model)
    calib = os.path.join(args.out, "calib64.npy")
    np.save(calib, export_model.input_maker(args.model, size=224)(64, seed=5)[0])
    cache = os.path.join(args.out, f"{args.model}.calib")
    gpu_bench.run([kiln, "calibrate", model, "--calib", calib, "--batch", "32", "--device", "cuda", "-o", cache])

    flags = {"fp16": ["--fp16"], "int8": ["--int8", "--calib-cache", cache],
             "int8all": ["--int8", "--int8-all", "--calib-cache", cache],
             "fp8all": ["--fp8", "--fp8-all", "--calib-cache", cache]}
    engines: dict[str, str] = {}
    run_env: dict[str, dict[str, str]] = {}  # per engine: its variables, for its runs as for its build
    for spec in args.engines.split(","):
        name, *env_vars = spec.split(":")  # e.g. int8all:KILN_INT8_K_SPLITS=4
        for stream in ([False, True] if args.stream_timing else [False]):
            key = "-".join([name, *(v.split("=")[1] for v in env_vars)]) + ("-st" if stream else "")
            path = os.path.join(args.out, f"{key}_b{args.batch}.engine")
            env = dict(v.split("=", 1) for v in env_vars)
            if stream:
                env["KILN_GRAPH_TIMING"] = "0"
            r = gpu_bench.run([kiln, "build", model, *flags[name], "--batch", str(args.batch), "-v", "-o", path,
                               *args.build_flags.split()], env=env)
            with open(os.path.join(args.out, f"build_{key}_b{args.batch}.log"), "w") as f:
                f.write(r.stderr)
            engines[key] = path
            run_env[key] = {k: v for k, v in env.items() if k != "KILN_GRAPH_TIMING"}

    medians: dict[str, list[float]] = {k: [] for k in engines}
    for rnd in range(args.rounds):
        keys = list(engines)[rnd % len(engines):] + list(engines)[:rnd % len(engines)]
        for key in keys:
            js = os.path.join(args.out, f"bench_{key}_r{rnd}.json")
            gpu_bench.run([kiln, "bench", engines[key], "--batches", str(args.batch), "--json", js], env=run_env[key])
            with open(js) as f:
                medians[key].append(json.load(f)["results"][0]["latency_ms"]["median"])

    per_engine = {}
    for key, path in engines.items():
        nodes = last_replay(ncu_rows(ncu, kiln, path, args.batch, "node", run_env[key])) if ncu else []
        graph = ncu_rows(ncu, kiln, path, args.batch, "graph", run_env[key]) if ncu else []
        kernel_us = sum(r["ns"] for r in nodes) / 1e3
        graph_us = graph[-1]["ns"] / 1e3 if graph else float("nan")
        latency_us = statistics.mean(medians[key]) * 1e3
        per_engine[key] = {"latency_us": latency_us, "latency_medians_ms": medians[key], "graph_us": graph_us,
                           "kernel_sum_us": kernel_us, "kernels": len(nodes),
                           "gap_per_kernel_us": (graph_us - kernel_us) / max(1, len(nodes)), "rows": nodes,
                           "engine_bytes": os.path.getsize(path), "env": run_env[key]}
        with open(os.path.join(args.out, "kernel_times.json"), "w") as f:
            json.dump({**results, "engines": per_engine}, f, indent=1)
    print(f"{'engine':<14}{'latency us':>12}{'graph us':>10}{'kernels us':>12}{'kernels':>9}{'gap/kernel':>12}")
    for key, e in per_engine.items():
        print(f"{key:<14}{e['latency_us']:>12.1f}{e['graph_us']:>10.1f}{e['kernel_sum_us']:>12.1f}{e['kernels']:>9}"
              f"{e['gap_per_kernel_us']:>12.2f}")


if __name__ == "__main__":
    main()
