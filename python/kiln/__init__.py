"""kiln: compile ONNX models into inference engines and run them, from Python.

    import kiln
    builder = kiln.Builder(precision="int8", device="cpu")
    builder.calibrate("model.onnx", loader)          # any iterable of batches; a DataLoader works
    engine = builder.build("model.onnx")
    outputs = engine.run({"input": batch})          # numpy arrays or torch tensors in, numpy out
    engine.save("model.engine"); kiln.Engine.load("model.engine")

On a GPU (the CUDA backend), a Context runs with torch CUDA tensors without copies to the host:

    context = engine.create_context()
    logits = context.run_torch({"input": x_cuda})["logits"]   # a torch view of the engine's buffer

Engine, Context and BuildOptions mirror the C++ API (include/kiln/kiln.h); every failure is a
kiln.Error with kiln's message (the file, node or input at fault, and why).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._kiln import BuildOptions, Context, Engine, Error, ShapeRange, TensorDesc, __version__, has_cuda, model_inputs  # noqa: F401
from . import _kiln

__all__ = ["Builder", "BuildOptions", "Context", "Engine", "Error", "ShapeRange", "TensorDesc", "calibrate", "simplify", "has_cuda",
           "model_inputs", "__version__"]


def _as_numpy(batch: Any):
    """A calibration batch as a numpy array: DataLoader items (x, y) give x; torch tensors leave the GPU."""
    import numpy as np

    if isinstance(batch, (tuple, list)) and batch and not isinstance(batch[0], (int, float)):
        batch = batch[0]
    if isinstance(batch, Mapping):
        if len(batch) != 1:
            raise Error(f"a calibration batch given as a dict needs exactly one entry, got {sorted(batch)}")
        batch = next(iter(batch.values()))
    if hasattr(batch, "detach"):  # a torch tensor
        batch = batch.detach().cpu().numpy()
    return np.asarray(batch)


def calibrate(model: str, batches: Iterable, algorithm: str = "entropy", percentile: float = 99.99,
              max_batches: int = 0, device: str = "cpu", progress: bool = True) -> dict[str, float]:
    """INT8 scales ({tensor name: scale}) of a one-input model from any iterable of batches.

    A batch is a numpy array, a torch tensor, an (inputs, labels) pair as a DataLoader yields,
    or a one-entry dict. The model runs in float32 on `device`; `algorithm` is entropy (as
    TensorRT), minmax or percentile.
    """
    iterator = iter(batches)

    def next_batch():
        try:
            return _as_numpy(next(iterator))
        except StopIteration:
            return None

    return _kiln.calibrate(model, next_batch, algorithm, percentile, max_batches, device, progress)


def simplify(onnx_path: str, output_path: str) -> tuple[int, int]:
    """Writes the model after kiln's folding passes as ONNX; returns (nodes before, nodes after)."""
    return _kiln.simplify_onnx(onnx_path, output_path)


class Builder:
    """Build options plus calibration, in one place: the Python face of kiln::BuildOptions.

    precision: fp32, tf32, fp16, best, int8 or fp8; device: cpu or cuda. shapes: {input: shape} fixes
    an input's shape; profiles: a list of {input: (min, opt, max)} (GPU engines then run any shape
    within one profile). For int8 and fp8, call calibrate() first or pass int8_scales. int8 and fp8 on
    the GPU keep a layer quantized only where timing shows it faster than fp16; quantize_all=True
    quantizes every eligible layer (`kiln build --int8-all`, `--fp8-all`).
    """

    def __init__(self, precision: str = "fp32", device: str = "cpu", shapes: Mapping[str, Sequence[int]] | None = None,
                 profiles: Sequence[Mapping[str, Sequence[Sequence[int]]]] = (),
                 timing_cache: str | None = None, allow_cpu_fallback: bool = False,
                 int8_scales: Mapping[str, float] | None = None, float_layers: Sequence[str] = (),
                 optimize: bool = True, verbose: bool = False, quantize_all: bool = False):
        self.options = BuildOptions()
        self.options.precision = precision
        self.options.device = device
        self.options.optimize = optimize
        self.options.input_shapes = {k: [int(d) for d in v] for k, v in (shapes or {}).items()}
        self.options.profiles = [{name: r if isinstance(r, ShapeRange) else ShapeRange(*[[int(d) for d in s] for s in r])
                                  for name, r in p.items()} for p in profiles]
        self.options.timing_cache = timing_cache or ""
        self.options.allow_cpu_fallback = allow_cpu_fallback
        self.options.int8_scales = dict(int8_scales or {})
        self.options.float_layers = list(float_layers)
        self.options.quantized_where_faster = not quantize_all
        if verbose:
            self.options.log = lambda line: print(line, flush=True)

    def calibrate(self, model: str, batches: Iterable, **kwargs) -> dict[str, float]:
        """Calibrates on `batches` (see kiln.calibrate) and keeps the scales for build()."""
        kwargs.setdefault("device", self.options.device)
        scales = calibrate(model, batches, **kwargs)
        self.options.int8_scales = scales
        return scales

    def build(self, model: str) -> Engine:
        if self.options.precision in ("int8", "fp8") and not self.options.int8_scales:
            raise Error("an int8 build needs INT8 scales: call Builder.calibrate(model, batches) first, "
                        "or pass int8_scales")
        return Engine.from_onnx(model, self.options)


_engine_create_context = Engine.create_context  # the extension's, before the wrapper below replaces it


def _create_context(self: Engine, use_cuda_graph: bool = True) -> Context:
    """A new execution context (GPU engines): its own activation memory and CUDA graph."""
    context = _engine_create_context(self, use_cuda_graph)
    context.engine = self  # for the tensor descriptions of run_torch(), and to keep the engine alive
    return context


def _run_torch(self: Context, inputs: Mapping[str, Any], stream: Any = None) -> dict[str, Any]:
    """Runs a GPU context on torch CUDA tensors: inputs are copied device to device into the
    context's buffers, outputs are torch views of its output buffers (no copy; overwritten by
    the next run: clone() what you keep). Runs on `stream` (default: torch's current stream)."""
    import torch

    stream = stream or torch.cuda.current_stream()
    for name, tensor in inputs.items():  # dynamic engines run at the tensors' shapes
        if list(tensor.shape) != self.input_shape(name):
            self.set_input_shape(name, list(tensor.shape))
    with torch.cuda.stream(stream):
        for name, tensor in inputs.items():
            torch.from_dlpack(self.input_dlpack(self.engine, name)).copy_(tensor, non_blocking=True)
    self.enqueue(stream.cuda_stream)
    return {d.name: torch.from_dlpack(self.output_dlpack(self.engine, d.name)) for d in self.engine.outputs}


Engine.create_context = _create_context
Context.run_torch = _run_torch
