#!/usr/bin/env python3
"""What a CPU engine costs in memory and on disk: its file, the memory a process that loads and
runs it takes beyond the kiln binary's own, and the load time, for one kiln build or two.

    .venv/bin/python bench/cpu_engine_memory.py --kiln build/kiln [--baseline OLD/kiln] \\
        [--models resnet50,mobilenet_v2,bert_base] [--precisions fp32,bf16,int8] [--rounds 3] --out FILE.json

Models are bench/cpu_compare.py's exports (torchvision's and HF transformers' architectures with
seeded random weights, opset 17), written to --work once. For each binary, model and precision:
`kiln build MODEL --device cpu [--bf16 | --int8 --calib-cache WORK/MODEL.calib] -o ENGINE` (the file's size, and how many of its weight
bytes are packed panels: docs/engine-format.md, "Packed weights"), then in each round, the
binaries alternating, `kiln bench ENGINE --threads T --duration S --warmup 1` in a process of
its own, its resident memory sampled from /proc: while it times runs (the second half of its
life), less the same on the Fashion-MNIST model's engine (models/fashion_mnist_resnet.onnx,
0.7 MB of weights: the binary, its libraries and the CPU engine's own start, measured in the
same round), is what the engine holds: its weights as the kernels keep them, plus one batch-1
run's activations; and the wall time of
`kiln inspect ENGINE` (which loads the engine) less that of the small engine's, the load time.
The JSON has a row per binary, model and precision with the medians of the rounds, the CPU
named, the command and the kiln commit.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu_compare  # noqa: E402  (export)
import cpu_resnet50  # noqa: E402  (kiln_commit, machine)


def resident_memory(cmd: list[str]) -> int:
    """Runs cmd, sampling its /proc status every 20 ms: the median resident memory (VmRSS) of the
    samples in the second half of its run (the timed runs: weights and activations held, the load's
    passing buffers gone), in bytes."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    start, samples = time.perf_counter(), []
    while proc.poll() is None:
        try:
            status = open(f"/proc/{proc.pid}/status").read()
            samples.append((time.perf_counter() - start, int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024))
        except (OSError, AttributeError):
            pass
        time.sleep(0.02)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode})")
    end = time.perf_counter() - start
    return int(statistics.median([rss for t, rss in samples if t > end / 2]))


def weight_bytes(engine: str) -> dict:
    """Bytes of the engine file's weights section stored as packed panels and as values."""
    import onnx

    data = open(engine, "rb").read()
    at, sections = 12, []
    for _ in range(3):
        (n,) = struct.unpack_from("<Q", data, at)
        sections.append(data[at + 8:at + 8 + n])
        at += 8 + n
    model = onnx.ModelProto()
    model.ParseFromString(sections[1])
    by_layout = collections.Counter()
    for t in model.graph.initializer:
        kv = {e.key: e.value for e in t.external_data}
        by_layout[kv.get("kiln_layout", "values")] += int(kv.get("length", 0))
    return {"packed_bytes": sum(v for k, v in by_layout.items() if k != "values"), "values_bytes": by_layout["values"],
            "by_layout": dict(by_layout)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--baseline", help="another kiln binary, measured in the same rounds")
    ap.add_argument("--models", default="resnet50,mobilenet_v2,bert_base")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="how long each kiln bench times runs")
    ap.add_argument("--work", default="/tmp/kiln_cpu_engine_memory")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    binaries = {"kiln": os.path.abspath(args.kiln)}
    if args.baseline:
        binaries["baseline"] = os.path.abspath(args.baseline)
    models = args.models.split(",")
    precisions = args.precisions.split(",")

    engines = {}
    for model in models:
        onnx_path = os.path.join(args.work, model + ".onnx")
        if not os.path.exists(onnx_path):
            print(f"exporting {model}", flush=True)
            cpu_compare.export(model, onnx_path)
        for label, binary in binaries.items():
            for precision in precisions:
                engine = os.path.join(args.work, f"{model}_{precision}_{label}.engine")
                cmd = [binary, "build", onnx_path, "--device", "cpu", "-o", engine]
                if precision == "bf16":
                    cmd.append("--bf16")
                elif precision == "int8":  # the scales of bench/cpu_compare.py's calibration, kept in --work
                    cache = os.path.join(args.work, model + ".calib")
                    if not os.path.exists(cache):
                        raise SystemExit(f"int8 needs {cache} (bench/cpu_compare.py --rows {model}_int8:1 writes it)")
                    cmd += ["--int8", "--calib-cache", cache]
                print(f"building {model} {precision} with {label}", flush=True)
                start = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True)
                engines[(label, model, precision)] = {"engine": engine, "build_s": time.perf_counter() - start}

    small_onnx = os.path.join(os.path.dirname(HERE), "models", "fashion_mnist_resnet.onnx")
    for label, binary in binaries.items():
        engines[(label, "small", "fp32")] = {"engine": os.path.join(args.work, f"small_{label}.engine")}
        subprocess.run([binary, "build", small_onnx, "--device", "cpu", "-o", engines[(label, "small", "fp32")]["engine"]],
                       check=True, capture_output=True)

    def measure(binary: str, engine: str) -> tuple[int, float]:
        held = resident_memory([binary, "bench", engine, "--threads", str(args.threads), "--duration",
                                        str(args.seconds), "--warmup", "1"])
        start = time.perf_counter()
        subprocess.run([binary, "inspect", engine], check=True, capture_output=True)
        return held, time.perf_counter() - start

    samples = collections.defaultdict(lambda: {"rss": [], "load_s": []})
    for r in range(args.rounds):
        order = list(binaries.items()) if r % 2 == 0 else list(reversed(binaries.items()))
        for label, binary in order:
            small_rss, small_s = measure(binary, engines[(label, "small", "fp32")]["engine"])
            for model in models:
                for precision in precisions:
                    rss, seconds = measure(binary, engines[(label, model, precision)]["engine"])
                    sample = samples[(label, model, precision)]
                    sample["rss"].append(rss - small_rss)
                    sample["load_s"].append(seconds - small_s)
                    print(f"round {r + 1}: {label} {model} {precision}: {(rss - small_rss) / 2**20:.1f} MiB held", flush=True)

    rows = []
    for (label, model, precision), s in samples.items():
        e = engines[(label, model, precision)]
        rows.append({"binary": label, "model": model, "precision": precision, "batch": 1, "threads": args.threads,
                     "file_bytes": os.path.getsize(e["engine"]), **weight_bytes(e["engine"]),
                     "engine_rss_bytes": statistics.median(s["rss"]),
                     "load_s": statistics.median(s["load_s"]),
                     "build_s": e["build_s"]})
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "machine": cpu_resnet50.machine(),
              "kiln_commit": cpu_resnet50.kiln_commit(HERE), "rounds": args.rounds, "binaries": binaries, "results": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{'binary':9s} {'model':13s} {'prec':5s} {'file MB':>8s} {'packed MB':>9s} {'held MiB':>9s} {'load s':>6s}")
    for row in rows:
        print(f"{row['binary']:9s} {row['model']:13s} {row['precision']:5s} {row['file_bytes'] / 1e6:8.1f} "
              f"{row['packed_bytes'] / 1e6:9.1f} {row['engine_rss_bytes'] / 2**20:9.1f} {row['load_s']:6.2f}")


if __name__ == "__main__":
    main()
