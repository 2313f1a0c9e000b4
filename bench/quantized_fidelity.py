#!/usr/bin/env python3
"""How close kiln's INT8 and FP8 references come to float32 on a transformer, per calibration
algorithm: the CPU engine's quantized reference (the arithmetic the GPU engines are tested
against), so the figures need no GPU and say what the format and the scales cost, apart from
any GPU kernel.

    python3 bench/quantized_fidelity.py --out DIR [--models bert_base] [--algos entropy,minmax,percentile]
                                        [--precisions int8,fp8] [--batch 2] [--kiln build/kiln]

Models, inputs and calibration data are bench/transformer_bench.py's (random weights, seeded;
64 calibration rows from another seed, batches of 16). For each algorithm, `kiln calibrate
--device cpu --calib-algo ALGO`; for each precision, `kiln run --device cpu --PRECISION
--calib-cache CACHE` on `--batch` rows, every eligible product quantized (the CPU engine has no
where-faster choice), against `kiln run --device cpu` in float32: cosine similarity and relative
L2 error of the output. Writes DIR/quantized_fidelity.json and prints a table.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_bench  # noqa: E402  (run)
import transformer_bench  # noqa: E402  (export, inputs_for, input_names)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="bert_base")
    ap.add_argument("--algos", default="entropy,minmax,percentile")
    ap.add_argument("--precisions", default="int8,fp8")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    a = ap.parse_args()
    work = os.path.join(a.out, "work")
    os.makedirs(work, exist_ok=True)
    result = {"schema": "kiln.quantized-fidelity/1", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": "cpu", "reference": "kiln CPU engine, float32", "batch": a.batch, "models": {}}
    for name in a.models.split(","):
        model = os.path.join(work, f"{name}.onnx")
        transformer_bench.export(name, model)
        names = transformer_bench.input_names(name)
        calib = os.path.join(work, f"calib_{name}")
        os.makedirs(calib, exist_ok=True)
        for n, x in zip(names, transformer_bench.inputs_for(name, 64, seed=1000)):
            np.save(os.path.join(calib, f"{n}.npy"), x.numpy())
        inputs = []
        for n, x in zip(names, transformer_bench.inputs_for(name, a.batch)):
            path = os.path.join(work, f"input_{name}_{n}.npy")
            np.save(path, x.numpy())
            inputs += ["--input", f"{n}={path}"]

        def output(tag: str, *flags: str):
            out_dir = os.path.join(work, f"out_{name}_{tag}")
            gpu_bench.run([a.kiln, "run", model, "--device", "cpu", "--top-k", "0", "-o", out_dir, *inputs, *flags])
            return np.load(os.path.join(out_dir, "output.npy")).astype(np.float64)

        reference = output("fp32")
        rows = []
        for algo in a.algos.split(","):
            cache = os.path.join(work, f"{name}_{algo}.calib")
            t0 = time.time()
            gpu_bench.run([a.kiln, "calibrate", model, "--calib", calib, "--batch", "16", "--calib-algo", algo, "--device", "cpu",
                      "-o", cache])
            seconds = time.time() - t0
            for precision in a.precisions.split(","):
                got = output(f"{precision}_{algo}", f"--{precision}", "--calib-cache", cache)
                cosine = float((got * reference).sum() / (np.linalg.norm(got) * np.linalg.norm(reference)))
                relative_l2 = float(np.linalg.norm(got - reference) / np.linalg.norm(reference))
                rows.append({"algorithm": algo, "precision": precision, "cosine": cosine, "relative_l2": relative_l2,
                             "calibration_s": round(seconds, 1)})
                print(json.dumps({"model": name, **rows[-1]}), flush=True)
        result["models"][name] = {"calibration": {"rows": 64, "batch": 16, "device": "cpu"}, "results": rows}
        with open(os.path.join(a.out, "quantized_fidelity.json"), "w") as f:
            json.dump(result, f, indent=1)
    print(f"{'model':<10} {'algorithm':<11} {'precision':<9} {'cosine':>9} {'rel. L2':>8}")
    for name, entry in result["models"].items():
        for r in entry["results"]:
            print(f"{name:<10} {r['algorithm']:<11} {r['precision']:<9} {r['cosine']:>9.6f} {r['relative_l2']:>8.4f}")


if __name__ == "__main__":
    main()
