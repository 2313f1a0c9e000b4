# Types of kiln's C++ extension module (python/bindings/module.cc), for type checkers and
# editors. tests/e2e/test_python_package.py checks that every name here exists in the module and
# every public name of the module is here, with the same parameters. The kiln package
# (python/kiln/__init__.py) adds to the classes on import: Engine.from_onnx taking bytes or an
# onnx.ModelProto too, Engine.serialize and deserialize, Context.run_torch, output_tensor and
# input_tensor.
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from kiln import DeviceTensor

__version__: str
has_cuda: bool
has_native_grpc: bool  # GrpcFront below exists only where this is True (kiln built with gRPC's C++ library)

class Error(RuntimeError):
    """Every failure of kiln: the message names the file, node, input or option at fault, and why.
    The fields are what kiln::Error carries (empty strings and -1 where kiln did not say)."""
    kind: str
    message: str
    file: str
    node: str
    op_type: str
    input_index: int
    hint: str

class InvalidModelError(Error): ...
class UnsupportedError(Error): ...
class InvalidArgumentError(Error, ValueError): ...
class IoError(Error): ...
class DeviceError(Error): ...
class InternalError(Error): ...

class TensorDesc:
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> list[int]:
        """Dimensions; -1 where dynamic."""
    @property
    def dim_names(self) -> list[str]: ...

class ShapeRange:
    """min, opt and max shapes of one input in an optimization profile."""
    min: list[int]
    opt: list[int]
    max: list[int]
    def __init__(self, min: Sequence[int], opt: Sequence[int], max: Sequence[int]) -> None: ...

class BuildOptions:
    optimize: bool
    device: str  # "cpu" or "cuda"
    precision: str  # "fp32", "tf32", "fp16", "best", "int8" or "fp8"
    input_shapes: dict[str, list[int]]
    profiles: list[dict[str, ShapeRange]]
    input_values: dict[str, npt.NDArray[Any]]  # GPU: inputs that set parameters, planned for these values
    profile_timing_step: float
    timing_cache: str
    allow_cpu_fallback: bool
    gpu_row_stages: bool
    mark_outputs: list[str]
    max_memory: int
    gpu: int  # GPU engines: the GPU built on and run on (CUDA's device index in this process)
    int8_scales: dict[str, float]
    float_layers: list[str]
    fp32_layers: list[str]  # GPU fp16 (best, int8, fp8) builds: layers kept in float32 storage and math, by name
    quantized_where_faster: bool
    log: Callable[[str], None] | None
    def __init__(self) -> None: ...

class Engine:
    @staticmethod
    def from_onnx(model: str | os.PathLike[str] | bytes | Any, options: BuildOptions | None = None) -> Engine:
        """An engine from an ONNX model: a path, the model's bytes, or an onnx.ModelProto."""
    @staticmethod
    def load(path: str, max_memory: int = 0, gpu: int = 0) -> Engine: ...
    def save(self, path: str) -> None: ...
    def serialize(self) -> bytes:
        """The engine file's bytes (what save() writes)."""
    @staticmethod
    def deserialize(data: bytes, max_memory: int = 0, gpu: int = 0) -> Engine: ...
    @property
    def inputs(self) -> list[TensorDesc]: ...
    @property
    def outputs(self) -> list[TensorDesc]: ...
    @property
    def profiles(self) -> list[dict[str, ShapeRange]]: ...
    @property
    def backend(self) -> str: ...
    @property
    def gpu(self) -> int:
        """GPU engines: the GPU they run on; CPU engines: -1."""
    @property
    def layer_count(self) -> int: ...
    def info(self) -> dict[str, Any]: ...
    def create_context(self, use_cuda_graph: bool = True, share_activation_memory: bool = False) -> Context: ...
    def run(self, inputs: Mapping[str, Any], /) -> dict[str, npt.NDArray[Any]]:
        """Numpy arrays (or CPU torch tensors) in, of the engine's dtypes; numpy arrays out."""
    def profile(self, inputs: Mapping[str, Any], /) -> list[dict[str, Any]]:
        """CPU engines: one run, each layer timed by the wall clock: name, op, tactic, ms, flops
        and bytes (its activations read and written), at the run's shapes. GPU engines time
        layers through Context.profile."""

class Context:
    optimization_profile: int
    def run(self, inputs: Mapping[str, Any], /) -> dict[str, npt.NDArray[Any]]: ...
    def run_concatenated(self, pieces: Mapping[str, Sequence[Any]], zero_rows: int = 0) -> dict[str, npt.NDArray[Any]]:
        """run() of each input given as arrays one after another along the first dimension, then
        zero_rows rows of zeros; each piece is copied once, into the context's transfer buffer."""
    def run_torch(self, inputs: Mapping[str, Any], stream: Any = None,
                  outputs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """torch CUDA tensors in, read in place; the given output tensors written in place, the
        others torch views of the context's output buffers (no copy)."""
    def enqueue(self, cuda_stream: int = 0) -> None: ...
    def wait_for_last_run(self, cuda_stream: int) -> None:
        """Makes work queued on the stream from now on wait until the last enqueue() or run() has
        written its outputs."""
    def output_tensor(self, name: str) -> DeviceTensor:
        """The output buffer in place, exporting DLPack (__dlpack__, __dlpack_device__) on the engine's GPU."""
    def input_tensor(self, name: str) -> DeviceTensor:
        """The input buffer in place, exporting DLPack: write into it, then enqueue()."""
    def bind(self, name: str, memory: Any) -> None:
        """Zero-copy I/O: enqueue() reads the input, or writes the output, `name` in `memory` (a CUDA
        tensor or array with __dlpack__; dense, row-major, the engine's dtype, on its GPU, 256-byte
        aligned); an input takes memory's shape. Held until bound again or unbind(name)."""
    def unbind(self, name: str) -> None: ...
    def set_tensor_address(self, name: str, pointer: int, nbytes: int) -> None:
        """bind() by raw device pointer (0 unbinds); the caller keeps the memory alive."""
    def tensor_address(self, name: str) -> int: ...
    def set_input_shape(self, name: str, shape: Sequence[int]) -> None: ...
    def input_shape(self, name: str) -> list[int]: ...
    def set_input_values(self, name: str, values: Any) -> None:
        """The values of an input planned by value (Builder(input_values=...)) for the next enqueue()s."""
    def output_shape(self, name: str) -> list[int]: ...
    def input_pointer(self, name: str, /) -> int: ...
    def output_pointer(self, name: str, /) -> int: ...
    def input_dlpack(self, engine: Engine, name: str, versioned: bool = False) -> Any: ...
    def output_dlpack(self, engine: Engine, name: str, versioned: bool = False) -> Any: ...
    def profile(self, cuda_stream: int = 0) -> list[dict[str, Any]]: ...

class PinnedHostMemory:
    """Host memory page-locked for the GPU while this object lives: Context.run and run_concatenated
    copy inputs lying in it (arrays over it: numpy.frombuffer(pinned, ...)) straight to the device.
    Made from a writable, contiguous buffer (an mmap, a bytearray, a numpy array); reads as its bytes.
    gpu: the device current while it registers (the registration holds for every GPU). Raises
    UnsupportedError without the CUDA backend, DeviceError when the driver refuses."""
    def __init__(self, memory: Any, gpu: int = 0) -> None: ...
    def __len__(self) -> int: ...
    @property
    def address(self) -> int: ...

class Unavailable(RuntimeError):
    """A request GrpcFront.run's batcher did not take (--max-queue requests waiting, or shutting down)."""

class GrpcFront:
    """kiln serve's native gRPC front (the Open Inference Protocol's gRPC service in C++), serving
    `models`: dicts of name, version, engine, runs [(device, Engine or Context)], max_batch,
    max_queue_delay_us and batch_sizes. Listens at `address` (host:port; port 0 picks one)."""
    def __init__(self, address: str, models: list[dict[str, Any]], max_request_bytes: int, pin_gpu: int = -1,
                 server_version: str = "", pinned_input_bytes: int = 1 << 30) -> None:
        """pin_gpu >= 0: registered shared memory is page-locked for that GPU, and inputs in a
        request's message are copied into page-locked buffers (pinned_input_bytes of them at most;
        0: none) as requests arrive."""
    @property
    def port(self) -> int: ...
    def shutdown(self, grace_seconds: float = 30.0) -> None: ...
    def stats(self) -> dict[str, dict[str, Any]]:
        """Per model: requests, errors, runs, rows, batched_requests, failed_runs, runs_by_device
        {device: runs}, and the histograms batch_rows, queue_seconds and compute_seconds
        ({"buckets": [(upper bound, observations at most that)], "count", "sum"})."""
    def run(self, model: str, inputs: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]: ...
    def count(self, model: str, requests: int, errors: int) -> None:
        """Adds requests and errors of another front that run() did not see to the model's counts."""
    # Its shared-memory regions (kiln.shared_memory.NativeRegions): an unknown region is KeyError.
    def register_region(self, name: str, key: str, offset: int, byte_size: int) -> None: ...
    def unregister_region(self, name: str) -> None: ...
    def region_status(self, name: str) -> list[dict[str, Any]]: ...
    def region_bytes(self, region: str, offset: int, byte_size: int, what: str) -> np.ndarray:
        """byte_size bytes from offset in a registered region, as a writable uint8 array over them."""

def model_inputs(onnx_path: str) -> list[TensorDesc]:
    """The model's inputs as its file declares them (-1 where a dim is dynamic), without a build."""
def simplify_onnx(onnx_path: str, output_path: str) -> tuple[int, int]: ...
def set_cpu_threads(threads: int) -> None:
    """Threads of the CPU engine's parallel loops, for the whole process (0: the CPUs this process may run on)."""
def cpu_threads() -> int:
    """Threads of the CPU engine's parallel loops, the calling thread included."""
def calibrate(model: str, next_batch: Callable[[], np.ndarray | None], algorithm: str = "entropy",
              percentile: float = 99.99, max_batches: int = 0, device: str = "cpu", gpu: int = 0,
              progress: bool = True) -> dict[str, float]: ...
