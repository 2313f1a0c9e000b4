#!/usr/bin/env python3
"""Whole ONNX models on the CPU engine: kiln builds against each other and ONNX Runtime's CPU
provider, in alternating rounds, for models the other CPU benches do not export (a detection
model exported by bench/detection_bench.py, say).

    .venv/bin/python bench/cpu_models_ab.py --model A.onnx --model B.onnx --kiln before=KILN --kiln after=KILN \\
        [--threads 2] [--rounds 3] [--runs 10] --out FILE

Each round times, in turn, every kiln build (`kiln bench MODEL --device cpu --threads T
--iterations RUNS --json`, a process of its own: the median of its runs) and ONNX Runtime
(intra_op_num_threads = T, the median of RUNS runs after 2 warm-up runs on a seeded random input
of the model's shape), the order rotating each round. The JSON has every round's medians and,
per model and engine, the least of them (the one a shared machine disturbed least).
Every engine runs the same input: seeded uniform [0, 1) data (integers 0), saved as .npy and
given to kiln bench with --input, which matters for a model whose work depends on its data (a
detection model's box selection). --kiln-random-inputs lets kiln bench feed its own random data
instead, for builds that predate --input; ONNX Runtime's input then differs from kiln's.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np


def model_feed(model: str) -> dict:
    """The model's inputs: seeded uniform [0, 1) data at its shapes (dynamic dimensions 1)."""
    import onnxruntime as ort

    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    types = {"tensor(float)": np.float32, "tensor(int64)": np.int64}
    return {i.name: np.random.default_rng(0).random([d if isinstance(d, int) else 1 for d in i.shape]).astype(types[i.type])
            for i in session.get_inputs()}


def kiln_median(kiln: str, model: str, threads: int, runs: int, feed: dict | None) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        inputs = []
        for name, value in (feed or {}).items():
            path = os.path.join(tmp, f"input{len(inputs)}.npy")
            np.save(path, value)
            inputs += ["--input", f"{name}={path}"]
        r = subprocess.run([kiln, "bench", model, "--device", "cpu", "--threads", str(threads), "--iterations", str(runs),
                            "--json", out, *inputs], capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise SystemExit(f"{kiln} bench {model} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
        with open(out) as f:
            return float(json.load(f)["results"][0]["latency_ms"]["median"])


def ort_median(model: str, threads: int, runs: int, feed: dict) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    for _ in range(2):
        session.run(None, feed)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - start) * 1000.0)
    return float(np.median(times))


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True)
    p.add_argument("--kiln", action="append", required=True, help="NAME=PATH of a kiln CLI")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--kiln-random-inputs", action="store_true",
                   help="kiln bench feeds its own random data (builds without --input); ONNX Runtime's input then differs")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    feeds = {model: model_feed(model) for model in args.model}
    builds = dict(k.split("=", 1) for k in args.kiln)
    engines = [*builds, "onnxruntime"]
    doc = {"command": " ".join([os.path.basename(sys.executable), *sys.argv]),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cpu": cpu_name(),
           "threads": args.threads, "kiln_builds": builds,
           "inputs": "kiln's own random data; ONNX Runtime seeded uniform" if args.kiln_random_inputs
           else "the same seeded uniform [0, 1) data for every engine", "rounds": [], "results": []}
    for r in range(args.rounds):
        order = engines[r % len(engines):] + engines[:r % len(engines)]
        row = {}
        for model in args.model:
            for engine in order:
                ms = (ort_median(model, args.threads, args.runs, feeds[model]) if engine == "onnxruntime"
                      else kiln_median(builds[engine], model, args.threads, args.runs,
                                       None if args.kiln_random_inputs else feeds[model]))
                row[f"{os.path.basename(model)}|{engine}"] = ms
                print(f"round {r + 1}: {os.path.basename(model)} {engine}: {ms:.2f} ms", flush=True)
        doc["rounds"].append(row)
    for model in args.model:
        entry = {"model": os.path.basename(model)}
        for engine in engines:
            entry[f"{engine}_ms"] = min(rnd[f"{os.path.basename(model)}|{engine}"] for rnd in doc["rounds"])
        doc["results"].append(entry)
        print(entry, flush=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
