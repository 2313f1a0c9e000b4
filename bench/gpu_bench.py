#!/usr/bin/env python3
"""kiln's GPU engine and PyTorch side by side, in one run on one GPU (issue 3's benchmark).

    python3 bench/gpu_bench.py --out DIR [--models resnet50,mobilenet_v2] [--batches 1,128]

For each torchvision model (random weights, 3x224x224, exported to ONNX with a dynamic batch by
scripts/export_model.py): kiln fp16 and fp32 engines through `kiln bench` (CUDA events around
each run, synchronized after each) and the peers timed the same way as ../shared/perf/peers.py
does: PyTorch eager fp32, and torch.compile(mode="reduce-overhead") on the fp16 channels-last
model. kiln INT8 (--int8, calibrated on --calib-images random inputs of the export's own input
maker; entropy calibration, cache in DIR) unless --no-int8.
Also the build time of the fp16 engine, cold and with a warm timing cache. Writes
DIR/gpu_bench.json and prints a table; commit the JSON under bench/results/.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))


def kiln_bin() -> str:
    return os.environ.get("KILN_BIN", os.path.join(ROOT, "build-gpu", "kiln"))


def run(cmd: list[str], timeout: float = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs `cmd` (with `env` added to this process's environment), raising if it fails."""
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env} if env else None)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:], flush=True)
        raise RuntimeError(f"{cmd[0]} {cmd[1]} failed ({r.returncode})")
    return r


def export(name: str, path: str) -> None:
    if not os.path.exists(path):
        run([sys.executable, os.path.join(ROOT, "scripts", "export_model.py"), name, "--size", "224", "-o", path])


def kiln_bench(model: str, precision: str, batches: list[int], out: str, extra: list[str] = ()) -> list[dict]:
    js = os.path.join(out, f"kiln_{os.path.basename(model)}_{precision}.json")
    r = run([kiln_bin(), "bench", model, f"--{precision}", "--batches", ",".join(map(str, batches)), "--json", js, *extra])
    print(r.stdout, flush=True)
    with open(js) as f:
        return json.load(f)["results"]


def int8_extra(name: str, out: str, images: int) -> list[str]:
    """Calibration data for an INT8 build: random inputs made as the tests make them."""
    import numpy as np

    import export_model

    calib = os.path.join(out, f"{name}-calib.npy")
    if not os.path.exists(calib):
        np.save(calib, export_model.input_maker(name, size=224)(images, seed=5)[0])
    return ["--calib", calib, "--calib-cache", os.path.join(out, f"{name}.calib")]


def machine() -> dict:
    """What the GPU machine runs kiln with, for benchmark JSON: the libraries cuDNN's runtime-
    compiled engines depend on (their speed changed between machines: docs/design/int8.md, "The
    same binary on another machine"), the driver, the GPU's clocks and power limit, and the
    throttle reasons."""
    from importlib import metadata

    info = {}
    for package in ("nvidia-cudnn-cu13", "nvidia-cuda-nvrtc", "nvidia-cublas", "nvidia-cuda-runtime"):
        try:
            info[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            info[package] = None
    query = ("name,driver_version,power.limit,clocks.max.sm,clocks.max.mem,clocks.sm,temperature.gpu,ecc.mode.current,"
             "clocks_throttle_reasons.active")
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv"], capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = (r.stdout + r.stderr).strip()  # an unknown field on another driver: its message
    except OSError as e:
        info["nvidia_smi"] = f"nvidia-smi: {e}"
    # kiln's switches in the environment (KILN_PDL=1, KILN_GRAPH_TIMING=0, ...) change its builds
    # and runs: a figure measured under one says so.
    info["kiln_env"] = {k: v for k, v in sorted(os.environ.items())
                        if k.startswith("KILN_") and k not in ("KILN_BIN", "KILN_FASHION_MNIST_DIR")}
    return info


def time_fn(fn, iters: int, warm: int = 20):
    """peers.py's timing: events around each call, synchronized after each; median and p99."""
    import torch

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return statistics.median(ts), ts[int(0.99 * (len(ts) - 1))]


def torch_peers(name: str, batches: list[int], fp32_batches: list[int]) -> list[dict]:
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    rows = []
    base = getattr(torchvision.models, name)().eval().cuda()
    with torch.inference_mode():
        for bs in fp32_batches:
            x = torch.randn(bs, 3, 224, 224, device="cuda")
            med, p99 = time_fn(lambda: base(x), 200 if bs <= 32 else 50)
            rows.append({"cfg": "torch_eager_fp32", "batch": bs, "median_ms": med, "p99_ms": p99})
        mh = base.half().to(memory_format=torch.channels_last)
        torch._dynamo.reset()
        cm = torch.compile(mh, mode="reduce-overhead")
        for bs in batches:
            xh = torch.randn(bs, 3, 224, 224, device="cuda").half().to(memory_format=torch.channels_last)
            t0 = time.time()
            cm(xh)
            torch.cuda.synchronize()
            compile_s = time.time() - t0
            med, p99 = time_fn(lambda: cm(xh), 200 if bs <= 32 else 50)
            rows.append({"cfg": "torch_compile_reduce-overhead_fp16_cl", "batch": bs, "median_ms": med, "p99_ms": p99,
                         "compile_s": compile_s})
    for r in rows:
        r["items_per_s"] = r["batch"] / r["median_ms"] * 1000
        print(json.dumps({"model": name, **r}), flush=True)
    del base, mh, cm
    torch.cuda.empty_cache()
    return rows


def build_times(model: str, out: str) -> dict:
    cache = os.path.join(out, "timing.cache")
    if os.path.exists(cache):
        os.remove(cache)
    times = {}
    for label in ("cold", "warm_cache"):
        t0 = time.time()
        run([kiln_bin(), "build", model, "--fp16", "--batch", "128", "--timing-cache", cache, "-o",
             os.path.join(out, "build_test.engine")])
        times[label + "_s"] = time.time() - t0
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="resnet50")
    ap.add_argument("--batches", default="1,128")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-int8", action="store_true")
    ap.add_argument("--calib-images", type=int, default=32)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    import torch

    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "torch_fp32_note": "PyTorch eager fp32 lets cuDNN convolutions use TF32 (torch.backends.cudnn.allow_tf32 "
                               f"= {torch.backends.cudnn.allow_tf32}); kiln --tf32 is its like, kiln --fp32 is strict",
            "date": time.strftime("%Y-%m-%d"), "kiln": run([kiln_bin(), "--version"]).stdout.strip(), "machine": machine(),
            "command": " ".join(sys.argv), "timing": "CUDA events around each run, synchronized after each; "
            "median of 200 runs (50 for batch >= 64) after 20 warm-up runs, for kiln and PyTorch alike"}
    results = {"meta": meta, "models": {}}
    for name in args.models.split(","):
        path = os.path.join(args.out, f"{name}-224.onnx")
        export(name, path)
        entry = {"kiln_fp16": kiln_bench(path, "fp16", batches, args.out),
                 "kiln_tf32": kiln_bench(path, "tf32", [max(batches)], args.out),
                 "kiln_fp32": kiln_bench(path, "fp32", [max(batches)], args.out)}
        if not args.no_int8:
            entry["kiln_int8"] = kiln_bench(path, "int8", batches, args.out, int8_extra(name, args.out, args.calib_images))
        if name == "resnet50":
            entry["build_fp16_b128"] = build_times(path, args.out)
        if not args.no_peers:
            entry["torch"] = torch_peers(name, batches, [max(batches)])
        results["models"][name] = entry
        with open(os.path.join(args.out, "gpu_bench.json"), "w") as f:
            json.dump(results, f, indent=1)

    print(f"\n{'model':<16}{'config':<40}{'batch':>6}{'median ms':>11}{'items/s':>11}")
    for name, e in results["models"].items():
        for prec in ("kiln_int8", "kiln_fp16", "kiln_tf32", "kiln_fp32"):
            for r in e.get(prec, []):
                print(f"{name:<16}{prec:<40}{r['batch']:>6}{r['latency_ms']['median']:>11.4f}{r['throughput_per_s']:>11.1f}")
        for r in e.get("torch", []):
            print(f"{name:<16}{r['cfg']:<40}{r['batch']:>6}{r['median_ms']:>11.4f}{r['items_per_s']:>11.1f}")
        if e.get("kiln_int8") and e.get("kiln_fp32"):
            w8, w32 = e["kiln_int8"][0].get("weights_bytes", 0), e["kiln_fp32"][0].get("weights_bytes", 0)
            if w8 and w32:
                print(f"{name:<16}weights on the GPU: int8 engine {w8 / 2**20:.1f} MiB, fp32 engine {w32 / 2**20:.1f} MiB "
                      f"({100 * w8 / w32:.0f}%)")
        if "build_fp16_b128" in e:
            b = e["build_fp16_b128"]
            print(f"{name:<16}build fp16 b128: cold {b['cold_s']:.1f} s, warm cache {b['warm_cache_s']:.1f} s")


if __name__ == "__main__":
    main()
