#!/usr/bin/env python3
"""Probe: which multi-context runs of a GPU engine disagree with one context alone.

    PYTHONPATH=build-gpu/python python3 bench/probes/contexts_probe.py

ResNet-18 at 64x64 (fp16). For each case, 4 threads with a context each run the listed batch
sizes for some rounds; every result is compared with what one context computed alone first.
Cases: a static engine at batch 8 and at batch 16; a dynamic engine (1..16, opt 8) at batch 16
only, at mixed batches, and at mixed batches without CUDA graphs. Prints one line per case.
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import export_model  # noqa: E402
import kiln  # noqa: E402


def threads_case(engine, batches, spec, graphs=True, threads=4, rounds=12):
    inputs = {b: spec.make_inputs(b, 300 + b)[0] for b in batches}
    alone = engine.create_context(graphs)
    want = {b: alone.run({"input": inputs[b]})["output"].copy() for b in batches}
    contexts = [engine.create_context(graphs) for _ in range(threads)]
    errors = []
    start = threading.Barrier(threads)

    def work(t):
        start.wait()
        for r in range(rounds):
            b = batches[(t * 2 + r) % len(batches)]
            got = contexts[t].run({"input": inputs[b]})["output"]
            if not np.array_equal(got, want[b]):
                errors.append((t, r, b, float(np.abs(got - want[b]).max())))

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return errors


def main():
    tmp = tempfile.mkdtemp()
    spec = export_model.load_model("resnet18", size=64)
    path = os.path.join(tmp, "resnet18.onnx")
    export_model.export(spec, path, "torchscript", 17)
    dynamic = kiln.Builder(precision="fp16", device="cuda",
                           profiles=[{"input": ([1, 3, 64, 64], [8, 3, 64, 64], [16, 3, 64, 64])}]).build(path)
    cases = [
        ("static b8", kiln.Builder(precision="fp16", device="cuda", shapes={"input": [8, 3, 64, 64]}).build(path), [8], True),
        ("static b16", kiln.Builder(precision="fp16", device="cuda", shapes={"input": [16, 3, 64, 64]}).build(path), [16], True),
        ("dynamic b16 only", dynamic, [16], True),
        ("dynamic b8 only", dynamic, [8], True),
        ("dynamic mixed", dynamic, [1, 3, 6, 8, 11, 16], True),
        ("dynamic mixed, no graphs", dynamic, [1, 3, 6, 8, 11, 16], False),
    ]
    for name, engine, batches, graphs in cases:
        errors = threads_case(engine, batches, spec, graphs)
        print(f"{name:<28} {len(errors)} mismatches {errors[:4]}", flush=True)
    for layer in kiln.Builder(precision="fp16", device="cuda", shapes={"input": [16, 3, 64, 64]}).build(path).info()["layers"]:
        print(f"  b16 {layer['op']:<12} {layer['name'][:40]:<40} {layer['tactic']}")


if __name__ == "__main__":
    main()
