"""`kiln serve`: models behind the Open Inference Protocol (KServe v2: HTTP/REST and gRPC), through
KServe's model server and kiln's own gRPC front in C++, so any KServe v2 or Triton client works
unchanged.

    kiln serve model.onnx                                  # one model, named after the file
    kiln serve model.engine --name resnet50 --max-batch 32 --max-queue-delay-us 2000
    kiln serve models/                                     # a repository: models/<name>/<version>/model.onnx|model.engine
    kiln serve model.onnx --device cuda --fp16 --max-batch 64 --instances 2
    kiln serve model.onnx --device cuda --fp16 --gpus 0,1       # the engine on each GPU, work spread over them
    kiln serve model.onnx --ray --ray-address auto --replicas 1:8  # Ray Serve replicas over a cluster
    kiln serve model.engine --device cuda --grpc-front kserve    # gRPC answered by KServe's Python server

A repository follows Triton's layout; each model's newest version (the largest number) is
served, and an optional models/<name>/config.json gives its device, precision, max_batch,
max_queue_delay_us, max_queue, instances, gpus and batch_sizes. A GPU engine built from an ONNX model is cached beside it
(model.<precision>.b<max batch>.engine) and loaded from there next time.

Dynamic batching: requests whose inputs share every dimension but the first are queued and
run together, up to --max-batch rows: a batch leaves as soon as a run is free, with every request
queued while the runs were busy, after waiting at most --max-queue-delay-us (default 0, as
Triton's) for more; each request gets its own rows of the outputs back. A model whose inputs or outputs have a fixed
first dimension runs each request alone. --max-queue N refuses a request that finds N of its
model's requests waiting (HTTP 503, gRPC UNAVAILABLE). --instances engines' worth of runs go at once (GPU: one
execution context each, on every GPU of --gpus; the CPU engine runs one at a time). On the GPU a
batch is padded with zero rows to the next of the batch sizes planned at start (--batch-sizes;
by default powers of two below --max-batch, then steps of a quarter of the top octave, so that
a loaded server's batches pad little: 64, 80, 96, 112, 128 for --max-batch 128), so that no
request waits for a new shape to be planned and the contexts hold a few plans, not one per row
count; with several GPUs, each batch goes to the GPU with the fewest runs in flight.

The server is ready once every model is loaded and has run once (a warm-up). Bad requests
(an unknown model, wrong input names, types or shapes, a body past --max-request-mb) are
protocol errors (HTTP 400, gRPC INVALID_ARGUMENT) and the server keeps serving; SIGTERM lets
queued requests finish. Metrics: KServe's request latencies and kiln_batch_size,
kiln_queue_seconds, kiln_compute_seconds, kiln_requests_total, kiln_errors_total at /metrics.

gRPC is answered by kiln's own server in C++ (--grpc-front native, the default where kiln was built
with gRPC's C++ library and --ray is not given; kiln._kiln.GrpcFront, src/serve/grpc_front.h):
requests reach the engine without Python, and its batcher (the same policy) runs the HTTP requests
too; its counters are the same kiln_* metrics. --grpc-front kserve has KServe's Python server
answer gRPC instead.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from kiln._usage import UsageParser
from kiln import shared_memory
from kiln.shared_memory import SharedMemoryError, uses_shared_memory

# The v2 protocol's datatypes and numpy's.
_V2_TO_NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "INT8": np.int8, "UINT16": np.uint16, "INT16": np.int16,
                "UINT32": np.uint32, "INT32": np.int32, "UINT64": np.uint64, "INT64": np.int64, "FP16": np.float16,
                "FP32": np.float32, "FP64": np.float64}
_KILN_TO_V2 = {"bool": "BOOL", "uint8": "UINT8", "int8": "INT8", "uint16": "UINT16", "int16": "INT16", "uint32": "UINT32",
               "int32": "INT32", "uint64": "UINT64", "int64": "INT64", "float16": "FP16", "float32": "FP32",
               "float64": "FP64"}

log = logging.getLogger("kiln.serve")


@dataclass
class ModelConfig:
    """How one model is served (the command line's flags, or a repository model's config.json)."""
    device: str = "cpu"
    precision: str = "fp32"
    max_batch: int = 8
    max_queue_delay_us: int = 0
    max_queue: int = 0  # requests waiting for a run at most (0: no bound); more are refused (HTTP 503)
    instances: int = 1
    gpus: list = field(default_factory=lambda: [0])  # device cuda: the GPUs the model runs on
    batch_sizes: list | None = None  # device cuda: the batch sizes planned (None: planned_batch_sizes)
    engine_flags: list = field(default_factory=list)


class _Series:
    """One model's series of kiln's metrics, looked up once (a labels() call per request costs)."""

    def __init__(self, model: str, devices: list[str]):
        m = _metrics()
        self.model = model
        self.batch, self.queue = m["batch"].labels(model), m["queue"].labels(model)
        self.compute, self.requests = m["compute"].labels(model), m["requests"].labels(model)
        self.errors = m["errors"].labels(model)
        self.runs = {device: m["runs"].labels(model, device) for device in devices}

    # An HTTP (or KServe gRPC) request's fate, as predict() meets it.
    def arrived(self):
        self.requests.inc()

    def refused(self):
        """Refused before it was queued."""
        self.errors.inc()

    def batcher_failed(self):
        """The batcher did not take it (--max-queue), or its run failed."""
        self.errors.inc()

    def answer_failed(self):
        """Ran, but its answer could not be written (an output's shared-memory region)."""
        self.errors.inc()


class _FrontCounts:
    """_Series' part that predict() uses, where the native gRPC front counts requests: its run()
    counts each request it takes and each failed run, so only what it did not see is added."""

    def __init__(self, front, model: str):
        self._front, self._model = front, model

    def arrived(self):
        pass  # counted by the front's run(), or by refused()

    def refused(self):
        self._front.count(self._model, 1, 1)

    def batcher_failed(self):
        pass  # counted by the front's run()

    def answer_failed(self):
        self._front.count(self._model, 0, 1)


# kiln's metrics: their names and help, for the Python batcher's series (_metrics) and for the
# native gRPC front's counters (NativeFrontMetrics), which read alike.
_METRIC_NAMES = {"batch": "kiln_batch_size", "queue": "kiln_queue_seconds", "compute": "kiln_compute_seconds"}
_METRIC_HELP = {"batch": "Rows per engine run", "queue": "Time a request waited to be batched",
                "compute": "Time of one engine run", "requests": "Inference requests",
                "errors": "Requests refused or failed", "runs": "Engine runs, by device (cpu, or the GPU's number)"}
_BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _metrics():
    """kiln's Prometheus metrics, made once per process (KServe serves the default registry)."""
    from prometheus_client import Counter, Histogram

    global _METRICS
    if "_METRICS" not in globals():
        labels = ["model"]
        _METRICS = {
            "batch": Histogram(_METRIC_NAMES["batch"], _METRIC_HELP["batch"], labels, buckets=_BATCH_SIZE_BUCKETS),
            "queue": Histogram(_METRIC_NAMES["queue"], _METRIC_HELP["queue"], labels),
            "compute": Histogram(_METRIC_NAMES["compute"], _METRIC_HELP["compute"], labels),
            "requests": Counter("kiln_requests_total", _METRIC_HELP["requests"], labels),
            "errors": Counter("kiln_errors_total", _METRIC_HELP["errors"], labels),
            "runs": Counter("kiln_runs_total", _METRIC_HELP["runs"], labels + ["device"]),
        }
    return _METRICS


class _QueueFull(Exception):
    """A request the batcher did not take: --max-queue requests wait already."""


@dataclass
class _Pending:
    inputs: dict
    rows: int
    future: asyncio.Future
    queued: float


def padded_rows(rows: int, batch_sizes: list[int]) -> int:
    """The smallest of `batch_sizes` that holds `rows` (rows itself when none is given)."""
    return next((b for b in sorted(batch_sizes) if b >= rows), rows)


# The input shapes a GPU context keeps a plan and a CUDA graph of (CudaContext::kMaxGraphs): one
# more evicts the oldest, after waiting for the device.
_SHAPES_A_CONTEXT_KEEPS = 16


def planned_batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes a GPU model is planned at and its batches padded to: powers of two below
    max_batch; between the largest of them (P) and max_batch, steps of a quarter of the distance,
    rounded up to a multiple of 8; and max_batch (serve::planned_batch_sizes, the same rule). A
    batch in the top octave, where a loaded server's batches are, pads by at most a quarter of P.
    The largest sixteen, so that a context never evicts one."""
    max_batch = max(max_batch, 1)
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    if sizes:
        top = sizes[-1]
        step = ((max_batch - top + 3) // 4 + 7) // 8 * 8
        sizes += range(top + step, max_batch, step)
    return (sizes + [max_batch])[-_SHAPES_A_CONTEXT_KEEPS:]


def distinct_integers(value, low: int, high: int | None = None) -> list[int] | None:
    """Integers as a flag gives them ("0,1") or a config.json list does ([0, 1]); None unless they
    are distinct integers from low to high (no upper bound when high is None), at least one."""
    if isinstance(value, str):
        try:
            value = [int(v) for v in value.split(",")]
        except ValueError:
            return None
    if (not isinstance(value, list) or not value or len(set(value)) != len(value)
            or any(not isinstance(v, int) or isinstance(v, bool) or v < low or (high is not None and v > high)
                   for v in value)):
        return None
    return value


def batch_size_list(value, max_batch: int) -> list[int] | None:
    """Batch sizes as `--batch-sizes 1,8,64` or config.json's "batch_sizes": [1, 8, 64] give them,
    sorted, with max_batch added; None when they are not distinct integers from 1 to max_batch, or
    more than a GPU context keeps."""
    value = distinct_integers(value, 1, max_batch)
    if value is None:
        return None
    sizes = sorted(set(value) | {max_batch})
    return sizes if len(sizes) <= _SHAPES_A_CONTEXT_KEEPS else None


class _Run:
    """One engine run a batch can go to. A GPU context takes a batch's requests as pieces
    (Context.run_concatenated copies each once, into its pinned transfer buffer, or straight to the
    device from a pinned shared-memory region); another run gets them gathered in arrays of its
    own, reused from batch to batch (no fresh memory, so no page faults, for every batch)."""

    def __init__(self, device: str, run, run_pieces=None):
        self.device = device
        self.run = run
        self.run_pieces = run_pieces
        self.staging: dict[str, np.ndarray] = {}

    def __call__(self, batch: list[_Pending], rows: int, padded: int) -> dict:
        if self.run_pieces is not None and (len(batch) > 1 or padded > rows):
            return self.run_pieces({name: [p.inputs[name] for p in batch] for name in batch[0].inputs}, padded - rows)
        return self.run(self.gather(batch, rows, padded))

    def gather(self, batch: list[_Pending], rows: int, padded: int) -> dict:
        """The batch's inputs, one array each, with zero rows from `rows` up to `padded`. A batch of
        one request that needs no padding is its own arrays."""
        if len(batch) == 1 and padded == rows:
            return batch[0].inputs
        inputs = {}
        for name, first in batch[0].inputs.items():
            buffer = self.staging.get(name)
            if buffer is None or buffer.shape[0] < padded or buffer.shape[1:] != first.shape[1:] \
                    or buffer.dtype != first.dtype:
                buffer = self.staging[name] = np.empty((padded, *first.shape[1:]), dtype=first.dtype)
            out = buffer[:padded]
            np.concatenate([p.inputs[name] for p in batch], axis=0, out=out[:rows])  # (numpy lets go of the GIL)
            if padded > rows:
                out[rows:] = 0
            inputs[name] = out
        return inputs


class Runners:
    """The engine runs one model's batches go to: one per execution context (every GPU's), or the
    CPU engine's one. A batch takes the free run whose device has the fewest runs in flight, so work
    spreads over the GPUs by their queue depth."""

    def __init__(self, runs: list[tuple]):
        """runs: (device label, run(inputs)) or (device label, run(inputs), run_pieces(pieces, zero_rows))."""
        self._free = [_Run(*run) for run in runs]
        self._busy = {run[0]: 0 for run in runs}
        self._lock = threading.Lock()
        self.count = len(runs)

    def __call__(self, batch: list[_Pending], rows: int, padded: int) -> tuple[str, dict]:
        """Gathers the batch on a free run and runs it; (device, outputs)."""
        with self._lock:
            i = min(range(len(self._free)), key=lambda k: self._busy[self._free[k].device])
            run = self._free.pop(i)
            self._busy[run.device] += 1
        try:
            return run.device, run(batch, rows, padded)
        finally:
            with self._lock:
                self._free.append(run)
                self._busy[run.device] -= 1


class Batcher:
    """Queues requests and runs them together (see the module's docstring)."""

    def __init__(self, run: Runners, max_batch: int, max_delay_s: float, series: _Series,
                 batch_sizes: list[int] | None = None, max_queue: int = 0):
        self._run = run
        self._max_queue = max_queue
        self._waiting = 0  # requests submitted and not yet in a dispatched batch (the event loop's alone)
        self._batch_sizes = batch_sizes or []
        workers = run.count
        self._max_batch = max(1, max_batch)
        self._max_delay = max_delay_s
        self._slots = asyncio.Semaphore(max(1, workers))
        self._executor = ThreadPoolExecutor(max(1, workers), thread_name_prefix="kiln-run")
        self._queue: asyncio.Queue = asyncio.Queue()
        self._carry: list[_Pending] = []
        self._series = series
        self._task = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def submit(self, inputs: dict, rows: int) -> dict:
        """The request's rows of its batch's outputs; _QueueFull when --max-queue requests wait."""
        if self._max_queue and self._waiting >= self._max_queue:
            raise _QueueFull(f"model '{self._series.model}': {self._waiting} requests are waiting already "
                             f"(kiln serve --max-queue {self._max_queue}): try again later")
        future = asyncio.get_running_loop().create_future()
        self._waiting += 1
        await self._queue.put(_Pending(inputs, rows, future, time.monotonic()))
        return await future

    @staticmethod
    def _key(p: _Pending):
        return tuple((name, a.dtype.str, a.shape[1:]) for name, a in sorted(p.inputs.items()))

    def _take_queued(self) -> _Pending | None:
        if self._carry:
            return self._carry.pop(0)
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None

    async def _next(self) -> _Pending:
        item = self._take_queued()
        return item if item is not None else await self._queue.get()

    async def _loop(self) -> None:
        # A batch starts with the oldest request once a run is free (requests queue while every run
        # is busy), takes every queued request that fits, and waits for more only until the oldest
        # has waited --max-queue-delay-us.
        while True:
            first = await self._next()
            await self._slots.acquire()
            batch, rows, key = [first], first.rows, self._key(first)
            deadline = first.queued + self._max_delay
            while rows < self._max_batch:
                item = self._take_queued()
                if item is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        item = await asyncio.wait_for(self._queue.get(), left)
                    except asyncio.TimeoutError:
                        break
                if self._key(item) != key or rows + item.rows > self._max_batch:
                    self._carry.append(item)
                    break
                batch.append(item)
                rows += item.rows
            self._waiting -= len(batch)
            asyncio.get_running_loop().create_task(self._dispatch(batch, rows))

    def _gather_and_run(self, batch: list[_Pending], rows: int, padded: int) -> tuple[str, dict, float]:
        """Runs the batch (gathered on the run it goes to); (device, outputs, seconds of the run)."""
        start = time.monotonic()
        device, outputs = self._run(batch, rows, padded)
        return device, outputs, time.monotonic() - start

    async def _dispatch(self, batch: list[_Pending], rows: int) -> None:
        series = self._series
        try:
            now = time.monotonic()
            for p in batch:
                series.queue.observe(now - p.queued)
            series.batch.observe(rows)
            padded = padded_rows(rows, self._batch_sizes)
            # Off the event loop: the run copies every request's inputs once (gathered, or as pieces).
            device, outputs, seconds = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._gather_and_run, batch, rows, padded)
            series.compute.observe(seconds)
            series.runs[device].inc()
            if seconds > 1.0:  # (a GPU run of the largest batch takes milliseconds)
                log.warning("model %s: an engine run of %d rows (%d requests) on device %s took %.2f s", series.model,
                            padded, len(batch), device, seconds)
            offset = 0
            for p in batch:
                if len(batch) == 1 and padded == rows:
                    part = outputs
                else:
                    part = {name: o[offset:offset + p.rows] for name, o in outputs.items()}
                offset += p.rows
                if not p.future.done():
                    p.future.set_result(part)
        except Exception as e:  # noqa: BLE001 (every request of the batch gets the engine's error)
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(e)
        finally:
            self._slots.release()


def _kiln_model_class():
    """The KServe model class, defined once KServe is imported (kiln serve's Python needs it)."""
    import kserve
    from kserve.errors import InferenceError, InvalidInput, ServerNotReady
    from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse

    import kiln
    from kiln import _kiln

    class Busy(ServerNotReady):
        """A request refused for now (--max-queue requests wait): HTTP 503, gRPC UNAVAILABLE."""

        def __init__(self, message: str):
            super().__init__()
            self.reason = self.error_msg = message  # (KServe's gRPC front answers with .reason)

        def __str__(self):
            return self.reason

    not_taken = (_QueueFull, getattr(_kiln, "Unavailable", _QueueFull))

    class KilnModel(kserve.Model):
        def __init__(self, name: str, path: str, config: ModelConfig, max_request_bytes: int,
                     native_front: bool = False):
            super().__init__(name)
            self.path = path
            # kiln serve --grpc-front native: the front's counters are kiln's metrics (NativeFrontMetrics)
            self.counted_by_front = native_front
            self.config = config
            self.max_request_bytes = max_request_bytes
            self.kiln_engine = None  # (KServe's models use `engine` for a flag of their own)
            self.batcher = None
            self._series = None  # kiln's metrics of the model (_Series; _FrontCounts with the native front)
            self.native_front = None  # kiln serve --grpc-front native: every request goes through its batcher
            self.native_waits = None  # the threads HTTP requests wait on meanwhile
            self.inputs = []
            self.outputs = []

        # --- loading --------------------------------------------------------------------
        def _engine_path(self) -> str | None:
            """A GPU engine built from an ONNX model is cached beside it."""
            if self.path.endswith(".engine") or self.config.device != "cuda":
                return None
            stem = os.path.splitext(self.path)[0]
            return f"{stem}.{self.config.precision}.b{self.config.max_batch}.engine"

        def _build(self, gpu: int):
            """The model's engine on GPU `gpu` (CPU models: gpu is ignored), built or loaded from the cache."""
            if self.path.endswith(".engine"):
                return kiln.Engine.load(self.path, gpu=gpu)
            cached = self._engine_path()
            if cached and os.path.exists(cached) and os.path.getmtime(cached) >= os.path.getmtime(self.path):
                return kiln.Engine.load(cached, gpu=gpu)
            options = kiln.BuildOptions()
            options.device = self.config.device
            options.precision = self.config.precision
            options.gpu = gpu
            if self.config.device == "cuda":
                # One profile from a single row to --max-batch rows for inputs of a dynamic first dim.
                profile = {}
                for d in kiln.model_inputs(self.path):
                    if d.shape and d.shape[0] < 0 and all(s > 0 for s in d.shape[1:]):
                        rest = list(d.shape[1:])
                        profile[d.name] = kiln.ShapeRange([1] + rest, [self.config.max_batch] + rest,
                                                          [self.config.max_batch] + rest)
                if profile:
                    options.profiles = [profile]
            engine = kiln.Engine.from_onnx(self.path, options)
            if cached:
                # A model folder mounted read-only (KServe's /mnt/models) keeps no cache: the engine
                # is built again at the next start, and the model serves all the same.
                try:
                    engine.save(cached)
                except (OSError, kiln.Error) as e:
                    log.warning("model %s: engine not cached (%s); it is built again at the next start", self.name, e)
            return engine

        def _engines(self) -> list:
            """(device label, engine) for every device the model runs on: the engine is built once (on
            the first GPU) and loaded on each other GPU from its engine file."""
            if self.config.device != "cuda":
                engine = self._build(0)
                if engine.backend == "cpu":
                    return [("cpu", engine)]
                engines = [(str(self.config.gpus[0]), engine)]  # an engine file for the GPU, served as one
            else:
                engines = [(str(self.config.gpus[0]), self._build(self.config.gpus[0]))]
            # The other GPUs load the engine file there is (the model's, or the cache), else its bytes.
            source = self.path if self.path.endswith(".engine") else self._engine_path()
            data = None
            if len(self.config.gpus) > 1 and not (source and os.path.exists(source)):
                data = engines[0][1].serialize()
            for gpu in self.config.gpus[1:]:
                engine = kiln.Engine.deserialize(data, gpu=gpu) if data else kiln.Engine.load(source, gpu=gpu)
                engines.append((str(gpu), engine))
            return engines

        def load(self) -> bool:
            if self.ready:  # a Ray replica loads in its constructor; KServe's front asks again
                return True
            engines = self._engines()
            self.kiln_engine = engines[0][1]
            self.inputs = [(d.name, d.dtype, list(d.shape)) for d in self.kiln_engine.inputs]
            self.outputs = [(d.name, d.dtype, list(d.shape)) for d in self.kiln_engine.outputs]
            batchable = all(s and s[0] < 0 for _, _, s in self.inputs) and all(s and s[0] < 0 for _, _, s in self.outputs)
            max_batch = self.config.max_batch if batchable else 1
            on_gpu = self.kiln_engine.backend == "cuda"
            if on_gpu:
                contexts = [(device, engine.create_context()) for device, engine in engines
                            for _ in range(self.config.instances)]
                runs = [(device, c.run, c.run_concatenated) for device, c in contexts]
                self._native_runs = contexts
            else:
                runs = [(device, engine.run) for device, engine in engines]
                self._native_runs = list(engines)
            self._run = Runners(runs)
            self._max_batch = max_batch
            # GPU: the batch sizes every context plans now (the first run at a shape plans it).
            self._batch_sizes = ((self.config.batch_sizes or planned_batch_sizes(max_batch)) if on_gpu and batchable
                                 else [])
            if not self.counted_by_front:
                self._series = _Series(self.name, [device for device, _ in engines])  # each at zero from the start
            # The warm-up: every run at every planned batch size (or at one row / the declared shape).
            for run in runs:
                for rows in self._batch_sizes or [1]:
                    run[1](self._example_inputs(rows))
            self.ready = True
            log.info("model %s ready: %s, %s, max batch %d, on %s, inputs %s", self.name, self.path, self.config.precision,
                     max_batch, "GPUs " + ",".join(d for d, _ in engines) if on_gpu else "the CPU", self.inputs)
            return self.ready

        def native_description(self) -> dict:
            """The model as kiln._kiln.GrpcFront takes it: its engine runs (GPU contexts, or the CPU
            engine) go to the front's batcher, which then runs every request of both fronts."""
            return {"name": self.name, "version": "", "engine": self.kiln_engine, "runs": self._native_runs,
                    "max_batch": self._max_batch, "max_queue_delay_us": self.config.max_queue_delay_us,
                    "max_queue": self.config.max_queue,
                    "batch_sizes": self._batch_sizes}

        def _example_inputs(self, rows: int = 1) -> dict:
            out = {}
            for name, dtype, shape in self.inputs:
                concrete = [(rows if i == 0 else 1) if s < 0 else s for i, s in enumerate(shape)]
                out[name] = np.zeros(concrete, dtype=np.dtype(dtype))
            return out

        def get_input_types(self):
            return [{"name": n, "datatype": _KILN_TO_V2.get(t, t.upper()), "shape": s} for n, t, s in self.inputs]

        def get_output_types(self):
            return [{"name": n, "datatype": _KILN_TO_V2.get(t, t.upper()), "shape": s} for n, t, s in self.outputs]

        # --- requests -------------------------------------------------------------------
        def _check(self, payload: InferRequest) -> tuple[dict, int]:
            """The request's inputs as numpy arrays, and its rows; InvalidInput says what is wrong."""
            given = {i.name: i for i in payload.inputs}
            want = [n for n, _, _ in self.inputs]
            if sorted(given) != sorted(want):
                raise InvalidInput(f"model '{self.name}' takes inputs {want}; the request gives {sorted(given)}")
            arrays, total = {}, 0
            for name, dtype, shape in self.inputs:
                inp = given[name]
                if inp.datatype != _KILN_TO_V2.get(dtype):
                    raise InvalidInput(f"input '{name}' must be {_KILN_TO_V2.get(dtype)}, not {inp.datatype}")
                if len(inp.shape) != len(shape) or any(s >= 0 and g != s for g, s in zip(inp.shape, shape)):
                    raise InvalidInput(f"input '{name}' must have shape {shape} (-1: any size), not {list(inp.shape)}")
                if uses_shared_memory(inp.parameters):
                    try:
                        a = shared_memory.REGIONS.read(inp.parameters, np.dtype(_V2_TO_NUMPY[inp.datatype]),
                                                       list(inp.shape), f"input '{name}'")
                    except SharedMemoryError as e:
                        raise InvalidInput(str(e)) from e
                else:
                    try:
                        a = inp.as_numpy()
                    except Exception as e:  # noqa: BLE001 (a body whose data does not fit its shape)
                        raise InvalidInput(f"input '{name}': {e}") from e
                    a = np.asarray(a, dtype=_V2_TO_NUMPY[inp.datatype]).reshape(inp.shape)
                total += a.nbytes
                arrays[name] = a
            if total > self.max_request_bytes:
                raise InvalidInput(f"the request's inputs are {total} bytes, more than the server takes "
                                   f"({self.max_request_bytes}; kiln serve --max-request-mb)")
            rows = {a.shape[0] for a in arrays.values() if a.ndim} or {1}
            if len(rows) != 1:
                raise InvalidInput(f"the inputs' first dimensions differ: {sorted(rows)}")
            rows = rows.pop()
            if self._max_batch > 1 and rows > self._max_batch:
                raise InvalidInput(f"the request has {rows} rows; model '{self.name}' takes at most {self._max_batch} "
                                   "(kiln serve --max-batch)")
            return arrays, rows

        async def predict(self, payload, headers=None, response_headers=None):
            series = self._series
            series.arrived()
            if not isinstance(payload, InferRequest):
                series.refused()
                raise InvalidInput("kiln serve speaks the Open Inference Protocol (v2): send a v2 infer request")
            try:
                arrays, rows = self._check(payload)
            except InvalidInput:
                series.refused()
                raise
            if self.batcher is None and self.native_front is None:
                self.batcher = Batcher(self._run, self._max_batch, self.config.max_queue_delay_us * 1e-6, self._series,
                                       self._batch_sizes, self.config.max_queue)
                self.batcher.start()
            try:
                if self.native_front is not None:
                    outputs = await asyncio.get_running_loop().run_in_executor(
                        self.native_waits, self.native_front.run, self.name, arrays, rows)
                else:
                    outputs = await self.batcher.submit(arrays, rows)
            except not_taken as e:
                series.batcher_failed()
                raise Busy(str(e)) from e
            except Exception as e:  # noqa: BLE001 (kiln.Error from the engine)
                series.batcher_failed()
                raise InferenceError(f"model '{self.name}': {e}") from e
            requested = ({o.name: plain_parameters(o.parameters) for o in payload.request_outputs}
                         if payload.request_outputs else None)
            infer_outputs = []
            for name, _, _ in self.outputs:
                if requested is not None and name not in requested:
                    continue
                a = np.ascontiguousarray(outputs[name])
                datatype = _KILN_TO_V2[str(a.dtype)]
                parameters = (requested or {}).get(name)
                if uses_shared_memory(parameters):
                    try:
                        shared_memory.REGIONS.write(parameters, a, f"output '{name}'")
                    except SharedMemoryError as e:
                        series.answer_failed()
                        raise InvalidInput(str(e)) from e
                    where = {"shared_memory_region": parameters["shared_memory_region"],
                             "shared_memory_byte_size": a.nbytes}
                    out = InferOutput(name=name, shape=list(a.shape), datatype=datatype, data=[], parameters=where)
                    if payload.from_grpc:
                        # An empty entry of raw_output_contents keeps each later output at its index there.
                        out._raw_data = b""
                else:
                    out = InferOutput(name=name, shape=list(a.shape), datatype=datatype)
                    out.set_data_from_numpy(a, binary_data=payload.use_binary_outputs or payload.from_grpc)
                infer_outputs.append(out)
            return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=infer_outputs,
                                 from_grpc=payload.from_grpc, use_binary_outputs=payload.use_binary_outputs)

    return KilnModel


_CONFIG_FIELDS = {"device": ("cpu", "cuda"), "precision": ("fp32", "fp16", "tf32", "best", "int8", "fp8", "bf16"),
                  "max_batch": 1, "max_queue_delay_us": 0, "max_queue": 0, "instances": 1, "gpus": list,
                  "batch_sizes": "batch sizes"}


def gpu_list(value) -> list[int] | None:
    """GPU numbers as `--gpus 0,1` or config.json's "gpus": [0, 1] give them; None when they are not
    distinct non-negative integers."""
    return distinct_integers(value, 0)


def _read_config(path: str, config: ModelConfig) -> None:
    """A repository model's config.json over the command line's defaults; a field kiln does not know,
    or a value out of its range, ends kiln serve with the file and the field named."""
    def fail(why: str):
        raise SystemExit(f"kiln: error: kiln serve: {path}: {why}")

    try:
        with open(path) as f:
            given = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"not a readable JSON file: {e}")
    if not isinstance(given, dict):
        fail("must hold a JSON object")
    for key, value in given.items():
        if key not in _CONFIG_FIELDS:
            fail(f"unknown field '{key}' (kiln serve reads {sorted(_CONFIG_FIELDS)})")
        allowed = _CONFIG_FIELDS[key]
        if allowed is list:
            if gpu_list(value) is None:
                fail(f"'{key}' must be a list of distinct GPU numbers (0 or more), not {value!r}")
        elif allowed == "batch sizes":
            pass  # checked below, against the model's max_batch
        elif isinstance(allowed, tuple):
            if value not in allowed:
                fail(f"'{key}' must be one of {list(allowed)}, not {value!r}")
        elif not isinstance(value, int) or isinstance(value, bool) or value < allowed:
            fail(f"'{key}' must be an integer of at least {allowed}, not {value!r}")
        setattr(config, key, value)
    if config.batch_sizes is not None:
        sizes = batch_size_list(config.batch_sizes, config.max_batch)
        if sizes is None:
            fail(f"'batch_sizes' must be a list of distinct integers from 1 to max_batch ({config.max_batch}), at most "
                 f"{_SHAPES_A_CONTEXT_KEEPS} with max_batch, not {config.batch_sizes!r}")
        config.batch_sizes = sizes


class _JsonUnlessBinary:
    """ASGI middleware for infer requests over HTTP. The v2 protocol reads an infer request's whole
    body as JSON unless an Inference-Header-Content-Length header says where its JSON ends; Triton's
    HTTP client sends JSON requests without a Content-Type, which KServe would take for binary: this
    names them JSON. And an input in shared memory has no "data", which KServe's JSON model requires:
    such an input is given an empty one (the model reads the region).

    A body longer than `max_body_bytes` is refused (413) before it is read whole: by its
    Content-Length, or, for a JSON body sent in chunks, once that much has arrived."""

    def __init__(self, app, max_body_bytes: int):
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def _refuse(self, send, length: str) -> None:
        body = json.dumps({"error": f"the request body is {length} bytes, more than the server reads "
                                    f"({self.max_body_bytes}; kiln serve --max-request-mb)"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].endswith("/infer"):
            return await self.app(scope, receive, send)
        declared = next((v for k, v in scope["headers"] if k.lower() == b"content-length"), b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            return await self._refuse(send, declared.decode())
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
        if any(k.lower() == b"inference-header-content-length" for k, _ in headers):
            return await self.app(scope, receive, send)
        chunks, message, size = [], {"more_body": True}, 0
        while message.get("more_body"):
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                return await self._refuse(send, f"over {size}")
        body = _shared_memory_inputs_with_data(b"".join(chunks))
        headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(dict(scope, headers=headers), replay, send)


def _shared_memory_inputs_with_data(body: bytes) -> bytes:
    """A JSON infer request's body, with "data": [] for each input that names a shared-memory region."""
    if b"shared_memory_region" not in body:
        return body
    try:
        request = json.loads(body)
        inputs = request["inputs"]
        for inp in inputs:
            if uses_shared_memory(inp.get("parameters")) and "data" not in inp:
                inp["data"] = []
    except (ValueError, KeyError, TypeError, AttributeError):
        return body  # malformed: KServe answers it
    return json.dumps(request).encode()


def _add_shared_memory_routes(app) -> None:
    """The shared-memory extension over HTTP (Triton's paths): register, unregister and status of
    system shared-memory regions; a refused one answers 400 with {"error": why}."""
    from fastapi import Request
    from fastapi.responses import JSONResponse, Response

    def answer(work):
        try:
            result = work()
        except SharedMemoryError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        return Response(status_code=200) if result is None else JSONResponse(result)

    async def register(name, request):
        try:
            body = json.loads(await request.body())
        except ValueError as e:
            return JSONResponse({"error": f"the register request is not JSON: {e}"}, status_code=400)
        if not isinstance(body, dict):
            return JSONResponse({"error": "the register request must be a JSON object"}, status_code=400)
        return answer(lambda: shared_memory.REGIONS.register(name, body.get("key"), body.get("offset", 0),
                                                             body.get("byte_size")))

    async def unregister(name=""):
        return answer(lambda: shared_memory.REGIONS.unregister(name))

    async def status(name=""):
        return answer(lambda: shared_memory.REGIONS.status(name))

    # FastAPI reads the annotations to inject the request (this module's are strings: __future__).
    register.__annotations__ = {"name": str, "request": Request}
    unregister.__annotations__ = status.__annotations__ = {"name": str}

    base = "/v2/systemsharedmemory"
    app.add_api_route(base + "/status", status, methods=["GET"])
    app.add_api_route(base + "/region/{name}/status", status, methods=["GET"])
    app.add_api_route(base + "/region/{name}/register", register, methods=["POST"])
    app.add_api_route(base + "/region/{name}/unregister", unregister, methods=["POST"])
    app.add_api_route(base + "/unregister", unregister, methods=["POST"])


def _triton_grpc_messages() -> dict:
    """Message classes with the wire format of Triton's messages that KServe's proto lacks:
    SystemSharedMemory{Register,Unregister,Status}{Request,Response} and ModelStreamInferResponse,
    made from a descriptor of their fields (tritonclient's own classes cannot be imported next to
    KServe's: they register the same protobuf names). A ModelStreamInferResponse's infer_response
    is a ModelInferResponse; declared as bytes it has the same wire form, holding one serialized."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="kiln/triton_extensions.proto", package="kiln.triton",
                                               syntax="proto3")

    def message(container, name: str, fields: list[tuple[str, int]]):
        m = container.add(name=name)
        for number, (field, kind) in enumerate(fields, 1):
            m.field.add(name=field, number=number, type=kind, label=F.LABEL_OPTIONAL)
        return m

    region = [("name", F.TYPE_STRING), ("key", F.TYPE_STRING), ("offset", F.TYPE_UINT64),
              ("byte_size", F.TYPE_UINT64)]
    message(proto.message_type, "RegisterRequest", region)
    message(proto.message_type, "Empty", [])
    message(proto.message_type, "NameRequest", [("name", F.TYPE_STRING)])
    message(proto.message_type, "StreamResponse", [("error_message", F.TYPE_STRING), ("infer_response", F.TYPE_BYTES)])
    status = proto.message_type.add(name="StatusResponse")
    message(status.nested_type, "RegionStatus", region)
    entry = message(status.nested_type, "RegionsEntry", [("key", F.TYPE_STRING), ("value", F.TYPE_MESSAGE)])
    entry.field[1].type_name = ".kiln.triton.StatusResponse.RegionStatus"
    entry.options.map_entry = True
    status.field.add(name="regions", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                     type_name=".kiln.triton.StatusResponse.RegionsEntry")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"kiln.triton.{name}"))
            for name in ("RegisterRequest", "Empty", "NameRequest", "StatusResponse", "StreamResponse")}


def _grpc_extensions(servicer):
    """The gRPC methods of Triton's GRPCInferenceService that KServe's server lacks, served here:
    the system shared-memory extension, and ModelStreamInfer (a stream of infer requests, each
    answered as a ModelStreamInferResponse, in the order sent, while later ones already run)."""
    import grpc
    from kserve.errors import InvalidInput
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.infer_type import InferRequest
    from kserve.utils.utils import to_headers

    messages = _triton_grpc_messages()
    empty = messages["Empty"]()

    def refused_as_invalid(work):
        try:
            return work()
        except SharedMemoryError as e:
            raise InvalidInput(str(e)) from e

    async def register(request, context):
        refused_as_invalid(lambda: shared_memory.REGIONS.register(request.name, request.key, request.offset,
                                                                  request.byte_size))
        return empty

    async def unregister(request, context):
        shared_memory.REGIONS.unregister(request.name)
        return empty

    async def status(request, context):
        answer = messages["StatusResponse"]()
        for region in refused_as_invalid(lambda: shared_memory.REGIONS.status(request.name)):
            entry = answer.regions[region["name"]]
            entry.name, entry.key = region["name"], region["key"]
            entry.offset, entry.byte_size = region["offset"], region["byte_size"]
        return answer

    async def stream_infer(requests, context):
        headers = to_headers(context)

        async def one(request):
            try:
                servicer.validate_grpc_request(request)
                response, _ = await servicer._data_plane.infer(request=InferRequest.from_grpc(request),
                                                               headers=headers, model_name=request.model_name)
                return messages["StreamResponse"](infer_response=response.to_grpc().SerializeToString())
            except Exception as e:  # noqa: BLE001 (a request's error is its answer; the stream goes on)
                return messages["StreamResponse"](error_message=str(getattr(e, "reason", None) or e))

        in_order: asyncio.Queue = asyncio.Queue()

        async def read():
            try:
                async for request in requests:
                    await in_order.put(asyncio.ensure_future(one(request)))
            finally:
                await in_order.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (answer := await in_order.get()) is not None:
                yield await answer
        finally:
            reader.cancel()

    def unary(method, request_class):
        return grpc.unary_unary_rpc_method_handler(method, request_deserializer=request_class.FromString,
                                                   response_serializer=lambda m: m.SerializeToString())

    service = "/inference.GRPCInferenceService/"
    handlers = {
        service + "SystemSharedMemoryRegister": unary(register, messages["RegisterRequest"]),
        service + "SystemSharedMemoryUnregister": unary(unregister, messages["NameRequest"]),
        service + "SystemSharedMemoryStatus": unary(status, messages["NameRequest"]),
        service + "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
            stream_infer, request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=lambda m: m.SerializeToString()),
    }

    class Extensions(grpc.GenericRpcHandler):
        def service(self, handler_call_details):
            return handlers.get(handler_call_details.method)

    return Extensions()


def _extend_kserve_grpc() -> None:
    """KServe's gRPC server, with kiln's extra methods (_grpc_extensions) added next to its own, and
    without the log line KServe writes for every request (a LogRecord per request costs ~5% of a
    small request's time, even when a filter drops it). Both are hooks into KServe 0.21's
    kserve.protocol.grpc.server (requirements/serve.lock pins it; tests/e2e/test_serve.py covers them)."""
    import kserve.protocol.grpc.server as kserve_grpc
    from grpc.aio import ServerInterceptor

    class QuietInterceptor(ServerInterceptor):
        async def intercept_service(self, continuation, handler_call_details):
            return await continuation(handler_call_details)

    add_kserve_servicer = kserve_grpc.grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server

    def add_servicers(servicer, server):
        add_kserve_servicer(servicer, server)
        server.add_generic_rpc_handlers((_grpc_extensions(servicer),))

    kserve_grpc.LoggingInterceptor = QuietInterceptor
    kserve_grpc.grpc_predict_v2_pb2_grpc = type("KilnServicers", (), {
        "add_GRPCInferenceServiceServicer_to_server": staticmethod(add_servicers)})


def repository_models(folder: str, defaults: ModelConfig) -> list[tuple[str, str, ModelConfig]]:
    """(name, path, config) of every model of a Triton-style repository: <folder>/<name>/<version>/
    model.engine or model.onnx, the newest version of each."""
    found = []
    for name in sorted(os.listdir(folder)):
        base = os.path.join(folder, name)
        if not os.path.isdir(base):
            continue
        versions = sorted((int(v) for v in os.listdir(base) if v.isdigit() and os.path.isdir(os.path.join(base, v))),
                          reverse=True)
        for v in versions:
            path = next((os.path.join(base, str(v), f) for f in ("model.engine", "model.onnx")
                         if os.path.exists(os.path.join(base, str(v), f))), None)
            if path:
                break
        else:
            raise SystemExit(f"kiln: error: kiln serve: model '{name}' in {folder} has no <version>/model.onnx or model.engine")
        # A repository serves what it holds: a model file that is a link out of the folder is refused.
        root = os.path.realpath(folder)
        if os.path.commonpath([root, os.path.realpath(path)]) != root:
            raise SystemExit(f"kiln: error: kiln serve: {path} leads out of the repository {folder}")
        config = ModelConfig(**{**defaults.__dict__})
        config_path = os.path.join(base, "config.json")
        if os.path.exists(config_path):
            _read_config(config_path, config)
        found.append((name, path, config))
    if not found:
        raise SystemExit(f"kiln: error: kiln serve: {folder} holds no model (<name>/<version>/model.onnx)")
    return found


def replica_range(text: str) -> tuple[int, int] | None:
    """--replicas N or MIN:MAX as (MIN, MAX); None unless 1 <= MIN <= MAX."""
    try:
        low, _, high = text.partition(":")
        low, high = int(low), int(high or low)
    except ValueError:
        return None
    return (low, high) if 1 <= low <= high else None


def _ray_models(entries: list, address: str, replicas: tuple[int, int], max_request_bytes: int) -> list | None:
    """Each model as a Ray Serve deployment, and the KServe models that send it requests (KServe's
    RayModel, in this process); None after printing why one cannot be served.

    Each replica is a whole kiln serve model (engine, contexts, batcher) in a Ray actor: one GPU
    each with --device cuda (Ray's CUDA_VISIBLE_DEVICES makes it the replica's GPU 0), one CPU
    otherwise. Ray Serve sends each request to one of two replicas it samples, the one with fewer
    in flight; with MIN:MAX replicas it scales between them to keep about --max-batch requests in
    flight per replica. Ray Serve's own HTTP proxy stays off: the protocol is served here."""
    import ray
    from kserve.ray import RayModel
    from ray import serve

    from kserve.errors import InvalidInput
    from kserve.protocol.infer_type import InferOutput, InferRequest

    class KilnRayModel(RayModel):
        """KServe's RayModel, sending gRPC requests too: their parameters and shapes are protobuf
        containers, which Ray cannot pickle, so they travel as plain dicts and lists. Inputs and
        outputs a client keeps in shared memory are read and written here, where the client
        registered its regions: a replica, another process and perhaps on another machine, knows
        none, so its request carries those inputs' values and its answer those outputs'."""

        def __call__(self, body, headers=None, **kwargs):
            into_regions = {}
            if isinstance(body, InferRequest):
                body.parameters = plain_parameters(body.parameters)
                for part in [*body.inputs, *(body.request_outputs or [])]:
                    part.parameters = plain_parameters(part.parameters)
                for part in body.inputs:
                    part.shape = [int(d) for d in part.shape]
                    if uses_shared_memory(part.parameters):
                        _value_from_region(part)
                for part in body.request_outputs or []:
                    if uses_shared_memory(part.parameters):
                        into_regions[part.name] = part.parameters
                        part.parameters = _without_region(part.parameters)
            answer = super().__call__(body, headers=dict(headers) if headers else headers, **kwargs)
            return _answer_into_regions(answer, into_regions, body.from_grpc) if into_regions else answer

    def _without_region(parameters: dict) -> dict | None:
        return {k: v for k, v in parameters.items() if not k.startswith("shared_memory_")} or None

    def _value_from_region(part) -> None:
        """An input given in a region (the front's registration) as its value, in the request."""
        dtype = _V2_TO_NUMPY.get(part.datatype)
        if dtype is None:
            raise InvalidInput(f"input '{part.name}' has the datatype {part.datatype}, which kiln does not serve")
        try:
            a = shared_memory.REGIONS.read(part.parameters, np.dtype(dtype), list(part.shape), f"input '{part.name}'")
        except SharedMemoryError as e:
            raise InvalidInput(str(e)) from e
        part.parameters = _without_region(part.parameters)
        part.set_data_from_numpy(np.ascontiguousarray(a), binary_data=True)

    async def _answer_into_regions(answer, regions: dict, from_grpc: bool):
        """The replica's answer with the outputs the client asked for in regions written there."""
        response, response_headers = await answer
        for i, out in enumerate(response.outputs):
            if out.name not in regions:
                continue
            a = np.ascontiguousarray(out.as_numpy())
            try:
                shared_memory.REGIONS.write(regions[out.name], a, f"output '{out.name}'")
            except SharedMemoryError as e:
                raise InvalidInput(str(e)) from e
            where = {"shared_memory_region": regions[out.name]["shared_memory_region"],
                     "shared_memory_byte_size": a.nbytes}
            written = InferOutput(name=out.name, shape=list(a.shape), datatype=out.datatype, data=[], parameters=where)
            if from_grpc:
                written._raw_data = b""  # keeps each later output at its index among the raw contents
            response.outputs[i] = written
        return response, response_headers

    ray.init(address=None if address == "local" else address, include_dashboard=False, log_to_driver=False)
    serve.start(proxy_location="Disabled")
    low, high = replicas
    models = []
    for name, path, config in entries:
        replica_config = ModelConfig(**{**config.__dict__, "gpus": [0]})
        in_flight = max(8, 2 * config.max_batch * config.instances)
        scaling = ({"num_replicas": low} if low == high else
                   {"autoscaling_config": {"min_replicas": low, "max_replicas": high,
                                           "target_ongoing_requests": max(1, config.max_batch)}})
        deployment = serve.deployment(
            _ray_replica_class(), name=name, max_ongoing_requests=in_flight,
            ray_actor_options={"num_gpus": 1} if config.device == "cuda" else {"num_cpus": 1}, **scaling)
        try:
            handle = serve.run(deployment.bind(name, path, replica_config, max_request_bytes), name=name,
                               route_prefix=None)
        except Exception as e:  # noqa: BLE001 (a replica that cannot load: Ray's error, its last line)
            why = str(e).strip().splitlines()
            sys.stderr.write(f"kiln: error: kiln serve: model '{name}' ({path}) cannot be served on Ray: "
                             f"{why[-1] if why else type(e).__name__}\n")
            _ray_stop([n for n, _, _ in entries[:len(models)]], address)
            return None
        model = KilnRayModel(name, handle)
        model.load()
        running = serve.status().applications[name].deployments[name].replica_states.get("RUNNING", 0)
        log.info("model %s on Ray Serve: %d replicas running (%d to %d)", name, running, low, high)
        models.append(model)
    return models


def plain_parameters(parameters):
    """A protocol message's parameters as a plain dict (gRPC gives a map of InferParameter
    messages, each holding one of bool_param, int64_param, string_param, ...)."""
    if parameters is None or isinstance(parameters, dict):
        return parameters
    plain = {}
    for key, value in parameters.items():
        which = value.WhichOneof("parameter_choice") if hasattr(value, "WhichOneof") else None
        plain[key] = getattr(value, which) if which else value
    return plain


def _ray_replica_class():
    """A kiln serve model that loads in its constructor: what a Ray Serve replica runs."""
    KilnModel = _kiln_model_class()

    class KilnReplica(KilnModel):
        def __init__(self, name: str, path: str, config: ModelConfig, max_request_bytes: int):
            super().__init__(name, path, config, max_request_bytes)
            self.load()

    return KilnReplica


def port_is_free(port: int) -> bool:
    """Whether a server can listen on `port` on every address (what KServe binds)."""
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = UsageParser(prog="kiln serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="an ONNX model, an engine file, or a repository folder")
    p.add_argument("--name", help="the model's name (one model; default: the file's name)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    precision = p.add_mutually_exclusive_group()
    for flag in ("fp16", "tf32", "best", "int8", "fp8", "bf16"):
        precision.add_argument(f"--{flag}", dest="precision", action="store_const", const=flag)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--max-batch", type=int, default=8, help="rows per engine run at most (dynamic batching)")
    p.add_argument("--max-queue-delay-us", type=int, default=0,
                   help="how long a batch with a free run may wait for more requests (0: it goes at once)")
    p.add_argument("--max-queue", type=int, default=0,
                   help="requests of a model waiting for a run at most (0: no bound); one more is refused at once "
                        "(HTTP 503, gRPC UNAVAILABLE) for the client to try again")
    p.add_argument("--instances", type=int, default=1, help="engine runs at once (GPU: contexts on each GPU)")
    p.add_argument("--gpus", help="with --device cuda: the GPUs to run on, e.g. 0,1 (default 0); each gets the engine "
                                  "and --instances contexts")
    p.add_argument("--batch-sizes",
                   help="with --device cuda: the batch sizes each context plans at start and pads a batch to, e.g. "
                        "1,8,32,128 (--max-batch is always one; at most 16); default: powers of two below --max-batch, "
                        "steps of a quarter of the top octave (64,80,96,112,128 for --max-batch 128), and --max-batch")
    p.add_argument("--max-request-mb", type=float, default=256, help="the largest request's inputs")
    p.add_argument("--pinned-memory-mb", type=float, default=1024,
                   help="native gRPC front, GPU models: page-locked buffers that inputs in a request's message are "
                        "copied into as requests arrive, so that a batch goes to the GPU without being staged on "
                        "its run's thread (as Triton's --pinned-memory-pool-byte-size; 0: none)")
    p.add_argument("--grpc-front", choices=("auto", "native", "kserve"), default="auto",
                   help="who answers gRPC: kiln's own server in C++ (native: requests reach the engine without "
                        "Python; HTTP requests use its batcher too), or KServe's Python one (kserve); auto (default): "
                        "native, unless this kiln was built without gRPC's C++ library or with --ray")
    p.add_argument("--ray", action="store_true",
                   help="run each model as a Ray Serve deployment (replicas on the Ray cluster: one GPU each with "
                        "--device cuda); this process serves the protocol in front of them")
    p.add_argument("--ray-address", default="local",
                   help="with --ray: 'local' starts a Ray instance in this process; 'auto' or an address joins a cluster")
    p.add_argument("--replicas", default="1", help="with --ray: replicas of each model, N, or MIN:MAX to scale "
                                                  "between them on the requests in flight")
    args = p.parse_args(argv)
    if args.max_batch < 1 or args.instances < 1 or args.max_queue_delay_us < 0 or args.max_queue < 0 \
            or not 0 <= args.pinned_memory_mb <= 1 << 20:
        p.error("--max-batch and --instances must be at least 1, --max-queue-delay-us and --max-queue at least 0, "
                "--pinned-memory-mb from 0 to 1048576")
    gpus = [0]
    if args.gpus is not None:
        gpus = gpu_list(args.gpus)
        if gpus is None:
            p.error(f"--gpus {args.gpus}: give distinct GPU numbers, e.g. --gpus 0,1")
        if args.device != "cuda":
            p.error("--gpus is for --device cuda")
        if args.ray:
            p.error("--gpus is not for --ray: Ray places the replicas, one GPU each")
    batch_sizes = None
    if args.batch_sizes is not None:
        if args.device != "cuda":
            p.error("--batch-sizes is for --device cuda (the CPU engine runs each batch as it comes)")
        batch_sizes = batch_size_list(args.batch_sizes, args.max_batch)
        if batch_sizes is None:
            p.error(f"--batch-sizes {args.batch_sizes}: give distinct integers from 1 to --max-batch ({args.max_batch}), "
                    f"at most {_SHAPES_A_CONTEXT_KEEPS} with --max-batch")
    from kiln import _kiln

    has_native_grpc = getattr(_kiln, "has_native_grpc", False)
    if args.grpc_front == "native":
        if args.ray:
            p.error("--grpc-front native is not for --ray (the replicas' requests go through Ray's handles)")
        if not has_native_grpc:
            p.error("--grpc-front native: this kiln was built without gRPC's C++ library "
                    "(apt-get install libgrpc++-dev protobuf-compiler-grpc, then build kiln again)")
    elif args.grpc_front == "auto":
        args.grpc_front = "native" if has_native_grpc and not args.ray else "kserve"
    replicas = replica_range(args.replicas)
    if replicas is None:
        p.error(f"--replicas {args.replicas}: give N or MIN:MAX, with 1 <= MIN <= MAX")
    if (args.replicas != "1" or args.ray_address != "local") and not args.ray:
        p.error("--replicas and --ray-address go with --ray")
    for flag, port in (("--http-port", args.http_port), ("--grpc-port", args.grpc_port)):
        if not port_is_free(port):
            p.error(f"{flag} {port}: the port is in use (another server?)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s kiln serve %(levelname)s %(message)s")
    defaults = ModelConfig(device=args.device, precision=args.precision or "fp32", max_batch=args.max_batch,
                           max_queue_delay_us=args.max_queue_delay_us, max_queue=args.max_queue, instances=args.instances,
                           gpus=gpus, batch_sizes=batch_sizes)
    if os.path.isdir(args.model):
        entries = repository_models(args.model, defaults)
    elif os.path.isfile(args.model):
        name = args.name or os.path.splitext(os.path.basename(args.model))[0]
        entries = [(name, args.model, defaults)]
    else:
        p.error(f"{args.model} does not exist")
    # KServe's own argument parser reads sys.argv when imported: its gRPC message limits (4 MiB by
    # default) are set to take any request of --max-request-mb and its answer.
    grpc_bytes = str(int(args.max_request_mb * (1 << 20)) + (1 << 20))
    sys.argv = sys.argv[:1] + ["--grpc_max_receive_message_length", grpc_bytes, "--grpc_max_send_message_length", grpc_bytes]
    import kserve

    max_request_bytes = int(args.max_request_mb * (1 << 20))
    if args.ray:
        models = _ray_models(entries, args.ray_address, replicas, max_request_bytes)
        if models is None:
            return 1
    else:
        KilnModel = _kiln_model_class()
        models = []
        for name, path, config in entries:
            m = KilnModel(name, path, config, max_request_bytes, native_front=args.grpc_front == "native")
            try:
                m.load()
            except Exception as e:  # noqa: BLE001 (kiln.Error and the like: one line, exit 1, nothing served)
                sys.stderr.write(f"kiln: error: kiln serve: model '{name}' ({path}) cannot be served: {e}\n")
                return 1
            models.append(m)
        # Inputs clients leave in shared memory go from there to a GPU directly: the objects are
        # pinned as they are registered (the registration holds for every GPU).
        gpu_models = [m for m in models if m.kiln_engine.backend == "cuda"]
        if gpu_models:
            shared_memory.REGIONS.pin_gpu = gpu_models[0].config.gpus[0]
    from kserve.model_server import app

    # A JSON body spells each value in several bytes: it may be 8 times --max-request-mb, and a
    # binary one carries a JSON header besides its tensors.
    app.add_middleware(_JsonUnlessBinary, max_body_bytes=8 * max_request_bytes + (1 << 20))
    _add_shared_memory_routes(app)
    _extend_kserve_grpc()
    # One server process: the models' engines, queues and batches live in it (KServe's --workers
    # would load every model once per process and batch each process's requests apart).
    front = None
    if args.grpc_front == "native":
        front = _start_native_front(models, args.grpc_port, max_request_bytes, int(args.pinned_memory_mb * (1 << 20)))
        if front is None:
            return 1
    server = kserve.ModelServer(http_port=args.http_port, grpc_port=args.grpc_port, workers=1,
                                enable_grpc=front is None, enable_latency_logging=False)
    try:
        server.start(models)
    finally:
        if front is not None:
            front.shutdown()  # the requests it holds are answered first
        if args.ray:
            _ray_stop([name for name, _, _ in entries], args.ray_address)
    return 0


def _start_native_front(models: list, port: int, max_request_bytes: int, pinned_input_bytes: int):
    """kiln's C++ gRPC front on `port`, serving every model; None (said on stderr) when it cannot
    start. Its counters are kiln's metrics at /metrics (NativeFrontMetrics)."""
    import kiln
    from kiln import _kiln
    from prometheus_client import REGISTRY

    gpu_models = [m for m in models if m.kiln_engine.backend == "cuda"]
    try:
        front = _kiln.GrpcFront(f"[::]:{port}", [m.native_description() for m in models], max_request_bytes,
                                gpu_models[0].config.gpus[0] if gpu_models else -1, kiln.__version__,
                                pinned_input_bytes)
    except kiln.Error as e:
        sys.stderr.write(f"kiln: error: kiln serve: {e}\n")
        return None
    # The threads HTTP requests wait on while the front's batcher runs them (GrpcFront.run blocks):
    # enough that requests in flight queue in the batcher, where they batch, and not in front of a
    # small pool (the event loop's default executor has cpu_count + 4 threads).
    waits = ThreadPoolExecutor(256, thread_name_prefix="kiln-http-wait")
    for m in models:
        m.native_front, m.native_waits = front, waits
        m._series = _FrontCounts(front, m.name)
    # One registry of shared-memory regions for both protocols: the front's.
    shared_memory.REGIONS = shared_memory.NativeRegions(front)
    REGISTRY.register(NativeFrontMetrics(front))
    log.info("gRPC: kiln's native front on port %d", front.port)
    return front


class NativeFrontMetrics:
    """The native gRPC front's counters as kiln's metrics, with the names, labels and buckets the
    Python batcher's have (_metrics), read at each scrape: requests and errors of both protocols
    (HTTP requests go through its batcher too), runs by device, and the histograms of rows per run,
    queue time per request and time per run."""

    def __init__(self, front):
        self._front = front

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        stats = self._front.stats()
        for name in ("requests", "errors"):
            family = CounterMetricFamily(f"kiln_{name}", _METRIC_HELP[name], labels=["model"])
            for model, s in stats.items():
                family.add_metric([model], s[name])
            yield family
        runs = CounterMetricFamily("kiln_runs", _METRIC_HELP["runs"], labels=["model", "device"])
        for model, s in stats.items():
            for device, count in s["runs_by_device"].items():
                runs.add_metric([model, device], count)
        yield runs
        for name, field_name in (("batch", "batch_rows"), ("queue", "queue_seconds"), ("compute", "compute_seconds")):
            family = HistogramMetricFamily(_METRIC_NAMES[name], _METRIC_HELP[name], labels=["model"])
            for model, s in stats.items():
                h = s[field_name]
                buckets = [(_bucket_label(bound), count) for bound, count in h["buckets"]] + [("+Inf", h["count"])]
                family.add_metric([model], buckets, h["sum"])
            yield family


def _bucket_label(bound: float) -> str:
    """A bucket's le label as prometheus_client writes it for a Histogram's buckets (1.0, 0.005)."""
    from prometheus_client.utils import floatToGoString

    return floatToGoString(float(bound))


def _ray_stop(names: list[str], address: str) -> None:
    """Ends the models' deployments: a Ray instance of this process's own goes whole; on a cluster
    joined, the models' applications are deleted (their replicas finish what they hold)."""
    import ray
    from ray import serve

    if address != "local":
        for name in names:
            serve.delete(name)
    ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
