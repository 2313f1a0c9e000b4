#!/usr/bin/env python3
"""kiln's CPU engine against ONNX Runtime's CPU provider on torchvision ResNet-50.

Exports resnet50 (random weights, torch seed 0) at opset 17 with a dynamic batch dim, times
ONNX Runtime (intra_op_num_threads = --threads) and kiln (bench/kiln_cpu_bench --threads) on the
same random input, checks that their outputs agree, and writes bench/results/cpu_resnet50.json.

    .venv/bin/python bench/cpu_resnet50.py --kiln-bench build/bench/kiln_cpu_bench

The engines are timed in alternating rounds, so load from other processes hits all of them.
--baseline-bench times a second kiln_cpu_bench (another build) in the same rounds. --contend N
runs N busy processes (one core each) throughout, as a shared machine would: how much each
engine loses when other work takes cores it counted on.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def export(path):
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, input_names=["input"],
                      output_names=["logits"], dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})


def stats(times):
    s = sorted(times)
    return {"median_ms": statistics.median(s), "mean_ms": statistics.fmean(s),
            "p90_ms": s[min(len(s) - 1, round(0.9 * (len(s) - 1)))], "min_ms": s[0], "runs": len(s)}


def time_ort(path, x, threads, runs, warmup):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    for _ in range(warmup):
        y = sess.run(None, feed)[0]
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        y = sess.run(None, feed)[0]
        times.append((time.perf_counter() - t0) * 1e3)
    return times, y


def time_kiln(bench, path, input_bin, output_bin, threads, runs, warmup, fuse):
    # (OMP_NUM_THREADS too, for a baseline build whose CPU engine runs on OpenMP and has no
    # --threads: it reads the flag's absence as an error, so the flag goes only where taken.)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [bench, path, "--runs", str(runs), "--warmup", str(warmup), "--input", input_bin,
           "--dump-output", output_bin]
    if "--threads" in subprocess.run([bench], capture_output=True, text=True).stderr:
        cmd += ["--threads", str(threads)]
    if not fuse:
        cmd.append("--no-fuse")
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    result = json.loads(out)
    y = np.fromfile(output_bin, dtype=np.float32)
    return result, y


def kiln_commit(here):
    """The checkout's commit (with "+dirty" when files differ), so figures name the code."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, check=True, capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":/src", ":/bench",
                                ":(exclude,top)bench/results"],
                               cwd=here, capture_output=True, text=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def machine():
    info = {"platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln-bench", default=os.path.join(here, "..", "build", "bench", "kiln_cpu_bench"))
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "kiln_bench", "resnet50_opset17.onnx"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30, help="timed runs per engine per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--baseline-bench", help="another build's kiln_cpu_bench, timed in the same rounds")
    ap.add_argument("--contend", type=int, default=0, help="busy processes running throughout")
    ap.add_argument("--out", default=None, help="default bench/results/cpu_resnet50[_tN][_contendN].json")
    args = ap.parse_args()
    if args.out is None:
        suffix = ("" if args.threads == 2 else f"_t{args.threads}") + (f"_contend{args.contend}" if args.contend else "")
        args.out = os.path.join(here, "results", f"cpu_resnet50{suffix}.json")

    if not os.path.exists(args.model):
        os.makedirs(os.path.dirname(args.model), exist_ok=True)
        export(args.model)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    work = tempfile.mkdtemp(prefix="kiln_bench_")
    input_bin = os.path.join(work, "input.bin")
    output_bin = os.path.join(work, "output.bin")
    x.tofile(input_bin)

    import onnxruntime as ort

    load_before = os.getloadavg()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.contend)]
    ort_times, kiln_times, kiln_unfused_times, baseline_times = [], [], [], []
    kiln_info = baseline = None
    try:
        for _ in range(args.rounds):
            t, y_ort = time_ort(args.model, x, args.threads, args.runs, args.warmup)
            ort_times += t
            kiln_info, y_kiln = time_kiln(args.kiln_bench, args.model, input_bin, output_bin, args.threads,
                                          args.runs, args.warmup, fuse=True)
            kiln_times += kiln_info["times_ms"]
            unfused, y_unfused = time_kiln(args.kiln_bench, args.model, input_bin, output_bin, args.threads,
                                           args.runs, args.warmup, fuse=False)
            kiln_unfused_times += unfused["times_ms"]
            if args.baseline_bench:
                baseline, y_baseline = time_kiln(args.baseline_bench, args.model, input_bin, output_bin, args.threads,
                                                 args.runs, args.warmup, fuse=True)
                baseline_times += baseline["times_ms"]
    finally:
        for p in busy:
            p.kill()

    def diff(y):
        y = y.reshape(y_ort.shape)
        return float(np.max(np.abs(y - y_ort))), float(np.max(np.abs(y_ort)))

    max_diff, scale = diff(y_kiln)
    max_diff_unfused, _ = diff(y_unfused)
    o, k, ku = stats(ort_times), stats(kiln_times), stats(kiln_unfused_times)
    result = {
        "benchmark": "torchvision resnet50, random weights (seed 0), batch 1, 3x224x224 float32, opset 17",
        "command": " ".join([os.path.relpath(sys.executable)] + sys.argv),
        "kiln_commit": kiln_commit(here),
        "load_average_before": load_before,
        "threads": args.threads,
        "busy_processes": args.contend,
        "load_average_after": os.getloadavg(),
        "machine": machine(),
        "onnxruntime": dict(o, version=ort.__version__, intra_op_num_threads=args.threads),
        "kiln_optimized": dict(k, op_counts=kiln_info["op_counts"]),
        "kiln_unfused": dict(ku, op_counts=unfused["op_counts"]),
        "kiln_over_ort_median": k["median_ms"] / o["median_ms"],
        "kiln_unfused_over_ort_median": ku["median_ms"] / o["median_ms"],
        "max_abs_diff_vs_ort": max_diff,
        "max_abs_diff_vs_ort_unfused": max_diff_unfused,
        "max_abs_output": scale,
        **({"kiln_baseline": dict(stats(baseline_times), bench=args.baseline_bench),
            "kiln_over_baseline_median": k["median_ms"] / stats(baseline_times)["median_ms"],
            "max_abs_diff_vs_ort_baseline": diff(y_baseline)[0]} if args.baseline_bench else {}),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"onnxruntime   median {o['median_ms']:.2f} ms  mean {o['mean_ms']:.2f}  p90 {o['p90_ms']:.2f}")
    print(f"kiln (fused)  median {k['median_ms']:.2f} ms  mean {k['mean_ms']:.2f}  p90 {k['p90_ms']:.2f}  "
          f"ratio {result['kiln_over_ort_median']:.2f}x  max|diff| {max_diff:.2e} (|y| <= {scale:.2f})")
    print(f"kiln unfused  median {ku['median_ms']:.2f} ms  mean {ku['mean_ms']:.2f}  p90 {ku['p90_ms']:.2f}  "
          f"ratio {result['kiln_unfused_over_ort_median']:.2f}x  max|diff| {max_diff_unfused:.2e}")
    if args.baseline_bench:
        b = result["kiln_baseline"]
        print(f"kiln baseline median {b['median_ms']:.2f} ms  mean {b['mean_ms']:.2f}  p90 {b['p90_ms']:.2f}  "
              f"kiln / baseline {result['kiln_over_baseline_median']:.2f}x")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
