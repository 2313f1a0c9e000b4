#!/usr/bin/env python3
"""`kiln serve` under load, against the engine alone, in one run on the GPU machine (issue 26's
measurements).

    python3 bench/serve_bench.py --out DIR [--model resnet50] [--precision fp16] [--max-batch 128]
        [--concurrency 1,4,16,64,256] [--seconds 8] [--gpus 2]

On the GPU machine (carrying build-gpu/dist, build-gpu/pyxz and build-gpu/serving-site.tar.xz):
    source scripts/gpu_env.sh && PYTHONPATH=/tmp/kiln-gate-serving-site:$PYTHONPATH python3 bench/serve_bench.py ...

1. The model (torchvision, random weights, 224x224, dynamic batch: scripts/export_model.py), or
   --onnx PATH, built once with a profile of 1 to --max-batch rows (`kiln build`).
2. The engine alone: `kiln bench ENGINE --batches 1,MAX` (CUDA events around each run) on GPU 0.
3. The C++ runtime on 1 and on --gpus GPUs in one process: the engine file loaded on each GPU, a
   context and a thread per GPU enqueueing runs of --max-batch rows back to back on a stream of
   its own (inputs already on the device, as a pipeline feeding the GPU has them).
4. The server: `kiln serve ENGINE --device cuda --max-batch MAX --instances 2 --gpus ...`, driven by
   a load generator (perf_analyzer's method: a fixed number of requests in flight, each sent again
   as soon as it is answered): Triton's gRPC client in --client-processes Python processes, or with
   --load-generator cpp bench/infer_load.cc (C++, one process, built by `ninja -C build
   infer_load`; a device call carries build/bench/infer_load, which finds gRPC's libraries in the
   Python package's kiln/libs through scripts/gpu_env.sh), for
   --seconds after a warm-up. On one GPU: requests of one image at each --concurrency, with the
   image in the request ("grpc") and, at the smallest and largest, in a system shared-memory region
   the client registered ("shm", perf_analyzer's --shared-memory system); requests of
   --large-request-rows images (one size or several) both ways; and one gRPC stream
   (ModelStreamInfer) of one-image frames with 1, 8 and 32 in flight ("grpc stream": a video's
   frames). On --gpus GPUs: the largest concurrency of one image both ways, and the large requests.
   Throughput is answered images per second; latencies are each request's (frame's), from send to
   answer. Each row also has, from the server's metrics, its mean engine run (mean_run_ms: the
   batch copied in, run and copied out; kiln_compute_seconds), a request's mean wait to be batched
   (mean_queue_ms) and its mean time in the model's predict (mean_predict_ms: checks, queue, run,
   the answer built; KServe's request_predict_seconds); the rest of a latency is the protocol
   front (KServe's gRPC server, decoding and encoding), the socket and the client.

Step 4 runs before 2 and 3: those leave this process's CUDA state on every GPU, which no server
should share a GPU with while it is measured.

Triton's perf_analyzer itself is not on PyPI (the `perf-analyzer` package there is an empty
placeholder), so this script and bench/infer_load.cc are the load generators. Writes
DIR/serve_bench.json; commit it under bench/results/serving/.
--device cpu with --onnx runs every step but 2 and 3 on the CPU engine (a check of the script on a
machine without a GPU; its figures mean nothing).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.util
import json
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kiln_bin() -> str:
    return os.environ.get("KILN_BIN", os.path.join(ROOT, "build-gpu", "kiln"))


def run(cmd: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:], flush=True)
        raise RuntimeError(f"{os.path.basename(cmd[0])} {cmd[1]} failed ({r.returncode})")
    return r


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(values), p)) if values else float("nan")


# --- the load generator (one process of it) ----------------------------------------------------

def _client_process(port: int, model: str, name: str, shape: list[int], in_flight: int, warmup_s: float,
                    seconds: float, seed: int, transport: str, results) -> None:
    """Keeps `in_flight` requests in flight for warmup_s + seconds; puts the latencies (s) of the
    requests sent after the warm-up into `results`. transport "grpc": the input travels in each
    request; "shm": in a system shared-memory region of this process, registered once and named by
    every request (perf_analyzer's --shared-memory system); the output comes back in the answer."""
    import tritonclient.grpc.aio as grpc_aio
    import tritonclient.utils.shared_memory as shm
    from tritonclient.grpc import InferInput

    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

    async def main():
        client = grpc_aio.InferenceServerClient(f"localhost:{port}")
        inp = InferInput(name, shape, "FP32")
        region = None
        if transport == "shm":
            region_name = f"serve_bench_{os.getpid()}"
            region = shm.create_shared_memory_region(region_name, "/" + region_name, x.nbytes)
            shm.set_shared_memory_region(region, [x])
            await client.register_system_shared_memory(region_name, "/" + region_name, x.nbytes)
            inp.set_shared_memory(region_name, x.nbytes)
        else:
            inp.set_data_from_numpy(x)
        start = time.monotonic()
        measured_from, end = start + warmup_s, start + warmup_s + seconds
        latencies: list[float] = []
        errors = 0

        async def loop():
            nonlocal errors
            while time.monotonic() < end:
                sent = time.monotonic()
                try:
                    await client.infer(model, [inp])
                except Exception:  # noqa: BLE001 (counted: a load test reports failures, it does not stop)
                    errors += 1
                    continue
                if sent >= measured_from:
                    latencies.append(time.monotonic() - sent)
                    slowest.append((latencies[-1], sent - measured_from))
                    slowest.sort(reverse=True)
                    del slowest[3:]

        slowest: list[tuple[float, float]] = []
        try:
            await asyncio.gather(*(loop() for _ in range(in_flight)))
        finally:
            if region is not None:
                await client.unregister_system_shared_memory(region_name)
                shm.destroy_shared_memory_region(region)
            await client.close()
        return latencies, errors, slowest

    results.put(asyncio.run(main()))


def _summary(latencies: list[float], errors: int, seconds: float, rows: int) -> dict:
    return {"requests": len(latencies), "errors": errors, "seconds": seconds,
            "throughput_per_s": len(latencies) * rows / seconds,
            "latency_ms": {"p50": 1000 * percentile(latencies, 50), "p90": 1000 * percentile(latencies, 90),
                           "p99": 1000 * percentile(latencies, 99), "mean": 1000 * float(np.mean(latencies))
                           if latencies else float("nan")}}


def load_cpp(binary: str, port: int, model: str, name: str, shape: list[int], concurrency: int, warmup_s: float,
             seconds: float, transport: str, streams: int = 1) -> dict:
    """`concurrency` requests in flight from bench/infer_load (C++, one process), the same method as
    the Python clients' below; transport "stream": `streams` streams, each with `concurrency` frames
    unanswered at most."""
    cmd = [binary, "--url", f"127.0.0.1:{port}", "--model", model, "--input", name, "--shape", ",".join(map(str, shape)),
           "--concurrency", str(concurrency), "--seconds", str(seconds), "--warmup", str(warmup_s),
           "--shared-memory", "system" if transport == "shm" else "none", *(["--stream", "--streams", str(streams)] if transport == "stream" else [])]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=warmup_s + seconds + 300)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    if r.stderr.strip():
        print("  " + r.stderr.strip(), flush=True)
    got = json.loads(r.stdout)
    summary = {k: got[k] for k in ("requests", "errors", "seconds", "throughput_per_s", "latency_ms", "slowest")}
    if transport == "stream":
        return {"stream_window": concurrency, "streams": streams, "transport": "grpc stream", "load_generator": "cpp",
                **summary}
    return {"concurrency": concurrency, "client_processes": 1, "load_generator": "cpp", "connections": got["connections"],
            "transport": transport, **summary}


def load(port: int, model: str, name: str, shape: list[int], concurrency: int, processes: int, warmup_s: float,
         seconds: float, transport: str = "grpc") -> dict:
    """`concurrency` requests in flight from up to `processes` client processes (Python)."""
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (1 if i < concurrency % processes else 0) for i in range(processes)]
    ctx = multiprocessing.get_context("spawn")  # a clean process: no kserve next to tritonclient.grpc
    results = ctx.Queue()
    procs = [ctx.Process(target=_client_process,
                         args=(port, model, name, shape, share, warmup_s, seconds, i, transport, results))
             for i, share in enumerate(shares)]
    for p in procs:
        p.start()
    latencies, errors, slowest = [], 0, []
    for _ in procs:
        got, bad, slow = results.get(timeout=warmup_s + seconds + 300)
        latencies += got
        errors += bad
        slowest += slow
    for p in procs:
        p.join(60)
    # The slowest requests, and when they were sent (s into the measurement): a stall of the whole
    # server shows as several sent at about the same time.
    slowest = [{"latency_ms": 1000 * latency, "sent_at_s": at} for latency, at in sorted(slowest, reverse=True)[:5]]
    return {"concurrency": concurrency, "client_processes": processes, "load_generator": "python",
            "transport": transport, **_summary(latencies, errors, seconds, shape[0]), "slowest": slowest}


def _stream_process(port: int, model: str, name: str, shape: list[int], window: int, warmup_s: float,
                    seconds: float, results) -> None:
    """One gRPC stream (ModelStreamInfer) of frames of `shape`, `window` of them unanswered at most:
    a camera's frames sent as fast as the server takes them. Puts each frame's latency (s) after the
    warm-up, and the errors, into `results`."""
    import tritonclient.grpc.aio as grpc_aio
    from tritonclient.grpc import InferInput

    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)

    async def main():
        client = grpc_aio.InferenceServerClient(f"localhost:{port}")
        inp = InferInput(name, shape, "FP32")
        inp.set_data_from_numpy(x)
        free = asyncio.Semaphore(window)
        sent_at: dict[str, float] = {}
        start = time.monotonic()
        measured_from, end = start + warmup_s, start + warmup_s + seconds

        async def frames():
            n = 0
            while time.monotonic() < end:
                await free.acquire()
                sent_at[str(n)] = time.monotonic()
                yield {"model_name": model, "inputs": [inp], "request_id": str(n)}
                n += 1

        latencies, errors = [], 0
        async for result, error in client.stream_infer(frames()):
            now = time.monotonic()
            free.release()
            if error is not None:
                errors += 1
                continue
            sent = sent_at.pop(result.get_response().id)
            if sent >= measured_from:
                latencies.append(now - sent)
        await client.close()
        return latencies, errors

    results.put(asyncio.run(main()))


def stream(port: int, model: str, name: str, shape: list[int], window: int, warmup_s: float, seconds: float) -> dict:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_stream_process, args=(port, model, name, shape, window, warmup_s, seconds, results))
    proc.start()
    latencies, errors = results.get(timeout=warmup_s + seconds + 300)
    proc.join(60)
    return {"stream_window": window, "transport": "grpc stream", **_summary(latencies, errors, seconds, shape[0])}


# --- the server --------------------------------------------------------------------------------

class Served:
    """`kiln serve` of the engine, ready (warmed up) or failed."""

    def __init__(self, model: str, args: list[str], log_path: str):
        self.http_port, self.grpc_port = free_port(), free_port()
        self.log = open(log_path, "a")
        cmd = [kiln_bin(), "serve", model, *args, "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)]
        print("+", " ".join(cmd), flush=True)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, KILN_PYTHON=sys.executable))
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kiln serve exited with {self.proc.returncode}: see {log_path}")
            try:
                with urllib.request.urlopen(f"http://localhost:{self.http_port}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"kiln serve not ready in 600 s: see {log_path}")

    def metrics(self, model: str) -> dict:
        with urllib.request.urlopen(f"http://localhost:{self.http_port}/metrics", timeout=10) as r:
            text = r.read().decode()

        def value(pattern: str) -> float:
            m = re.search(pattern, text, re.M)
            return float(m.group(1)) if m else 0.0

        runs = {}
        for labels, count in re.findall(r"^kiln_runs_total{([^}]*)} (\S+)$", text, re.M):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            if labels.get("model") == model:
                runs[labels["device"]] = float(count)
        # (kiln's metrics read alike with either gRPC front; KServe's request_predict_seconds only
        # counts requests that KServe's Python hands to the model: none over the native gRPC front)
        return {"batch_rows_sum": value(rf'^kiln_batch_size_sum{{model="{model}"}} (\S+)$'),
                "batches": value(rf'^kiln_batch_size_count{{model="{model}"}} (\S+)$'),
                "compute_seconds_sum": value(rf'^kiln_compute_seconds_sum{{model="{model}"}} (\S+)$'),
                "queue_seconds_sum": value(rf'^kiln_queue_seconds_sum{{model="{model}"}} (\S+)$'),
                "queued": value(rf'^kiln_queue_seconds_count{{model="{model}"}} (\S+)$'),
                "predict_seconds_sum": value(rf'^request_predict_seconds_sum{{model_name="{model}"}} (\S+)$'),
                "predicts": value(rf'^request_predict_seconds_count{{model_name="{model}"}} (\S+)$'),
                "runs_by_device": runs}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def serve_sweep(engine: str, model: str, name: str, size: int, device: str, gpus: list[int], max_batch: int,
                delay_us: int, loads: list[tuple], args, out: str) -> list[dict]:
    """One server on `gpus`; `loads`: (concurrency, images per request, transport) in turn, transport
    "grpc", "shm" or "stream" (then concurrency is the stream's window)."""
    flags = ["--device", device, "--name", model, "--max-batch", str(max_batch), "--max-queue-delay-us", str(delay_us),
             "--grpc-front", args.grpc_front]
    if device == "cuda":
        flags += ["--instances", str(args.instances), "--gpus", ",".join(map(str, gpus))]
    if args.pinned_memory_mb is not None:
        flags += ["--pinned-memory-mb", str(args.pinned_memory_mb)]
    if args.batch_sizes and device == "cuda":
        flags += ["--batch-sizes", args.batch_sizes]
    label = f"{len(gpus)}gpu" if device == "cuda" else "cpu"
    server = Served(engine, flags, os.path.join(out, f"serve_{label}.log"))
    rows = []
    try:
        for c, rows_per_request, transport in loads:
            before = server.metrics(model)
            shape = [rows_per_request, 3, size, size]
            if args.load_generator == "cpp":
                r = load_cpp(args.infer_load, server.grpc_port, model, name, shape, c, args.warmup, args.seconds,
                             transport, args.streams)
            elif transport == "stream":
                r = stream(server.grpc_port, model, name, shape, c, args.warmup, args.seconds)
            else:
                r = load(server.grpc_port, model, name, shape, c, args.client_processes, args.warmup, args.seconds,
                         transport)
            r["images_per_request"] = rows_per_request
            after = server.metrics(model)
            batches = after["batches"] - before["batches"]
            r["gpus"] = gpus if device == "cuda" else []
            r["mean_batch_rows"] = (after["batch_rows_sum"] - before["batch_rows_sum"]) / batches if batches else 0.0
            # Where a request's time goes inside the server: an engine run (the batch gathered and
            # copied in, run, copied out: kiln_compute_seconds) and the wait to be batched; the
            # rest of its latency is the protocol, Python and the client.
            queued = after["queued"] - before["queued"]
            r["mean_run_ms"] = 1000 * (after["compute_seconds_sum"] - before["compute_seconds_sum"]) / batches \
                if batches else 0.0
            r["mean_queue_ms"] = 1000 * (after["queue_seconds_sum"] - before["queue_seconds_sum"]) / queued \
                if queued else 0.0
            predicts = after["predicts"] - before["predicts"]
            r["mean_predict_ms"] = 1000 * (after["predict_seconds_sum"] - before["predict_seconds_sum"]) / predicts \
                if predicts else 0.0
            r["runs_by_device"] = {d: v - before["runs_by_device"].get(d, 0.0) for d, v in after["runs_by_device"].items()}
            print(f"  {label} {r['transport']:11s} {c:4d} in flight x {rows_per_request:3d} images: "
                  f"{r['throughput_per_s']:9.1f} img/s  p50 {r['latency_ms']['p50']:8.3f} ms  "
                  f"p99 {r['latency_ms']['p99']:8.3f} ms  mean batch {r['mean_batch_rows']:.1f}  run "
                  f"{r['mean_run_ms']:.2f} ms  queued {r['mean_queue_ms']:.2f} ms  in the model "
                  f"{r['mean_predict_ms']:.2f} ms  errors {r['errors']}",
                  flush=True)
            rows.append(r)
    finally:
        server.stop()
    return rows


# --- the C++ runtime on several GPUs -----------------------------------------------------------

def runtime_throughput(engine_path: str, gpus: list[int], rows: int, size: int, seconds: float) -> dict:
    """Images per second of contexts on `gpus`, each on a thread of its own enqueueing runs of
    `rows` images back to back (waiting every 8 runs), for `seconds` after a warm-up."""
    import torch

    import kiln

    x = np.random.default_rng(1).standard_normal((rows, 3, size, size)).astype(np.float32)
    contexts = []
    for g in gpus:
        engine = kiln.Engine.load(engine_path, gpu=g)
        context = engine.create_context()
        context.run({engine.inputs[0].name: x})  # plans the shape and fills the input buffer
        contexts.append((g, engine, context))
    counts = [0] * len(gpus)
    barrier = threading.Barrier(len(gpus) + 1)
    stop = threading.Event()

    def drive(i: int, g: int, context) -> None:
        with torch.cuda.device(g):
            stream = torch.cuda.Stream(g)
            for _ in range(8):  # warm-up
                context.enqueue(stream.cuda_stream)
            stream.synchronize()
            barrier.wait()
            while not stop.is_set():
                for _ in range(8):
                    context.enqueue(stream.cuda_stream)
                stream.synchronize()
                counts[i] += 8

    threads = [threading.Thread(target=drive, args=(i, g, c)) for i, (g, _, c) in enumerate(contexts)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.monotonic()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    per_gpu = [c * rows / elapsed for c in counts]
    return {"gpus": gpus, "rows": rows, "throughput_per_s": sum(per_gpu), "per_gpu": per_gpu}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--onnx", help="an ONNX model of input [N, 3, S, S] instead of exporting --model")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--precision", default="fp16")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--max-batch", type=int, default=128)
    p.add_argument("--max-queue-delay-us", type=int, default=0)
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--pinned-memory-mb", type=float, help="kiln serve --pinned-memory-mb (default: kiln serve's)")
    p.add_argument("--batch-sizes", help="kiln serve --batch-sizes, e.g. 1,2,4,8,16,32,64,128 (default: kiln serve's)")
    p.add_argument("--grpc-front", default="native", choices=("kserve", "native"),
                   help="kiln serve's gRPC front (native: kiln's own, in C++)")
    p.add_argument("--concurrency", default="1,4,16,64,256")
    p.add_argument("--large-request-rows", default="16",
                   help="images per large request, or several (16,64): each size at two concurrencies")
    p.add_argument("--large-request-in-flight", default="",
                   help="large requests kept in flight, e.g. 4,8,16 (default: the top concurrency over 4x the "
                        "rows and over the rows)")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--load-generator", default="python", choices=("python", "cpp"),
                   help="who sends the requests and the stream's frames: tritonclient in --client-processes "
                        "Python processes (one for the stream), or bench/infer_load.cc (C++, as perf_analyzer is)")
    p.add_argument("--infer-load", default=os.path.join(ROOT, "build", "bench", "infer_load"),
                   help="the infer_load binary, for --load-generator cpp (ninja -C build infer_load)")
    p.add_argument("--client-processes", type=int, default=8, help="Python load generator's processes")
    p.add_argument("--streams", type=int, default=1,
                   help="streams of the stream rows, each on a connection of its own (--load-generator cpp)")
    p.add_argument("--gpus", type=int, default=2, help="GPUs of the multi-GPU rows (the machine's, 0 to N-1)")
    args = p.parse_args()
    if args.streams != 1 and args.load_generator != "cpp":
        sys.exit("serve_bench.py: --streams is for --load-generator cpp (the Python client sends one stream)")
    if args.load_generator == "cpp" and not os.access(args.infer_load, os.X_OK):
        sys.exit(f"serve_bench.py: --load-generator cpp needs {args.infer_load} (ninja -C build infer_load)")
    # The server (KServe) and the load generator (tritonclient) must import here before any time
    # goes into exports, builds and the engine's own runs: `kiln serve` starts with this Python.
    missing = [module for module in ("kserve", "tritonclient") if importlib.util.find_spec(module) is None]
    if missing:
        sys.exit(f"serve_bench.py: {sys.executable} cannot import {', '.join(missing)}; on the GPU machine: "
                 "source scripts/gpu_env.sh && PYTHONPATH=/tmp/kiln-gate-serving-site:$PYTHONPATH "
                 "python3 bench/serve_bench.py ...")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    onnx = args.onnx
    if not onnx:
        onnx = os.path.join(out, f"{args.model}.onnx")
        if not os.path.exists(onnx):
            run([sys.executable, os.path.join(ROOT, "scripts", "export_model.py"), args.model, "--size", str(args.size),
                 "-o", onnx])
    import kiln

    name = kiln.model_inputs(onnx)[0].name
    shape = f"{name}:{{}}x3x{args.size}x{args.size}"
    result = {"schema": "kiln.serve-bench/1",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "kiln_version": run([kiln_bin(), "--version"]).stdout.strip(), "model": args.model, "size": args.size,
              "precision": args.precision, "device": args.device, "max_batch": args.max_batch,
              "max_queue_delay_us": args.max_queue_delay_us, "instances": args.instances,
              "pinned_memory_mb": args.pinned_memory_mb,
              "batch_sizes": args.batch_sizes or "kiln serve's default",
              "load_generator": ("bench/infer_load.cc (C++, gRPC's callback API, one process)" if args.load_generator
                                 == "cpp" else "bench/serve_bench.py: tritonclient.grpc.aio") +
                                ": a fixed number of requests in flight (perf_analyzer's concurrency mode), inputs in "
                                "the request (grpc) or in system shared memory (shm); and one gRPC stream with a "
                                "window of frames in flight (grpc stream)",
              "cpu_cores": os.cpu_count(), "command": " ".join(["python3", *sys.argv])}
    build_info = os.path.join(ROOT, "build-gpu", "dist", "BUILD_INFO.json")
    if os.path.exists(build_info):
        with open(build_info) as f:
            result["binary_commit"] = json.load(f)["commit"]
    if args.device == "cuda":
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip().splitlines()
        result["gpu"], result["gpus_on_machine"] = gpu[0], len(gpu)
        engine = os.path.join(out, f"{args.model}.{args.precision}.b{args.max_batch}.engine")
        if not os.path.exists(engine):
            run([kiln_bin(), "build", onnx, f"--{args.precision}", "--min-shapes", shape.format(1), "--opt-shapes",
                 shape.format(args.max_batch), "--max-shapes", shape.format(args.max_batch), "-o", engine], timeout=1800)
    else:
        engine = onnx
    top = max(concurrencies)
    def large_in_flight(rows: int) -> list[int]:
        if args.large_request_in_flight:
            return sorted({int(c) for c in args.large_request_in_flight.split(",")})
        return sorted({max(1, top // (4 * rows)), max(1, top // rows)})

    large = [(c, rows, t) for rows in (int(r) for r in str(args.large_request_rows).split(",")) if rows > 1
             for c in large_in_flight(rows) for t in ("grpc", "shm")]
    one_gpu = ([(c, 1, "grpc") for c in concurrencies] + [(c, 1, "shm") for c in (1, top)] + large
               + [(w, 1, "stream") for w in (1, 8, 32)])
    result["server"] = serve_sweep(engine, args.model, name, args.size, args.device, [0], args.max_batch,
                                   args.max_queue_delay_us, one_gpu, args, out)
    if args.device == "cuda" and args.gpus > 1:
        result["server"] += serve_sweep(engine, args.model, name, args.size, args.device, list(range(args.gpus)),
                                        args.max_batch, args.max_queue_delay_us,
                                        [(top, 1, "grpc"), (top, 1, "shm")] + large[-2:], args, out)
    if args.device == "cuda":
        # The engine alone and the C++ runtime after the servers: this process keeps torch's and
        # kiln's CUDA state on every GPU from then on, and no server shares a GPU with it.
        bench_json = os.path.join(out, "engine_alone.json")
        print(run([kiln_bin(), "bench", engine, "--batches", f"1,{args.max_batch}", "--json", bench_json]).stdout, flush=True)
        with open(bench_json) as f:
            result["engine_alone"] = [{k: r[k] for k in ("batch", "latency_ms", "throughput_per_s", "gpu")}
                                      for r in json.load(f)["results"]]
        result["runtime"] = [runtime_throughput(engine, list(range(n)), args.max_batch, args.size, args.seconds)
                             for n in sorted({1, args.gpus})]
        for r in result["runtime"]:
            print(f"  C++ runtime on {len(r['gpus'])} GPU(s): {r['throughput_per_s']:.0f} img/s", flush=True)
    with open(os.path.join(out, "serve_bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {os.path.join(out, 'serve_bench.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
