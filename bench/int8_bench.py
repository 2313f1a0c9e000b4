#!/usr/bin/env python3
"""The INT8 issue's criteria, measured in one run on one GPU (issue 4, item 7), and FP8 beside them.

    python3 bench/int8_bench.py --out DIR [--model resnet50] [--batches 1,128] [--rounds 3]
                                [--calib-images 512] [--fashion-mnist-dir DIR]

1. Calibration: `kiln calibrate MODEL --calib calib.npy --batch 32 --device cuda` over
   --calib-images random inputs (the export's own input maker), wall time of the command.
2. Engines from that cache: `kiln build --int8 --calib-cache ...` and `--fp8 ...` (INT8 and
   FP8 where they time faster than fp16, what a user gets; the build logs, with each layer's
   choice, are kept as DIR/build_PREC_bN.log), `--int8 --int8-all` and `--fp8 --fp8-all` (every
   eligible layer quantized: "int8all", "fp8all") and `kiln build --fp16` per batch,
   `kiln build --fp32` once (for the engine-file sizes), with their build times (--no-fp8
   leaves FP8 out).
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


def timed(cmd: list[str], log: str | None = None) -> tuple[float, str]:
    t0 = time.time()
    r = gpu_bench.run(cmd)
    if log:
        with open(log, "w") as f:
            f.write(r.stderr)
    return time.time() - t0, r.stdout


def evaluate(args: list[str], out: str, tag: str) -> dict:
    js = os.path.join(out, f"eval_{tag}.json")
    seconds, _ = timed([gpu_bench.kiln_bin(), "eval", os.path.join(ROOT, "models", "fashion_mnist_resnet.onnx"),
                        "--dataset", "fashion-mnist", "--device", "cuda", "--json", js, *args])
    with open(js) as f:
        r = json.load(f)
    r["wall_s"] = seconds
    return r


def summarize_log(log_path: str, gpu: str) -> dict:
    """The latency stage of a run cut short before it wrote its JSON, from its printed log: each
    `kiln bench ENGINE ... --json .../kiln_KEY_rN.json` command and the median it printed, and
    the torch.compile lines; figures as main() computes them (mean of the rounds' medians)."""
    import re

    runs: dict[str, list[float]] = {}
    torch_rows, key = [], None
    for line in open(log_path):
        m = re.match(r"\+ \S+ bench \S+ .*--json \S*/kiln_(\w+)_r(\d+)\.json", line)
        if m:
            key = m.group(1)
            continue
        m = re.match(r"batch\s+\d+\s+\w+: median ([\d.]+) ms", line)
        if m and key:
            runs.setdefault(key, []).append(float(m.group(1)))
            key = None
        elif line.startswith("{") and "torch_compile" in line:
            torch_rows.append(json.loads(line))
    latency = {k: {"median_ms_per_round": v, "mean_of_medians_ms": statistics.mean(v)} for k, v in runs.items()}
    ms = lambda k: latency[k]["mean_of_medians_ms"]  # noqa: E731
    ratios = {}
    for b in sorted({int(k.split("_b")[1]) for k in latency}):
        for prec in ("int8", "fp8", "fp8all"):
            if f"{prec}_b{b}" in latency and f"fp16_b{b}" in latency:
                ratios[f"fp16_over_{prec}_b{b}"] = ms(f"fp16_b{b}") / ms(f"{prec}_b{b}")
    return {"meta": {"gpu": gpu, "source_log": os.path.basename(log_path),
                     "note": "summarized from the log of a run cut short (by its time limit) after the latency and "
                             "torch.compile stages: `python3 bench/int8_bench.py --summarize-log LOG --gpu NAME`"},
            "latency": latency, "torch": torch_rows, "fp16_over": ratios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--summarize-log", help="summarize the printed log of a run cut short (with --gpu), print JSON")
    ap.add_argument("--gpu", default="")
    if "--summarize-log" in sys.argv:
        a, _ = ap.parse_known_args()
        print(json.dumps(summarize_log(a.summarize_log, a.gpu), indent=1))
        return
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
    meta["machine"] = gpu_bench.machine()
    results: dict = {"meta": meta}
    json_path = os.path.join(args.out, "int8_bench.json")

    def save() -> None:  # after every stage, so a run cut short keeps what it measured
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)
    model = os.path.join(args.out, f"{args.model}-224.onnx")
    gpu_bench.export(args.model, model)

    # 1. Calibration on the GPU.
    calib = os.path.join(args.out, f"calib{args.calib_images}.npy")
    np.save(calib, export_model.input_maker(args.model, size=224)(args.calib_images, seed=5)[0])
    cache = os.path.join(args.out, f"{args.model}.calib")
    seconds, log = timed([kiln, "calibrate", model, "--calib", calib, "--batch", "32", "--device", "cuda", "-o", cache])
    print(log, flush=True)
    results["calibration"] = {"images": args.calib_images, "batch": 32, "wall_s": seconds, "device": "cuda"}
    save()

    # 2. Engine files.
    engines: dict[str, str] = {}
    builds = {}
    precisions = ("int8", "int8all", "fp16") if args.no_fp8 else ("int8", "int8all", "fp16", "fp8", "fp8all")
    flags = {"int8all": ["--int8", "--int8-all"], "fp8all": ["--fp8", "--fp8-all"]}
    # One timing cache for every build: a layer timed once (fp16 layers of the FP8 builds, the
    # FP8 layers of --fp8 and --fp8-all) is not timed again; build times below are with it.
    timing_cache = os.path.join(args.out, "timing.cache")
    for prec in precisions:
        for b in batches:
            path = os.path.join(args.out, f"{args.model}_{prec}_b{b}.engine")
            extra = ["--calib-cache", cache] if prec != "fp16" else []
            builds[f"{prec}_b{b}_s"], _ = timed([kiln, "build", model, *flags.get(prec, [f"--{prec}"]), "--batch", str(b),
                                                 "-o", path, "-v", "--timing-cache", timing_cache, *extra],
                                                os.path.join(args.out, f"build_{prec}_b{b}.log"))
            engines[f"{prec}_b{b}"] = path
    fp32_engine = os.path.join(args.out, f"{args.model}_fp32_b{batches[0]}.engine")
    builds[f"fp32_b{batches[0]}_s"], _ = timed([kiln, "build", model, "--fp32", "--batch", str(batches[0]), "-o", fp32_engine])
    sizes = {"fp32": os.path.getsize(fp32_engine)}
    for prec in precisions:
        sizes[prec] = os.path.getsize(engines[f"{prec}_b{batches[0]}"])
    results["builds"] = builds
    results["engine_bytes"] = sizes
    results["engine_bytes_by_batch"] = {k: os.path.getsize(v) for k, v in engines.items()}
    # What each build chose: its quantized layers (layers kept in fp16 are in `kiln inspect`'s
    # int8_kept_float, with the timing that put them there).
    results["quantized_layers"] = {}
    for key, path in engines.items():
        info = json.loads(gpu_bench.run([kiln, "inspect", path, "--json"]).stdout)
        results["quantized_layers"][key] = sum(1 for l in info.get("layers", []) if l.get("op") == "QConv")
    save()

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
    save()
    if not args.no_peers:
        results["torch"] = gpu_bench.torch_peers(args.model, batches, [])
        save()

    # 4. Fashion-MNIST accuracy.
    results["fashion_mnist"] = {
        "fp32": evaluate([], args.out, "fp32"),
        "int8": evaluate(["--int8", "--calib", "fashion-mnist", "--calib-batches", "8", "--calib-batch", "64"], args.out, "int8"),
        "int8all": evaluate(["--int8", "--int8-all", "--calib", "fashion-mnist", "--calib-batches", "8", "--calib-batch",
                             "64"], args.out, "int8all"),
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
    # The INT8 builds against fp16: where faster (what --int8 builds; the criteria) and all INT8.
    results["int8"] = {f"fp16_over_{p}_b{b}": ms(f"fp16_b{b}") / ms(f"{p}_b{b}") for p in ("int8", "int8all") for b in batches}
    results["criteria"] = [{"name": n, "value": v, "target": f"{op} {t}", "met": (v >= t if op == ">=" else v <= t)}
                           for n, v, op, t in criteria]
    if not args.no_fp8:  # FP8 is offered where it is faster than fp16: these say where
        results["fp8"] = {f"fp16_over_fp8_b{b}": ms(f"fp16_b{b}") / ms(f"fp8_b{b}") for b in batches}
        results["fp8"].update({f"int8_over_fp8_b{b}": ms(f"int8_b{b}") / ms(f"fp8_b{b}") for b in batches})
        results["fp8"].update({f"fp16_over_fp8all_b{b}": ms(f"fp16_b{b}") / ms(f"fp8all_b{b}") for b in batches})
    save()

    print(f"\n{meta['gpu']}, {args.model}")
    print(f"{'engine':<12}{'batch':>6}  median ms per round")
    for key, v in latency.items():
        print(f"{key:<12}{key.split('_b')[1]:>6}  " + " ".join(f"{m:.4f}" for m in v["median_ms_per_round"]) +
              f"  mean {v['mean_of_medians_ms']:.4f}")
    for r in results.get("torch", []):
        print(f"torch.compile b{r['batch']}: {r['median_ms']:.4f} ms")
    print("engine files: " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sizes.items()))
    print("quantized layers: " + ", ".join(f"{k} {v}" for k, v in results["quantized_layers"].items()))
    print("fashion-mnist top-1: " + ", ".join(f"{k} {v['top1']:.4f}" for k, v in fm.items()))
    for k, v in results.get("fp8", {}).items():
        print(f"{k:<40}{v:>10.4f}")
    for c in results["criteria"]:
        print(f"{c['name']:<40}{c['value']:>10.4f}  target {c['target']:<8} {'met' if c['met'] else 'NOT MET'}")


if __name__ == "__main__":
    main()
