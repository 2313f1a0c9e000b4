"""kiln as a torch.compile backend.

    import kiln.torch_backend                        # registers "kiln" (pip's install does it by entry point)
    fast = torch.compile(model, backend="kiln")      # or backend=kiln.torch_backend.backend(precision="fp16")

Each graph TorchDynamo captures is exported to ONNX with torch's dynamo exporter and built into a
kiln engine for the shapes, dtypes and device of the inputs it is called with: on CUDA inputs a
GPU engine (fp16 by default), on CPU inputs the CPU engine (fp32). The model's parameters and
buffers become the engine's constants (an inference engine: weights changed in place after the
build are not seen; torch.compile again). Engines are cached by graph, input shapes and
options, so a new shape builds once and then runs from the cache. A graph kiln cannot take (an
export that fails, an operator kiln refuses, outputs that are not tensors, symbolic shapes) runs
in eager PyTorch instead, with one warning naming the reason; `kiln.torch_backend.stats` counts
both.

On the GPU the engine runs on torch's current stream through a context per engine, with the
input tensors and new output tensors bound to it (Context.set_tensor_address; a tensor that is
not dense and 256-byte aligned is copied first). Addresses that come back (outputs that torch's
allocator hands out in turn, inputs that stay where they are) get CUDA graphs of their own and
run without copies; addresses met once run through the context's buffers, copied in and out
(docs/design/gpu-engine.md, "Zero-copy inputs and outputs").
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import warnings
from collections import Counter, OrderedDict
from typing import Any, Callable

import torch

import kiln

stats: Counter = Counter()  # "engines" built, "eager" graphs left to PyTorch, "cached" engines reused
_CACHE_ENTRIES = 32  # engines kept for reuse (each holds its model's parameters); the oldest go first
_cache: OrderedDict[tuple, tuple[Callable, list]] = OrderedDict()
_cache_lock = threading.Lock()
# kiln's dtype names -> torch's, for the output tensors a GPU engine writes into.
_TORCH_DTYPES = {name: getattr(torch, name) for name in
                 ("float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
                  "uint32", "uint64", "bool") if hasattr(torch, name)}


def _is_constant(t: Any) -> bool:
    """A parameter or buffer of the model: TorchDynamo lifts them to graph inputs and marks them
    static; kiln bakes them into the engine."""
    return isinstance(t, torch.nn.Parameter) or getattr(t, "_dynamo_static_input_type", None) is not None


class _WithConstants(torch.nn.Module):
    """The captured graph with its parameters and buffers closed over: the exported model's inputs
    are the user's tensors only."""

    def __init__(self, gm: torch.fx.GraphModule, constants: dict[int, torch.Tensor], arity: int):
        super().__init__()
        self.gm = gm
        self.arity = arity
        self.constant_slots = sorted(constants)
        for i, t in constants.items():
            self.register_buffer(f"constant_{i}", t.detach(), persistent=False)

    def forward(self, *inputs):
        args, given = [], iter(inputs)
        for i in range(self.arity):
            args.append(getattr(self, f"constant_{i}") if i in self.constant_slots else next(given))
        out = self.gm(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _key(gm: torch.fx.GraphModule, example_inputs: list, options: dict) -> tuple:
    code = hashlib.sha256(gm.code.encode()).hexdigest()
    # Symbolic sizes (SymInt inputs, when TorchDynamo makes a graph dynamic) key by their text:
    # such graphs run in eager PyTorch anyway (_build).
    shapes = tuple((tuple(t.shape), str(t.dtype), t.device.type, _is_constant(t), id(t) if _is_constant(t) else 0)
                   if isinstance(t, torch.Tensor) else ("value", repr(t)) for t in example_inputs)
    return code, shapes, tuple(sorted(options.items()))


def _eager(gm: torch.fx.GraphModule, why: str) -> Callable:
    stats["eager"] += 1
    warnings.warn(f"kiln torch.compile backend: this graph runs in eager PyTorch: {why}", stacklevel=3)
    return gm.forward


def _build(gm: torch.fx.GraphModule, example_inputs: list, precision: str | None, device: str | None) -> Callable:
    if any(not isinstance(t, torch.Tensor) for t in example_inputs):
        return _eager(gm, "it has symbolic sizes (kiln builds an engine per shape: mark no dims dynamic)")
    constants = {i: t for i, t in enumerate(example_inputs) if _is_constant(t)}
    user = [t for i, t in enumerate(example_inputs) if i not in constants]
    if not user:
        return _eager(gm, "it takes no input tensors")
    on_cuda = any(t.is_cuda for t in user)
    device = device or ("cuda" if on_cuda else "cpu")
    if device == "cuda" and not kiln.has_cuda:
        return _eager(gm, "the inputs are on CUDA and this kiln was built without CUDA")
    precision = precision or ("fp16" if device == "cuda" else "fp32")
    module = _WithConstants(gm, constants, len(example_inputs)).eval()
    quiet = logging.getLogger("onnxscript")  # its constant folder logs each value it leaves to the runtime
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with torch.no_grad(), tempfile.TemporaryDirectory(prefix="kiln-torch-") as folder:
            path = os.path.join(folder, "graph.onnx")
            program = torch.onnx.export(module, tuple(t.detach() for t in user), dynamo=True, verbose=False)
            program.save(path)
            options = kiln.BuildOptions()
            options.device = device
            options.precision = precision
            if device == "cuda":  # the GPU of the inputs
                index = next((t.device.index for t in user if t.is_cuda), None)
                options.gpu = torch.cuda.current_device() if index is None else index
            engine = kiln.Engine.from_onnx(path, options)
    except kiln.Error as e:
        return _eager(gm, f"kiln refuses it: {e}")
    except Exception as e:  # noqa: BLE001 (the exporter's errors are many kinds)
        return _eager(gm, f"the ONNX export failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    finally:
        quiet.setLevel(level)
    with torch.no_grad():
        expected = module(*user)
    if len(engine.outputs) != len(expected) or len(engine.inputs) != len(user):
        return _eager(gm, "the exported model's inputs or outputs differ from the graph's")
    input_names = [d.name for d in engine.inputs]
    output_names = [d.name for d in engine.outputs]
    output_dtypes = [t.dtype for t in expected]
    if device == "cuda" and any(d.dtype not in _TORCH_DTYPES for d in engine.outputs):
        return _eager(gm, "an output's dtype has no torch counterpart: " + ", ".join(d.dtype for d in engine.outputs))
    stats["engines"] += 1

    if device == "cuda":
        context = engine.create_context()
        lock = threading.Lock()
        gpu = torch.device("cuda", engine.gpu)
        # The engine's own output dtypes and shapes (fixed: an engine per input shape).
        outputs = [(n, tuple(context.output_shape(n)), _TORCH_DTYPES[d.dtype]) for n, d in zip(output_names, engine.outputs)]

        def run(*args):
            inputs = [kiln._bindable(a) for i, a in enumerate(args) if i not in constants]
            results = [torch.empty(shape, dtype=dtype, device=gpu) for _, shape, dtype in outputs]
            with lock:
                for name, t in zip(input_names, inputs):
                    context.set_tensor_address(name, t.data_ptr(), t.numel() * t.element_size())
                for (name, _, _), t in zip(outputs, results):
                    context.set_tensor_address(name, t.data_ptr(), t.numel() * t.element_size())
                context.enqueue(torch.cuda.current_stream(gpu).cuda_stream)
            return tuple(t if t.dtype == dt else t.to(dt) for t, dt in zip(results, output_dtypes))
        return run

    def run_cpu(*args):
        inputs = {n: a.detach().contiguous().numpy() for n, a in
                  zip(input_names, (a for i, a in enumerate(args) if i not in constants))}
        out = engine.run(inputs)
        return tuple(torch.from_numpy(out[n].copy()).to(dt) for n, dt in zip(output_names, output_dtypes))
    return run_cpu


def backend(precision: str | None = None, device: str | None = None) -> Callable:
    """A torch.compile backend with kiln's build options: precision (fp32, tf32, fp16, best;
    default fp16 on CUDA inputs, fp32 on CPU ones) and device (default: the inputs')."""
    options = {"precision": precision, "device": device}

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        key = _key(gm, example_inputs, options)
        with _cache_lock:
            if key in _cache:
                stats["cached"] += 1
                _cache.move_to_end(key)
                return _cache[key][0]
        compiled = _build(gm, example_inputs, precision, device)
        # The entry holds the parameters it baked, so their ids in the key stay theirs.
        constants = [t for t in example_inputs if isinstance(t, torch.Tensor) and _is_constant(t)]
        with _cache_lock:
            _cache[key] = (compiled, constants)
            while len(_cache) > _CACHE_ENTRIES:
                _cache.popitem(last=False)
        return compiled

    return compile_graph


kiln_backend = backend()  # torch.compile(model, backend="kiln") after registration


def _declared_by_entry_point() -> bool:
    """Whether an installed kiln-engine declares "kiln" in torch_dynamo_backends: torch then
    registers kiln_backend itself when the name is first used, and a second registration here
    would be refused as a duplicate name."""
    from importlib.metadata import entry_points

    return any(ep.name == "kiln" for ep in entry_points(group="torch_dynamo_backends"))


if not _declared_by_entry_point():
    from torch._dynamo import register_backend

    register_backend(kiln_backend, name="kiln")
