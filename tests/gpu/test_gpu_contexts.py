"""Several execution contexts of one GPU engine, used from several threads at once (the header's
thread-safety contract: an Engine is shared, each Context belongs to one thread): every thread's
results equal what one context computes alone, run after run. Python threads run truly in
parallel here: the package releases the GIL while kiln runs. And compute-sanitizer (memcheck,
racecheck, synccheck) over GPU runs of the command line finds no invalid access, shared-memory
race or invalid synchronization in kiln's layers, nor memcheck any in its builder."""
from __future__ import annotations

import os
import shutil
import subprocess
import threading

import numpy as np
import pytest

import kiln


def on_threads(contexts, rounds, job):
    """Runs job(context, thread, round) -> "" or what went wrong, on one thread per context, all
    starting together; returns the problems (exceptions included, not lost in the threads)."""
    errors = []
    start = threading.Barrier(len(contexts))

    def work(t: int) -> None:
        try:
            start.wait()
            for r in range(rounds):
                problem = job(contexts[t], t, r)
                if problem:
                    errors.append(f"thread {t} round {r}: {problem}")
        except Exception as e:
            errors.append(f"thread {t}: {type(e).__name__}: {e}")

    pool = [threading.Thread(target=work, args=(t,)) for t in range(len(contexts))]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return errors


def mismatch(got, want):
    return "" if np.array_equal(got, want) else f"max diff {np.abs(got - want).max()}"


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_contexts_on_threads_match_one_context(resnet18_64, precision):
    path, spec = resnet18_64
    builder = kiln.Builder(precision=precision, device="cuda", shapes={"input": [8, 3, 64, 64]}, quantize_all=True)
    if precision == "int8":
        builder.calibrate(path, [spec.make_inputs(8, 100 + i)[0] for i in range(4)], progress=False)
    engine = builder.build(path)
    inputs = [spec.make_inputs(8, 200 + i)[0] for i in range(6)]
    alone = engine.create_context()
    want = [alone.run({"input": x})["output"].copy() for x in inputs]
    assert not np.array_equal(want[0], want[1])

    contexts = [engine.create_context() for _ in range(4)]

    def job(context, t, r):
        i = (t + r) % len(inputs)  # threads run different inputs at the same moment
        return mismatch(context.run({"input": inputs[i]})["output"], want[i])

    errors = on_threads(contexts, 15, job)
    assert not errors, errors[:5]


def test_contexts_at_different_shapes_on_threads(resnet18_64):
    """One dynamic engine, four threads, each context running its own batch sizes (shapes planned
    while other threads run): every result equals one context's at that shape."""
    path, spec = resnet18_64
    engine = kiln.Builder(precision="fp16", device="cuda",
                          profiles=[{"input": ([1, 3, 64, 64], [8, 3, 64, 64], [16, 3, 64, 64])}]).build(path)
    batches = [1, 3, 6, 8, 11, 16]
    inputs = {b: spec.make_inputs(b, 300 + b)[0] for b in batches}
    alone = engine.create_context()
    want = {b: alone.run({"input": inputs[b]})["output"].copy() for b in batches}
    contexts = [engine.create_context() for _ in range(4)]

    def job(context, t, r):
        b = batches[(t * 2 + r) % len(batches)]
        return mismatch(context.run({"input": inputs[b]})["output"], want[b])

    errors = on_threads(contexts, 12, job)
    assert not errors, errors[:5]


@pytest.fixture(scope="module")
def sanitized_engines(kiln_bin, resnet18_64, tmp_path_factory):
    """Engine files of ResNet-18 at 64x64 (built outside the sanitizer, whose slowdown would make
    tactic timing take hours) and the runs to check: (kiln run arguments, label)."""
    path, spec = resnet18_64
    folder = tmp_path_factory.mktemp("sanitized")
    calib = folder / "calib.npy"
    np.save(calib, spec.make_inputs(16, 5)[0])
    builds = {"fp32": ["--batch", "2"], "fp16": ["--fp16", "--batch", "2"],
              "int8": ["--int8", "--int8-all", "--calib", calib, "--calib-batch", "8", "--batch", "2"],
              # Dynamic, run at a batch planned on first use (not one of the profile's min/opt/max).
              "dynamic": ["--fp16", "--min-shapes", "input:1x3x64x64", "--opt-shapes", "input:2x3x64x64",
                          "--max-shapes", "input:4x3x64x64"]}
    runs = []
    for label, args in builds.items():
        engine = folder / f"{label}.engine"
        r = subprocess.run([kiln_bin, "build", path, *map(str, args), "-o", engine], capture_output=True, text=True,
                           timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(([engine] + (["--batch", "3"] if label == "dynamic" else []), label))
    return path, calib, runs


def sanitize(tool, kiln_bin, args):
    sanitizer = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    assert os.path.exists(sanitizer), "compute-sanitizer is not installed on this GPU machine"
    r = subprocess.run([sanitizer, "--tool", tool, "--error-exitcode", "3", kiln_bin, "run", *map(str, args), "--random"],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = "RACECHECK SUMMARY: 0 hazards displayed (0 errors" if tool == "racecheck" else "ERROR SUMMARY: 0 errors"
    assert summary in r.stdout + r.stderr, r.stdout[-2000:]


# synccheck leaves out the fp16 engine: cuDNN's fp16 Hopper convolutions overflow its tracking of
# cuda::barrier objects and then fail under it (CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER, H200,
# 2026-11-26); the engines it checks run kiln's own kernels (INT8) and cuDNN's fp32 ones.
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_compute_sanitizer_finds_nothing_in_engine_runs(tool, kiln_bin, sanitized_engines):
    for args, label in sanitized_engines[2]:
        if tool == "synccheck" and label in ("fp16", "dynamic"):
            continue
        sanitize(tool, kiln_bin, args)


def test_compute_sanitizer_memcheck_finds_nothing_in_builds(kiln_bin, sanitized_engines):
    """The builder too: tactic timing, reformats, the INT8 calibration histograms."""
    path, calib, _ = sanitized_engines
    for args in ([path, "--device", "cuda", "--fp16", "--batch", "2"],
                 [path, "--device", "cuda", "--int8", "--int8-all", "--calib", calib, "--calib-batch", "8", "--batch", "2"]):
        sanitize("memcheck", kiln_bin, args)
