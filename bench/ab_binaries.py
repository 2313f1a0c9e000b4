#!/usr/bin/env python3
"""Two kiln binaries on one GPU, in alternating rounds: is a change in speed the code or the machine?

    python3 bench/ab_binaries.py --a OLD_KILN --b NEW_KILN --out DIR [--model resnet50] [--export-args="--size 224"]
                                 [--configs int8:1,int8:128,fp16:1] [--rounds 3] [--b-flags=--int8-all]
                                 [--shared-timing-cache] [--build-rounds 1]

ResNet-50's INT8 engines once measured slower on a later day than on an earlier one (batch 1:
0.349 against 0.275 ms on an H100) with unchanged INT8 code, and this script showed it was the
machine (docs/design/int8.md, "The same binary on another machine"). Build the older commit
too (`git worktree add /tmp/old COMMIT && (cd /tmp/old && bash scripts/build_gpu.sh)`; carry
both build-gpu/dist folders) and run this on the GPU machine: each binary calibrates once
when a configuration is quantized (`kiln calibrate`, 64 random images), builds every
configuration (precision:batch) with -v (the build logs, with each layer's tactic, are kept in
DIR; --build-rounds N builds N times, alternating A and B, for build-time A/Bs), and the
engines are timed by `kiln bench` in alternating rounds, the order of A and B swapped every
round. Writes DIR/ab_binaries.json (mean of the rounds' medians per binary and configuration,
their ratio, each build's wall time and engine file size, nvidia-smi's clocks and throttle
reasons before and after, and the layers whose tactic differs between A's and B's engines) and
prints a table. Tactics are chosen by timing, so two builds may differ by noise alone:
--shared-timing-cache has B take A's timed tactics wherever their keys agree (and makes every
build after the first take them from the cache: no build-time A/B with it).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_bench  # noqa: E402  (export, run)


def smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "-q", "-d", "PERFORMANCE,CLOCK,POWER"], capture_output=True, text=True,
                              timeout=30).stdout
    except OSError as e:
        return f"nvidia-smi: {e}"


def layer_tactics(build_log: str) -> dict[str, str]:
    """{layer: tactic} from a build's -v lines ("[12/80] name (Op): tactic")."""
    out = {}
    for line in build_log.splitlines():
        m = re.search(r"\[\d+/\d+\] (.+?) \(([^()]+)\): (.+)$", line)
        if m:
            out[m.group(1)] = m.group(3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the first kiln binary (e.g. the older commit's)")
    ap.add_argument("--b", required=True, help="the second kiln binary")
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--export-args", default="--size 224",
                    help="scripts/export_model.py's flags for the model (a transformer: --seq-len 128)")
    ap.add_argument("--configs", default="int8:1,int8:128,fp16:1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--build-rounds", type=int, default=1,
                    help="build each configuration this many times per binary, alternating (build-time A/Bs: 3)")
    ap.add_argument("--a-flags", default="", help="extra build flags for A's quantized builds")
    ap.add_argument("--a-env", default="", help="KEY=VALUE,... set for A's builds only (e.g. KILN_NO_GENERATED_KERNELS=1)")
    ap.add_argument("--b-env", default="", help="KEY=VALUE,... set for B's builds only (e.g. KILN_GRAPH_TIMING=0)")
    ap.add_argument("--shared-timing-cache", action="store_true",
                    help="A builds with a timing cache that B then reads, so both take the same tactics where their "
                    "keys agree (the binaries' code compared, not two timings' noise)")
    ap.add_argument("--b-flags", default="", help="extra build flags for B's quantized builds (e.g. --int8-all, which "
                    "a binary from before INT8 where-faster builds by default)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import numpy as np

    import export_model

    binaries = {"a": os.path.abspath(args.a), "b": os.path.abspath(args.b)}
    configs = [(c.split(":")[0], int(c.split(":")[1])) for c in args.configs.split(",")]
    results: dict = {"meta": {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "binaries": binaries,
                              "versions": {k: gpu_bench.run([v, "--version"]).stdout.strip() for k, v in binaries.items()},
                              "machine": gpu_bench.machine(), "nvidia_smi_before": smi()}}
    model = os.path.join(args.out, f"{args.model}.onnx")
    gpu_bench.run([sys.executable, os.path.join(gpu_bench.ROOT, "scripts", "export_model.py"), args.model,
                   *args.export_args.split(), "-o", model])
    quantized = any(prec in ("int8", "fp8") for prec, _ in configs)
    calib = os.path.join(args.out, "calib64.npy")
    if quantized:
        np.save(calib, export_model.input_maker(args.model, size=224)(64, seed=5)[0])

    engines: dict[tuple[str, str, int], str] = {}
    build_seconds: dict[str, list[float]] = {}  # wall time of each `kiln build`, per side and configuration
    engine_bytes: dict[str, int] = {}
    tactics: dict[tuple[str, str, int], dict[str, str]] = {}
    for side, kiln in binaries.items():
        if quantized:
            gpu_bench.run([kiln, "calibrate", model, "--calib", calib, "--batch", "32", "--device", "cuda", "-o",
                           os.path.join(args.out, f"{side}.calib")])
    # Builds in rounds, the order of A and B swapped every round: the first build of a model on a
    # machine also pays for what the driver caches across processes (CUDA's JIT cache), which an
    # A/B of build times must not charge to one side. The engines of the last round are timed.
    for rnd in range(args.build_rounds):
        for prec, batch in configs:
            for side in (("a", "b") if rnd % 2 == 0 else ("b", "a")):
                kiln = binaries[side]
                path = os.path.join(args.out, f"{side}_{prec}_b{batch}.engine")
                extra = ["--calib-cache", os.path.join(args.out, f"{side}.calib")] if prec in ("int8", "fp8") else []
                flags = args.b_flags if side == "b" else args.a_flags
                if extra and flags:
                    extra += flags.split()
                if args.shared_timing_cache:
                    extra += ["--timing-cache", os.path.join(args.out, f"timing_{prec}_b{batch}.cache")]
                env = dict(kv.split("=", 1) for kv in (args.b_env if side == "b" else args.a_env).split(",") if kv)
                started = time.perf_counter()
                r = gpu_bench.run([kiln, "build", model, f"--{prec}", "--batch", str(batch), "-v", "-o", path, *extra], env=env)
                build_seconds.setdefault(f"{side}_{prec}_b{batch}", []).append(time.perf_counter() - started)
                print(f"build round {rnd}: {side} {prec} batch {batch}: {build_seconds[f'{side}_{prec}_b{batch}'][-1]:.2f} s",
                      flush=True)
                engine_bytes[f"{side}_{prec}_b{batch}"] = os.path.getsize(path)
                with open(os.path.join(args.out, f"build_{side}_{prec}_b{batch}.log"), "w") as f:
                    f.write(r.stderr)
                engines[(side, prec, batch)] = path
                tactics[(side, prec, batch)] = layer_tactics(r.stderr)
    # Layers whose tactic differs between the two engines of a configuration (the build logs' lines).
    results["meta"]["tactic_differences"] = {
        f"{prec}_b{batch}": sorted(f"{name}: {tactics[('a', prec, batch)].get(name)} -> {tactics[('b', prec, batch)].get(name)}"
                                   for name in set(tactics[("a", prec, batch)]) | set(tactics[("b", prec, batch)])
                                   if tactics[("a", prec, batch)].get(name) != tactics[("b", prec, batch)].get(name))
        for prec, batch in configs}
    for config, differences in results["meta"]["tactic_differences"].items():
        print(f"{config}: {len(differences)} layer(s) with another tactic in B" +
              "".join(f"\n  {d}" for d in differences[:20]), flush=True)

    medians: dict[str, list[float]] = {}
    for rnd in range(args.rounds):
        order = ("a", "b") if rnd % 2 == 0 else ("b", "a")
        for prec, batch in configs:
            for side in order:
                js = os.path.join(args.out, f"bench_{side}_{prec}_b{batch}_r{rnd}.json")
                # (the engine was built for this batch: it runs at its own shapes)
                r = gpu_bench.run([binaries[side], "bench", engines[(side, prec, batch)], "--json", js])
                print(r.stdout, flush=True)
                with open(js) as f:
                    medians.setdefault(f"{side}_{prec}_b{batch}", []).append(json.load(f)["results"][0]["latency_ms"]["median"])
    table = {}
    for prec, batch in configs:
        a, b = (statistics.mean(medians[f"{s}_{prec}_b{batch}"]) for s in ("a", "b"))
        table[f"{prec}_b{batch}"] = {"a_ms": a, "b_ms": b, "b_over_a": b / a,
                                     "a_medians": medians[f"a_{prec}_b{batch}"], "b_medians": medians[f"b_{prec}_b{batch}"]}
    results["latency"] = table
    results["build_seconds"] = build_seconds
    results["engine_bytes"] = engine_bytes
    results["meta"]["nvidia_smi_after"] = smi()
    with open(os.path.join(args.out, "ab_binaries.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"{'config':<14}{'A ms':>10}{'B ms':>10}{'B/A':>8}")
    for k, v in table.items():
        print(f"{k:<14}{v['a_ms']:>10.4f}{v['b_ms']:>10.4f}{v['b_over_a']:>8.3f}")
    for k, v in build_seconds.items():
        print(f"build {k}: " + ", ".join(f"{s:.2f}" for s in v) + " s")


if __name__ == "__main__":
    main()
