#!/usr/bin/env python3
"""The CPU engine's kernels for each instruction set, on one machine: how a model runs on a CPU
with less than this one has (AVX2 only, say), timed here.

    .venv/bin/python bench/cpu_isa_ab.py --model resnet50.onnx --model resnet50_int8.cpu.engine \\
        --isa avx512 [--isa avx-vnni] --isa avx2 [--bench NAME=KILN_CPU_BENCH ...] [--threads 2] [--rounds 3] [--runs 20] --out FILE

Each round runs build/bench/kiln_cpu_bench (or each --bench, another build's, to tell a change from
the machine's drift) once per model and instruction set, a process of its own, the order rotating
each round: `--isa` makes the float32 sgemm and the int8 GEMM
(cpu/int8_gemm.h) run as on a CPU with at most that instruction set. Models of float32 inputs only
(kiln_cpu_bench feeds random float32 data). An ONNX model is imported and
built by that process (so its layout passes see this CPU); an engine file (`kiln build --device cpu`,
INT8 ones included) is loaded as it is. The JSON has every round's median per model and
instruction set and the least of them (the one a shared machine disturbed least).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu_models_ab  # noqa: E402  (cpu_name)


def bench_median(bench: str, model: str, isa: str, threads: int, runs: int) -> float:
    """The median of `runs` runs of `model` by kiln_cpu_bench `bench` with --isa `isa`."""
    r = subprocess.run([bench, model, "--isa", isa, "--threads", str(threads), "--runs", str(runs), "--warmup", "3"],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"{os.path.basename(bench)} {model} --isa {isa} failed: {r.stderr.strip()}")
    return float(json.loads(r.stdout.strip().splitlines()[-1])["median_ms"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True, help="an ONNX model or a CPU engine file")
    p.add_argument("--isa", action="append", required=True, choices=["avx512", "avx-vnni", "avx2", "plain"])
    p.add_argument("--bench", action="append", help="NAME=PATH of a kiln_cpu_bench (default: this build's, as 'kiln')")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    benches = [b.split("=", 1) for b in args.bench] if args.bench else \
        [["kiln", os.path.join(HERE, "..", "build", "bench", "kiln_cpu_bench")]]
    cases = [(name, model, isa) for name, _ in benches for model in args.model for isa in args.isa]
    paths = dict(benches)
    rounds: dict[tuple[str, str, str], list[float]] = {case: [] for case in cases}
    for r in range(args.rounds):
        order = cases[r % len(cases):] + cases[:r % len(cases)]
        for name, model, isa in order:
            ms = bench_median(paths[name], model, isa, args.threads, args.runs)
            rounds[(name, model, isa)].append(ms)
            print(f"round {r + 1}/{args.rounds} {name} {os.path.basename(model)} --isa {isa}: median {ms:.2f} ms", flush=True)

    commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    results = [{"bench": name, "model": os.path.basename(model), "isa": isa, "threads": args.threads,
                "round_medians_ms": rounds[(name, model, isa)], "least_median_ms": min(rounds[(name, model, isa)])}
               for name, model, isa in cases]
    report = {"benchmark": "kiln CPU engine per instruction set (kiln_cpu_bench --isa)",
              "command": " ".join([os.path.relpath(sys.executable)] + sys.argv), "kiln_commit": commit, "benches": paths,
              "cpu": cpu_models_ab.cpu_name(), "cpus": os.cpu_count(),
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
              "load_average_after": list(os.getloadavg()), "results": results}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    for row in results:
        print(f"{row['bench']:<10} {row['model']:<36} {row['isa']:>7} {row['least_median_ms']:10.2f} ms")


if __name__ == "__main__":
    main()
