#!/usr/bin/env python3
"""What a CPU engine's run costs as its input grows, against the copy of the input alone.

    PYTHONPATH=build/python python3 bench/cpu_run_input_sizes.py --out FILE [--rows 1,16,64] [--runs 20]
        [--python-paths OLD_BUILD/python,NEW_BUILD/python --rounds 3]

The model only slices one pixel out of each [N, 3, 224, 224] image and multiplies it by a
[1000, 3] matrix, so a run is almost all the Python binding's copy of the input into kiln's
aligned memory. Each row gives the median Engine.run time and, for scale, the median time numpy
takes to copy the same array into fresh memory and into memory it has written before. With
--python-paths the runs alternate between kiln Python packages (one subprocess per run of the
measurement, the order swapped every round), to compare two builds of the binding on one machine.
Writes JSON {"results": [{"package", "round", "rows", "input_mb", "run_ms", "fresh_copy_ms",
"reused_copy_ms"}], "cpu", "date", "command"}.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time


def model(path: str) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((1000, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.zeros(1000, np.float32), "b"),
             numpy_helper.from_array(np.array([0, 0], np.int64), "starts"),
             numpy_helper.from_array(np.array([1, 1], np.int64), "ends"),
             numpy_helper.from_array(np.array([2, 3], np.int64), "axes")]
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["pixel"]),
             helper.make_node("Flatten", ["pixel"], ["flat"]),
             helper.make_node("Gemm", ["flat", "w", "b"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "slice", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 224, 224])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1000])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def measure(path: str, rows: list[int], runs: int) -> list[dict]:
    import numpy as np

    import kiln

    engine = kiln.Builder(device="cpu").build(path)

    def median_ms(fn) -> float:
        fn()
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    out = []
    for n in rows:
        x = np.random.default_rng(n).standard_normal((n, 3, 224, 224)).astype(np.float32)
        reused = np.empty_like(x)
        out.append({"rows": n, "input_mb": x.nbytes / 1e6,
                    "run_ms": median_ms(lambda: engine.run({"x": x})),
                    "fresh_copy_ms": median_ms(lambda: x.copy()),
                    "reused_copy_ms": median_ms(lambda: np.copyto(reused, x))})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rows", default="1,16,64")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--python-paths", default="", help="kiln Python package folders to alternate (default: this one)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--measure-only", help=argparse.SUPPRESS)  # a subprocess's model path
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if args.measure_only:
        json.dump(measure(args.measure_only, rows, args.runs), sys.stdout)
        return 0
    results = []
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "slice.onnx")
        model(path)
        packages = [pp for pp in args.python_paths.split(",") if pp] or [""]
        for r in range(args.rounds):
            for package in (packages if r % 2 == 0 else packages[::-1]):
                env = dict(os.environ)
                if package:
                    env["PYTHONPATH"] = os.path.abspath(package) + os.pathsep + env.get("PYTHONPATH", "")
                proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--out", "-", "--rows", args.rows,
                                       "--runs", str(args.runs), "--measure-only", path],
                                      env=env, capture_output=True, text=True, check=True)
                for row in json.loads(proc.stdout):
                    results.append({"package": package or "default", "round": r, **row})
                    print(f"round {r} {package or 'default'}: {row['rows']:3d} rows ({row['input_mb']:.1f} MB) run "
                          f"{row['run_ms']:.2f} ms, numpy copy fresh {row['fresh_copy_ms']:.2f} / reused "
                          f"{row['reused_copy_ms']:.2f} ms", flush=True)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    with open(args.out, "w") as f:
        json.dump({"results": results, "cpu": cpu, "cores": os.cpu_count(),
                   "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
