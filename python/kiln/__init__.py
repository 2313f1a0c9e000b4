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

and binds CUDA memory of the caller's (torch, CuPy, JAX: anything with __dlpack__) to inputs
and outputs, so that runs read and write it in place:

    context.bind("input", x_cuda); context.bind("logits", out_cuda)
    context.enqueue(torch.cuda.current_stream().cuda_stream)

Engine, Context and BuildOptions mirror the C++ API (include/kiln/kiln.h); every failure is a
kiln.Error with kiln's message (the file, node or input at fault, and why), of the subclass of its
kind (kiln.UnsupportedError, kiln.InvalidArgumentError, ...) with the fields kiln::Error carries:
kind, message, file, node, op_type, input_index, hint. kiln.InferenceSession runs a model the
way ONNX Runtime's InferenceSession does.
"""
from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._kiln import (BuildOptions, Context, DeviceError, Engine, Error, InternalError, InvalidArgumentError,  # noqa: F401
                    InvalidModelError, IoError, PinnedHostMemory, ShapeRange, TensorDesc, UnsupportedError, __version__,
                    cpu_threads, has_cuda, model_inputs, set_cpu_threads)
from . import _kiln

__all__ = ["Builder", "BuildOptions", "Context", "DeviceTensor", "Engine", "Error", "InvalidModelError",
           "UnsupportedError", "InvalidArgumentError", "IoError", "DeviceError", "InternalError", "InferenceSession",
           "PinnedHostMemory", "ShapeRange", "TensorDesc", "calibrate", "simplify", "has_cuda", "model_inputs",
           "set_cpu_threads", "cpu_threads", "__version__"]


def _as_numpy(batch: Any):
    """A calibration batch as a numpy array, or a dict of them by input name: DataLoader items
    (x, y) give x; torch tensors leave the GPU."""
    import numpy as np

    def array(x):
        if hasattr(x, "detach"):  # a torch tensor
            x = x.detach().cpu().numpy()
        return np.asarray(x)

    if isinstance(batch, (tuple, list)) and batch and not isinstance(batch[0], (int, float)):
        batch = batch[0]
    if isinstance(batch, Mapping):
        return {str(name): array(value) for name, value in batch.items()}
    return array(batch)


def calibrate(model: str, batches: Iterable, algorithm: str = "entropy", percentile: float = 99.99,
              max_batches: int = 0, device: str = "cpu", progress: bool = True, gpu: int = 0) -> dict[str, float]:
    """INT8 scales ({tensor name: scale}) of a model from any iterable of batches.

    A batch is a dict {input name: array or torch tensor} with every input of the model (a
    transformer's input_ids, attention_mask, ...), or, for a model of one input, a numpy array,
    a torch tensor or an (inputs, labels) pair as a DataLoader yields. The model runs in float32
    on `device` (GPU number `gpu` for cuda); `algorithm` is entropy (as TensorRT), minmax or
    percentile.
    """
    iterator = iter(batches)

    def next_batch():
        try:
            return _as_numpy(next(iterator))
        except StopIteration:
            return None

    return _kiln.calibrate(model, next_batch, algorithm, percentile, max_batches, device, gpu, progress)


def simplify(onnx_path: str, output_path: str) -> tuple[int, int]:
    """Writes the model after kiln's folding passes as ONNX; returns (nodes before, nodes after)."""
    return _kiln.simplify_onnx(onnx_path, output_path)


class Builder:
    """Build options plus calibration, in one place: the Python face of kiln::BuildOptions.

    precision: fp32, tf32, fp16, best, int8 or fp8; device: cpu or cuda; gpu: the GPU a cuda
    engine is built on and runs on (CUDA's device index in this process). shapes: {input: shape} fixes
    an input's shape; profiles: a list of {input: (min, opt, max)} (GPU engines then run any shape
    within one profile). input_values: {input: array} for GPU engines, inputs that set parameters
    (a Reduce's axes, Resize's sizes, TopK's k, ...) and the values to plan for (runs with other
    values are planned for them on first use). For int8 and fp8, call calibrate() first or pass int8_scales. int8 and fp8 on
    the GPU keep a layer quantized only where timing shows it faster than fp16; quantize_all=True
    quantizes every eligible layer (`kiln build --int8-all`, `--fp8-all`). float_layers: nodes kept
    out of int8/fp8; fp32_layers: nodes a GPU fp16 (best, int8, fp8) build keeps in float32
    (`--layer-precision NAME=fp32`). gpu_row_stages=False runs every node after one whose output
    shapes depend on the data on the CPU engine, the per-region heads among them (a detection
    model's box and mask heads) too (`kiln build --no-gpu-row-stages`).
    """

    def __init__(self, precision: str = "fp32", device: str = "cpu", shapes: Mapping[str, Sequence[int]] | None = None,
                 profiles: Sequence[Mapping[str, Sequence[Sequence[int]]]] = (),
                 timing_cache: str | None = None, allow_cpu_fallback: bool = True,
                 int8_scales: Mapping[str, float] | None = None, float_layers: Sequence[str] = (),
                 fp32_layers: Sequence[str] = (), optimize: bool = True, verbose: bool = False, quantize_all: bool = False, gpu: int = 0,
                 input_values: Mapping[str, Any] | None = None, gpu_row_stages: bool = True):
        self.options = BuildOptions()
        self.options.precision = precision
        self.options.device = device
        self.options.gpu = gpu
        self.options.optimize = optimize
        self.options.input_shapes = {k: [int(d) for d in v] for k, v in (shapes or {}).items()}
        self.options.profiles = [{name: r if isinstance(r, ShapeRange) else ShapeRange(*[[int(d) for d in s] for s in r])
                                  for name, r in p.items()} for p in profiles]
        self.options.input_values = dict(input_values or {})
        self.options.timing_cache = timing_cache or ""
        self.options.allow_cpu_fallback = allow_cpu_fallback
        self.options.gpu_row_stages = gpu_row_stages
        self.options.int8_scales = dict(int8_scales or {})
        self.options.float_layers = list(float_layers)
        self.options.fp32_layers = list(fp32_layers)
        self.options.quantized_where_faster = not quantize_all
        if verbose:
            self.options.log = lambda line: print(line, flush=True)

    def calibrate(self, model: str, batches: Iterable, **kwargs) -> dict[str, float]:
        """Calibrates on `batches` (see kiln.calibrate) and keeps the scales for build()."""
        kwargs.setdefault("device", self.options.device)
        kwargs.setdefault("gpu", self.options.gpu)
        scales = calibrate(model, batches, **kwargs)
        self.options.int8_scales = scales
        return scales

    def build(self, model: Any) -> Engine:
        """The engine of `model` (a path, bytes or an onnx.ModelProto). An int8 or fp8 build takes
        the scales of calibrate() or int8_scales, or a QDQ model's own (kiln quantize's, or any
        QuantizeLinear/DequantizeLinear model) without calibration. A GPU engine with nodes that
        have no GPU layer runs them on the CPU engine and warns, naming them, as it does when nodes
        follow one whose output shapes depend on the data (detection models' box selection):
        those run on the CPU engine after the GPU's part (allow_cpu_fallback=False refuses such a
        build instead)."""
        engine = Engine.from_onnx(model, self.options)
        if self.options.device == "cuda":
            info = engine.info()
            on_cpu = [f"{l['name']} ({l['op']})" for l in info["layers"] if l["cpu_fallback"] and l["tactic"] == "cpu-fallback"]
            if on_cpu:
                warnings.warn(f"{len(on_cpu)} node(s) have no GPU layer and run on the CPU engine (slow): "
                              + ", ".join(on_cpu) + "; Builder(allow_cpu_fallback=False) refuses them", stacklevel=2)
            if info["data_dependent_nodes"]:
                after = sum(l["cpu_fallback"] and l["tactic"] != "cpu-fallback" for l in info["layers"])
                starts = info["data_dependent_nodes"]
                named = ", ".join(starts[:4]) + (f", and {len(starts) - 4} more" if len(starts) > 4 else "")
                warnings.warn(f"{after} node(s) follow {named}, whose output shapes "
                              "depend on the data, and run on the CPU engine after the GPU's part; "
                              "Builder(allow_cpu_fallback=False) refuses them", stacklevel=2)
        return engine


_engine_create_context = Engine.create_context  # the extension's, before the wrapper below replaces it


def _create_context(self: Engine, use_cuda_graph: bool = True, share_activation_memory: bool = False) -> Context:
    """A new execution context (GPU engines): its own activation memory and CUDA graph.
    share_activation_memory: take the activation memory the engine keeps for every context made
    so, instead of memory of its own; their runs then take turns on the GPU (ContextOptions in
    kiln/types.h)."""
    context = _engine_create_context(self, use_cuda_graph, share_activation_memory)
    context.engine = self  # for the tensor descriptions of run_torch(), and to keep the engine alive
    return context


def _bindable(tensor: Any) -> Any:
    """A torch tensor as bind() takes it: itself when dense, row-major and 256-byte aligned (a
    tensor of its own storage is), else a copy that is."""
    import torch

    tensor = tensor.detach()
    if tensor.is_contiguous() and tensor.data_ptr() % 256 == 0:
        return tensor
    return torch.empty_like(tensor, memory_format=torch.contiguous_format).copy_(tensor)


def _run_torch(self: Context, inputs: Mapping[str, Any], stream: Any = None,
               outputs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Runs a GPU context on torch CUDA tensors: the inputs and the tensors in `outputs` are bound
    for this run (Context.bind; a tensor that is not dense and 256-byte aligned is copied first),
    and every other output is a torch view of the context's own buffer (overwritten by the next
    run: clone() what you keep). Addresses the context met lately run without copies; others
    are copied in and out of its buffers (docs/python.md, "Zero-copy"). Runs on `stream` (default: torch's
    current stream of the engine's GPU), which must belong to the engine's GPU; the tensors are
    recorded on it, so that their memory outlives the run."""
    import torch

    stream = stream or torch.cuda.current_stream(self.engine.gpu)
    outputs = dict(outputs or {})
    bound = [(name, _bindable(t)) for name, t in inputs.items()] + list(outputs.items())
    done = []
    try:
        for name, tensor in bound:  # an input's shape is the tensor's (dynamic engines)
            self.bind(name, tensor)
            done.append(name)
        self.enqueue(stream.cuda_stream)
    finally:
        for name in done:
            self.unbind(name)
    for name, tensor in bound:
        tensor.record_stream(stream)
    return {d.name: outputs[d.name] if d.name in outputs else torch.from_dlpack(self.output_tensor(d.name))
            for d in self.engine.outputs}


_KDL_CUDA = 2  # DLPack's device type of CUDA memory


class DeviceTensor:
    """An input or output buffer of a GPU Context, in place, at the context's current shapes: what
    torch.from_dlpack, cupy.from_dlpack and jax.dlpack.from_dlpack take through the DLPack
    protocol (__dlpack__, __dlpack_device__), with the engine's GPU as its device. The memory is
    the context's: the next run writes it again (copy what you keep).

    A consumer passes its stream to __dlpack__; the stream then waits for the context's last run
    (Context.wait_for_last_run), so reading on another stream than the run's is safe."""

    def __init__(self, context: Context, name: str, output: bool):
        engine = context.engine
        descs = engine.outputs if output else engine.inputs
        desc = next((d for d in descs if d.name == name), None)
        if desc is None:
            raise InvalidArgumentError(f"the engine has no {'output' if output else 'input'} '{name}'")
        self.name = name
        self.dtype = desc.dtype
        self.shape = tuple(context.output_shape(name) if output else context.input_shape(name))
        self.gpu = engine.gpu
        self.data_ptr = context.output_pointer(name) if output else context.input_pointer(name)
        self._context = context
        self._output = output

    def __repr__(self) -> str:
        kind = "output" if self._output else "input"
        return f"kiln.DeviceTensor({kind} '{self.name}', shape={list(self.shape)}, dtype={self.dtype}, cuda:{self.gpu})"

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDL_CUDA, self.gpu)

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule over the buffer (DLPack 1.0's versioned one when max_version allows).
        stream: the consumer's CUDA stream (None: the legacy default stream, as the protocol says;
        -1: no ordering, the caller synchronizes)."""
        if copy:
            raise BufferError(f"kiln.DeviceTensor '{self.name}' is exported in place: copy=True is not supported")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"kiln.DeviceTensor '{self.name}' lives on cuda:{self.gpu} (DLPack device "
                              f"{self.__dlpack_device__()}), not on DLPack device {tuple(dl_device)}")
        if stream is None:
            stream = 1  # cudaStreamLegacy
        if stream != -1:
            self._context.wait_for_last_run(stream)
        versioned = max_version is not None and tuple(max_version) >= (1, 0)
        dlpack = self._context.output_dlpack if self._output else self._context.input_dlpack
        return dlpack(self._context.engine, self.name, versioned=versioned)


def _output_tensor(self: Context, name: str) -> DeviceTensor:
    """The output `name` as a DLPack-exporting view of the context's buffer (DeviceTensor)."""
    return DeviceTensor(self, name, output=True)


def _input_tensor(self: Context, name: str) -> DeviceTensor:
    """The input `name` as a DLPack-exporting view of the context's buffer (DeviceTensor): write
    into it, then enqueue()."""
    return DeviceTensor(self, name, output=False)


Engine.create_context = _create_context
Context.run_torch = _run_torch
Context.output_tensor = _output_tensor
Context.input_tensor = _input_tensor


_engine_from_onnx = Engine.from_onnx  # the extension's, taking a path


def _model_bytes(model: Any) -> bytes | None:
    """A model given as bytes or as an onnx.ModelProto, serialized; None for a path."""
    if isinstance(model, (str, os.PathLike)):
        return None
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model)
    if hasattr(model, "SerializeToString") and hasattr(model, "graph"):
        for tensor in model.graph.initializer:
            if tensor.data_location == 1:  # onnx.TensorProto.EXTERNAL: its data is in another file
                raise InvalidArgumentError(f"the ModelProto's initializer '{tensor.name}' keeps its data in an external "
                                           "file: pass the model's path instead, so kiln finds the data beside it")
        return model.SerializeToString()
    raise InvalidArgumentError(f"a model is a path, bytes or an onnx.ModelProto, not {type(model).__name__}")


def _from_onnx(model: Any, options: BuildOptions | None = None) -> Engine:
    """An engine from an ONNX model: a path, the model's bytes, or an onnx.ModelProto (whose data
    is in the proto: a model with external data is built from its path)."""
    options = options or BuildOptions()
    data = _model_bytes(model)
    if data is None:
        return _engine_from_onnx(os.fspath(model), options)
    with tempfile.TemporaryDirectory(prefix="kiln-model-") as folder:
        path = os.path.join(folder, "model.onnx")
        with open(path, "wb") as f:
            f.write(data)
        return _engine_from_onnx(path, options)


def _serialize(self: Engine) -> bytes:
    """The engine file's bytes (what save() writes)."""
    with tempfile.TemporaryDirectory(prefix="kiln-engine-") as folder:
        path = os.path.join(folder, "model.engine")
        self.save(path)
        with open(path, "rb") as f:
            return f.read()


def _deserialize(data: bytes, max_memory: int = 0, gpu: int = 0) -> Engine:
    """An engine from the bytes serialize() gave, checked as Engine.load checks a file, on GPU
    `gpu` for a GPU engine."""
    with tempfile.TemporaryDirectory(prefix="kiln-engine-") as folder:
        path = os.path.join(folder, "model.engine")
        with open(path, "wb") as f:
            f.write(bytes(data))
        return Engine.load(path, max_memory, gpu)


Engine.from_onnx = staticmethod(_from_onnx)
Engine.serialize = _serialize
Engine.deserialize = staticmethod(_deserialize)


class NodeArg:
    """An input or output as ONNX Runtime describes it: name, shape (a dim's name, or None, where
    it is dynamic) and type ('tensor(float)')."""

    _ONNX_TYPES = {"float32": "float", "float16": "float16", "bfloat16": "bfloat16", "float64": "double",
                   "int8": "int8", "uint8": "uint8", "int16": "int16", "uint16": "uint16", "int32": "int32",
                   "uint32": "uint32", "int64": "int64", "uint64": "uint64", "bool": "bool"}

    def __init__(self, desc: TensorDesc):
        self.name = desc.name
        names = list(desc.dim_names) + [""] * len(desc.shape)
        self.shape = [d if d >= 0 else (names[i] or None) for i, d in enumerate(desc.shape)]
        self.type = f"tensor({self._ONNX_TYPES.get(desc.dtype, desc.dtype)})"

    def __repr__(self) -> str:
        return f"NodeArg(name='{self.name}', type='{self.type}', shape={self.shape})"


class InferenceSession:
    """A kiln engine with ONNX Runtime's InferenceSession interface, so code written for ONNX
    Runtime runs on kiln by changing the import:

        session = kiln.InferenceSession("model.onnx")            # a path, bytes or an onnx.ModelProto
        logits, = session.run(None, {"input": x})                 # or run(["logits"], {...})

    providers: ONNX Runtime's names; "CUDAExecutionProvider" or "TensorrtExecutionProvider" first
    builds a GPU engine (this build must have CUDA), on the GPU its options' device_id names
    (("CUDAExecutionProvider", {"device_id": 1})), anything else the CPU engine. An engine file
    (.engine) is loaded as it is. builder_options: kiln.Builder's keywords (precision, shapes,
    profiles, ...) for the build."""

    _GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")

    def __init__(self, model: Any, sess_options: Any = None, providers: Sequence[Any] | None = None,
                 **builder_options: Any):
        del sess_options  # ONNX Runtime's session options have no kiln meaning
        first = providers[0] if providers else "CPUExecutionProvider"
        provider_options = {}
        if isinstance(first, tuple):  # ("CUDAExecutionProvider", {options})
            first, provider_options = first[0], dict(first[1]) if len(first) > 1 else {}
        builder_options.setdefault("device", "cuda" if first in self._GPU_PROVIDERS else "cpu")
        if builder_options["device"] == "cuda":
            builder_options.setdefault("gpu", int(provider_options.get("device_id", 0)))
        if isinstance(model, (str, os.PathLike)) and os.fspath(model).endswith(".engine"):
            self.engine = Engine.load(os.fspath(model), gpu=builder_options.get("gpu", 0))
        else:
            self.engine = Engine.from_onnx(model, Builder(**builder_options).options)
        self._inputs = [NodeArg(d) for d in self.engine.inputs]
        self._outputs = [NodeArg(d) for d in self.engine.outputs]

    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_providers(self) -> list[str]:
        return ["CUDAExecutionProvider" if self.engine.backend == "cuda" else "CPUExecutionProvider"]

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None) -> list:
        """The outputs named (all, in the model's order, for None) as numpy arrays."""
        del run_options
        outputs = self.engine.run(dict(input_feed))
        names = list(output_names) if output_names else [o.name for o in self._outputs]
        unknown = [n for n in names if n not in outputs]
        if unknown:
            raise InvalidArgumentError(f"the model has no output {unknown[0]!r} (its outputs: "
                                       f"{[o.name for o in self._outputs]})")
        return [outputs[n] for n in names]
