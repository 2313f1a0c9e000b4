#!/usr/bin/env python3
"""The INT8 issue's criteria, measured in one run on one GPU (issue 4, item 7), and FP8 beside them.

    python3 bench/int8_bench.py --out DIR [--model resnet50] [--batches 1,128] [--rounds 3]
                                [--calib-images 512] [--fashion-mnist-dir DIR]

1. Calibration: `kiln calibrate MODEL --calib calib.npy --batch 32 --device cuda` over
   --calib-images random inputs (the export's own input maker), wall time of the command.
2. Engines from that cache: `kiln build --int8 --calib-cache ...`, `--fp8 --calib-cache ...`
   and `kiln build --fp16` per batch, `kiln build --fp32` once (for the engine-file sizes), with
   their build times (--no-fp8 leaves FP8 out).
3. Latency: `kiln bench ENGINE` of the INT8, FP8 and fp16 engines in alternating rounds (the
   order rotates every round); each configuration's figure is the mean of its rounds' medians.
   torch.compile(mode="reduce-overhead") fp16 channels-last in the same run (gpu_bench.py's timing).
4. Accuracy on real data: `kiln eval models/fashion_mnist_resnet.onnx --dataset fashion-mnist
   --device cuda` in fp32, INT8 and FP8 (calibrated on 512 train images), top-1 over the 10k
   test split.
Writes DIR/int8_bench.json with every figure and the criteria, and prints a table; commit the
JSON under bench/results/.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dynamic_bench  # noqa: E402  (bench_engine)
import gpu_bench  # noqa: E402  (export, run, torch_peers, kiln_bin)

ROOT = gpu_bench.ROOT


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.time()
    r = gpu_bench.run(cmd)
    return time.time() - t0, r.stdout


def evaluate(args: list[str], out: str, tag: str) -> dict:
    js = os.path.join(out, f"eval_{tag}.json")
    seconds, _ = timed([gpu_bench.kiln_bin(), "eval", os.path.join(ROOT, "models", "fashion_mnist_resnet.onnx"),
                        "--dataset", "fashion-mnist", "--device", "cuda", "--json", js, *args])
    with open(js) as f:
        r = json.load(f)
    r["wall_s"] = seconds
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batches", default="1,128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calib-images", type=int, default=512)
    ap.add_argument("--fashion-mnist-dir", default=os.environ.get("KILN_FASHION_MNIST_DIR", ""),
                    help="Fashion-MNIST's idx files (default: $KILN_FASHION_MNIST_DIR, else Debian's)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-fp8", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.fashion_mnist_dir:
        os.environ["KILN_FASHION_MNIST_DIR"] = os.path.abspath(args.fashion_mnist_dir)
    batches = [int(b) for b in args.batches.split(",")]
    kiln = gpu_bench.kiln_bin()
    import numpy as np
    import torch

    import export_model

    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "kiln": gpu_bench.run([kiln, "--version"]).stdout.strip(), "command": " ".join(sys.argv),
            "timing": "kiln bench: CUDA events around each CUDA-graph replay, synchronized after each; median of 200 "
                      "runs (50 for batch >= 64) after 20 warm-up runs; INT8 and fp16 in alternating rounds, the "
                      "figure is the mean of the rounds' medians; torch.compile timed like gpu_bench.py"}
    results: dict = {"meta": meta}
    model = os.path.join(args.out, f"{args.model}-224.onnx")
    gpu_bench.export(args.model, model)

    # 1. Calibration on the GPU.
    calib = os.path.join(args.out, f"calib{args.calib_images}.npy")
    np.save(calib, export_model.input_maker(args.model, size=224)(args.calib_images, seed=5)[0])
    cache = os.path.join(args.out, f"{args.model}.calib")
    seconds, log = timed([kiln, "calibrate", model, "--calib", calib, "--batch", "32", "--device", "cuda", "-o", cache])
    print(log, flush=True)
    results["calibration"] = {"images": args.calib_images, "batch": 32, "wall_s": seconds, "device": "cuda"}

    # 2. Engine files.
    engines: dict[str, str] = {}
    builds = {}
    precisions = ("int8", "fp16") if args.no_fp8 else ("int8", "fp16", "fp8")
    for prec in precisions:
        for b in batches:
            path = os.path.join(args.out, f"{args.model}_{prec}_b{b}.engine")
            extra = ["--calib-cache", cache] if prec in ("int8", "fp8") else []
            builds[f"{prec}_b{b}_s"], _ = timed([kiln, "build", model, f"--{prec}", "--batch", str(b), "-o", path, *extra])
            engines[f"{prec}_b{b}"] = path
    fp32_engine = os.path.join(args.out, f"{args.model}_fp32_b{batches[0]}.engine")
    builds[f"fp32_b{batches[0]}_s"], _ = timed([kiln, "build", model, "--fp32", "--batch", str(batches[0]), "-o", fp32_engine])
    sizes = {"fp32": os.path.getsize(fp32_engine)}
    for prec in precisions:
        sizes[prec] = os.path.getsize(engines[f"{prec}_b{batches[0]}"])
    results["builds"] = builds
    results["engine_bytes"] = sizes

    # 3. Latency, alternating rounds.
    runs: dict[str, list[dict]] = {k: [] for k in engines}
    for rnd in range(args.rounds):
        for b in batches:
            order = precisions[rnd % len(precisions):] + precisions[:rnd % len(precisions)]
            for prec in order:
                key = f"{prec}_b{b}"
                runs[key].append(dynamic_bench.bench_engine(engines[key], [b], args.out, f"{key}_r{rnd}")[0])
    latency = {}
    for key, rs in runs.items():
        medians = [r["latency_ms"]["median"] for r in rs]
        latency[key] = {"median_ms_per_round": medians, "mean_of_medians_ms": statistics.mean(medians),
                        "p99_ms_per_round": [r["latency_ms"].get("p99") for r in rs]}
    results["latency"] = latency
    if not args.no_peers:
        results["torch"] = gpu_bench.torch_peers(args.model, batches, [])

    # 4. Fashion-MNIST accuracy.
    results["fashion_mnist"] = {
        "fp32": evaluate([], args.out, "fp32"),
        "int8": evaluate(["--int8", "--calib", "fashion-mnist", "--calib-batches", "8", "--calib-batch", "64"], args.out, "int8"),
    }
    if not args.no_fp8:
        results["fashion_mnist"]["fp8"] = evaluate(["--fp8", "--calib", "fashion-mnist", "--calib-batches", "8", "--calib-batch",
                                                    "64"], args.out, "fp8")

    # The criteria of the issue.
    lo, hi = min(batches), max(batches)
    ms = lambda k: latency[k]["mean_of_medians_ms"]  # noqa: E731
    fm = results["fashion_mnist"]
    criteria = [
        ("int8_throughput_vs_fp16_b%d" % hi, ms(f"fp16_b{hi}") / ms(f"int8_b{hi}"), ">=", 1.3),
        ("int8_latency_vs_fp16_b%d" % lo, ms(f"int8_b{lo}") / ms(f"fp16_b{lo}"), "<=", 1.0),
        ("int8_engine_size_vs_fp32", sizes["int8"] / sizes["fp32"], "<=", 0.30),
        ("fashion_mnist_top1_drop_points", 100 * (fm["fp32"]["top1"] - fm["int8"]["top1"]), "<=", 0.5),
        ("calibration_%d_images_s" % args.calib_images, seconds, "<=", 30.0),
    ]
    results["criteria"] = [{"name": n, "value": v, "target": f"{op} {t}", "met": (v >= t if op == ">=" else v <= t)}
                           for n, v, op, t in criteria]
    if not args.no_fp8:  # FP8 is offered where it is faster than fp16: these say where
        results["fp8"] = {f"fp16_over_fp8_b{b}": ms(f"fp16_b{b}") / ms(f"fp8_b{b}") for b in batches}
        results["fp8"].update({f"int8_over_fp8_b{b}": ms(f"int8_b{b}") / ms(f"fp8_b{b}") for b in batches})
    with open(os.path.join(args.out, "int8_bench.json"), "w") as f:
        json.dump(results, f, indent=1)

    print(f"\n{meta['gpu']}, {args.model}")
    print(f"{'engine':<12}{'batch':>6}  median ms per round")
    for key, v in latency.items():
        print(f"{key:<12}{key.split('_b')[1]:>6}  " + " ".join(f"{m:.4f}" for m in v["median_ms_per_round"]) +
              f"  mean {v['mean_of_medians_ms']:.4f}")
    for r in results.get("torch", []):
        print(f"torch.compile b{r['batch']}: {r['median_ms']:.4f} ms")
    print("engine files: " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sizes.items()))
    print("fashion-mnist top-1: " + ", ".join(f"{k} {v['top1']:.4f}" for k, v in fm.items()))
    for k, v in results.get("fp8", {}).items():
        print(f"{k:<40}{v:>10.4f}")
    for c in results["criteria"]:
        print(f"{c['name']:<40}{c['value']:>10.4f}  target {c['target']:<8} {'met' if c['met'] else 'NOT MET'}")


if __name__ == "__main__":
    main()
