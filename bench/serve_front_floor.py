#!/usr/bin/env python3
"""What the protocol front costs at one request in flight, apart from any engine: a bare gRPC
server in Python (grpc.aio, a generic echo method, no model) against `kiln serve` on a model that
takes microseconds (tests/cli/data/dynamic_classifier.onnx: a Gemm 4 -> 3 and a Relu) on the CPU
engine, with KServe's gRPC front and with kiln's native one (--grpc-front native, where the
build has it), all answered over loopback by Python clients, in alternating rounds.

    KILN_BIN=build/kiln PYTHONPATH=build/python .venv-serve/bin/python bench/serve_front_floor.py \
        --out FILE [--requests 3000] [--rounds 3] [--native-echo grpc_echo]

--native-echo also times a gRPC echo server written in C++ (bench/probes/grpc_echo.cc, its build
line at its top), the floor of a front outside Python.

Runs in the serving environment (.venv-serve: grpcio, tritonclient, KServe) with the build's kiln
package on PYTHONPATH. The echo answers the 16 bytes it gets (the model's one-row input); the
model answers its [1, 3] output. Latency is send to answer, per request, after 200 unmeasured
ones; the JSON has each round's p50, p90 and p99 and the machine's CPU. The difference between
KServe's row and the echo's is KServe's servicer, kiln's predict and the batcher; the echo is the
floor any Python gRPC front has on the machine, the C++ echo that of a front outside Python.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def echo_server(port: int) -> None:
    import grpc

    async def serve():
        async def echo(request, context):
            return request
        handler = grpc.method_handlers_generic_handler("floor.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()
    asyncio.run(serve())


def native_echo_server(binary: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([binary, str(port)], stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "listening":
        sys.exit(f"serve_front_floor.py: {binary} did not start (exit {proc.poll()})")
    return proc


def time_calls(call, requests: int) -> dict:
    """p50, p90 and p99 of `requests` calls of `call`, each timed alone, after 200 unmeasured."""
    for _ in range(200):
        call()
    seconds = []
    for _ in range(requests):
        t = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - t)
    ms = np.array(seconds) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)),
            "p99_ms": float(np.percentile(ms, 99)), "requests": len(ms)}


def time_echo(port: int, payload: bytes, requests: int) -> dict:
    import grpc
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    echo = channel.unary_unary("/floor.Echo/Echo")
    result = time_calls(lambda: echo(payload), requests)
    channel.close()
    return result


def time_model(port: int, x: np.ndarray, requests: int) -> dict:
    import tritonclient.grpc as triton
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    inp = triton.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = time_calls(lambda: client.infer("classifier", [inp]), requests)
    client.close()
    return result


def wait_ready(port: int, proc: subprocess.Popen, seconds: float = 120) -> None:
    import tritonclient.grpc as triton
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"serve_front_floor.py: kiln serve exited with {proc.returncode}")
        try:
            if client.is_server_ready():
                return
        except Exception:  # noqa: BLE001 (not listening yet)
            pass
        time.sleep(0.3)
    sys.exit("serve_front_floor.py: kiln serve not ready in time")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--native-echo", help="bench/probes/grpc_echo.cc built: also time it")
    args = ap.parse_args()
    kiln = os.environ.get("KILN_BIN", os.path.join(ROOT, "build", "kiln"))
    model = os.path.join(ROOT, "tests", "cli", "data", "dynamic_classifier.onnx")
    echo_port, grpc_port = free_port(), free_port()
    echo = multiprocessing.Process(target=echo_server, args=(echo_port,), daemon=True)
    echo.start()
    native_port = free_port()
    native = native_echo_server(args.native_echo, native_port) if args.native_echo else None
    env = dict(os.environ, KILN_PYTHON=os.environ.get("KILN_PYTHON", sys.executable))

    def kiln_serve(port: int, front: str) -> subprocess.Popen:
        return subprocess.Popen([kiln, "serve", model, "--device", "cpu", "--name", "classifier", "--max-batch", "8",
                                 "--http-port", str(free_port()), "--grpc-port", str(port), "--grpc-front", front],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)

    from kiln import _kiln
    server = kiln_serve(grpc_port, "kserve")
    servers = [server]
    native_front_port = free_port() if getattr(_kiln, "has_native_grpc", False) else None
    if native_front_port:
        servers.append(kiln_serve(native_front_port, "native"))
    try:
        wait_ready(grpc_port, server)
        if native_front_port:
            wait_ready(native_front_port, servers[1])
        x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
        rounds = []
        for r in range(args.rounds):
            row = {"echo": time_echo(echo_port, x.tobytes(), args.requests),
                   "kiln_serve": time_model(grpc_port, x, args.requests)}
            if native_front_port:
                row["kiln_serve_native_front"] = time_model(native_front_port, x, args.requests)
            if native:
                row["native_echo"] = time_echo(native_port, x.tobytes(), args.requests)
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{name} p50 {t['p50_ms']:.3f} ms" for name, t in row.items()),
                  flush=True)
            rounds.append(row)
    finally:
        for s in servers:
            s.terminate()
            s.wait(timeout=30)
        echo.terminate()
        if native:
            native.terminate()
            native.wait(timeout=30)
    result = {"schema": "kiln.serve-front-floor/1",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["python3", *sys.argv]), "cpu": cpu_name(),
              "cpu_count": os.cpu_count(), "rounds": rounds,
              "servers": {"echo": "Python grpc.aio, a generic echo method",
                          "kiln_serve": "kiln serve --device cpu on tests/cli/data/dynamic_classifier.onnx (tritonclient.grpc)",
                          "kiln_serve_native_front": "the same, with --grpc-front native",
                          "native_echo": "bench/probes/grpc_echo.cc, C++ gRPC callback API"},
              "median_p50_ms": {k: float(np.median([row[k]["p50_ms"] for row in rounds])) for k in rounds[0]}}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
